"""What a replayed step does per recorded call (docs/explanation/performance.md, "A GPT training step"): a
recorded copy or cast is one np.copyto into its captured result, a dropout mask is drawn into its captured
array, and the mask's SeededTensor is checked once per shape; each gives the values it gave before."""
from __future__ import annotations

import numpy as np
import pytest

from spmdsim import SeededTensor
from spmdsim.base import buffers
from spmdsim.errors import SpmdsimError
from spmdsim.nn.ops._common import _keep, keep_mask
from spmdsim.base.precision import is_low
from spmdsim.runtime.replay import Scalar, capture


def test_a_recorded_copy_or_cast_replays_as_one_copyto():
    x = buffers.zeros((3, 4), np.float64)
    x[...] = np.arange(12.0).reshape(3, 4)

    def step(a):
        b = np.asanyarray(a).copy()
        c = np.asanyarray(a).T.astype(np.float32)  # F-ordered source: copyto follows the result's layout
        b *= 2.0
        return b, c

    graph = capture(step, x)
    funcs = [func for func, _, _ in graph._entries]
    assert funcs.count(np.copyto) == 2, funcs
    x2 = np.arange(12.0).reshape(3, 4) * 1.5 + 0.25
    b, c = graph(x2)
    assert np.array_equal(b, x2.copy() * 2.0)
    assert c.dtype == np.float32 and np.array_equal(c, x2.T.astype(np.float32))


def test_a_mask_is_drawn_into_its_captured_array():
    out = []

    def step(seed):
        keep = keep_mask((8, 64, 16), lambda: int(seed.value), ((0, 4), (16, 32), (0, 16)), 0.1)
        out.append(keep)
        return keep

    graph = capture(step, Scalar(3))
    [(func, args, kwargs)] = graph._entries
    assert func.__name__ == "_keep" and np.shares_memory(kwargs["out"], out[0])  # into the captured mask
    for seed in (3, 7):
        mask = graph(Scalar(seed))
        fresh = SeededTensor((8, 64, 16), "float64", seed=seed, low=0.0, high=1.0).region(
            ((0, 4), (16, 32), (0, 16))) >= 0.1
        assert mask is out[0] and np.array_equal(mask, fresh)


def test_with_seed_gives_the_tensor_made_with_that_seed():
    base = SeededTensor((6, 10), "float64", seed=1, low=0.0, high=1.0)
    for seed in (0, 5, 2**63 - 1):
        made = SeededTensor((6, 10), "float64", seed=seed, low=0.0, high=1.0)
        assert base.with_seed(seed) == made
        assert np.array_equal(base.with_seed(seed).full(), made.full())
    into = np.ones((2, 10), bool)
    assert base.with_seed(9).at_least(((1, 3), (0, 10)), 0.5, into) is into
    assert np.array_equal(into, SeededTensor((6, 10), "float64", seed=9, low=0.0, high=1.0).region(
        ((1, 3), (0, 10))) >= 0.5)
    assert base.seed == 1  # the checked tensor is left as it was
    assert np.array_equal(_keep((6, 10), 4, ((0, 6), (0, 10)), 0.3), base.with_seed(4).full() >= 0.3)


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, "3"])
def test_with_seed_refuses_a_bad_seed_in_one_line(seed):
    with pytest.raises(SpmdsimError, match=r"^seed .* must be an integer in \[0, 2\*\*63\)$"):
        SeededTensor((4,), "float64", seed=0, low=0.0, high=1.0).with_seed(seed)


def test_is_low_names_bfloat16_alone():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert is_low(np.dtype(ml_dtypes.bfloat16))
    for other in (np.dtype(np.float64), np.dtype(np.float16), np.dtype("V2"), np.float32, None, "bfloat16"):
        assert not is_low(other), other
