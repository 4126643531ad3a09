"""Paddle `distributed.split` (seed 004): layouts simulated per rank against numpy, errors."""
from __future__ import annotations

import numpy as np
import pytest

from spmdsim import DialectError, Layout
from spmdsim.layouts.dialects import MP_AXIS, split_layouts


def test_seed_004_embedding_example():
    # paddle.distributed.split(data, (8, 8), operation="embedding", num_partitions=2)
    s = split_layouts((8, 8), "embedding", num_partitions=2)
    assert s.kind == "vocab" and s.layout == Layout((2,), ("mp",)) and MP_AXIS == "mp"
    assert s.weight.tensor_map == (("mp",), ())
    assert s.local_weight_shape == (5, 8)  # N/2 rows + one padding row
    assert s.vocab_ranges == ((0, 4), (4, 8)) and s.padding_row == 4
    assert s.input.tensor_map == ((), ())
    assert s.output_before.partial == ("mp",) and s.output_before.ndim == 3
    assert s.output_after.partial == () and s.collective == "allreduce"
    ids = np.array([[0, 3, 4, 7]])
    assert s.local_ids(ids, 0).tolist() == [[0, 3, 4, 4]]
    assert s.local_ids(ids, 1).tolist() == [[4, 4, 0, 3]]


@pytest.mark.parametrize("parts", [1, 2, 4, 8])
def test_vocab_parallel_embedding_sums_to_the_lookup(parts):
    s = split_layouts([16, 3], "embedding", 0, parts)
    rng = np.random.default_rng(parts)
    table = rng.standard_normal((16, 3))
    ids = rng.integers(0, 16, size=(10, 4))
    total = np.zeros((10, 4, 3))
    for rank in range(parts):
        rows = table[s.weight.slices(rank, table.shape)]
        assert (rows.shape[0] + 1, rows.shape[1]) == s.local_weight_shape
        local_table = np.vstack([rows, np.zeros((1, 3))])  # zero padding row
        total += local_table[s.local_ids(ids, rank)]
    np.testing.assert_allclose(total, table[ids])
    assert s.collective == ("allreduce" if parts > 1 else None)


def test_row_parallel_linear_allreduces_partial_outputs():
    s = split_layouts((8, 6), "linear", axis=0, num_partitions=4)
    assert s.kind == "row" and s.weight.tensor_map == (("mp",), ())
    assert s.input.tensor_map == ((), ("mp",))
    assert s.bias.tensor_map == ((),)
    assert s.output_before.partial == ("mp",) and s.collective == "allreduce"
    assert s.local_weight_shape == (2, 6)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((5, 8)), rng.standard_normal((8, 6))
    total = sum(x[s.input.slices(r, x.shape)] @ w[s.weight.slices(r, w.shape)] for r in range(4))
    np.testing.assert_allclose(total, x @ w)


@pytest.mark.parametrize("gather_out", [True, False])
def test_column_parallel_linear(gather_out):
    s = split_layouts((4, 8), "linear", axis=1, num_partitions=2, gather_out=gather_out, input_ndim=3)
    assert s.kind == "column" and s.weight.tensor_map == ((), ("mp",))
    assert s.bias.tensor_map == (("mp",),)
    assert s.input.tensor_map == ((), (), ())
    assert s.output_before.tensor_map == ((), (), ("mp",))
    assert s.local_weight_shape == (4, 4)
    if gather_out:
        assert s.collective == "allgather" and s.output_after.tensor_map == ((), (), ())
    else:
        assert s.collective is None and s.output_after == s.output_before
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 3, 4)), rng.standard_normal((4, 8))
    y = x @ w
    for r in range(2):
        local = x @ w[s.weight.slices(r, w.shape)]
        np.testing.assert_allclose(local, y[s.output_before.slices(r, y.shape)])
    gathered = np.concatenate([x @ w[s.weight.slices(r, w.shape)] for r in range(2)], axis=-1)
    np.testing.assert_allclose(gathered, y)


@pytest.mark.parametrize(
    "args, kwargs, fragment",
    [
        (((8, 8), "conv"), {"num_partitions": 2},
         "operation 'conv' is not supported; expected 'linear' or 'embedding'"),
        (((8, 8), "linear", 2, 2), {}, "linear axis 2 is not supported; expected 0 (row-parallel"),
        (((8, 8), "linear", True, 2), {}, "linear axis True is not supported"),
        (((8, 8), "embedding", 1, 2), {},
         "embedding can only be split along axis 0 (the vocabulary), got axis 1"),
        (((10, 8), "embedding", 0, 4), {},
         "size[0]=10, the rows (vocabulary size) of the embedding table, is not divisible by "
         "num_partitions=4"),
        (((10, 8), "linear", 0, 4), {},
         "size[0]=10, the rows (in features) of the linear weight, is not divisible by "
         "num_partitions=4"),
        (((8, 6), "linear", 1, 4), {},
         "size[1]=6, the columns (out features) of the linear weight, is not divisible"),
        (((8,), "linear", 0, 2), {}, "size (8,) must be a list or tuple of two positive integers"),
        (((8, 0), "linear", 0, 2), {}, "size (8, 0) must be a list or tuple of two positive integers"),
        (((8, 8), "linear", 0, 0), {}, "num_partitions 0 must be a positive integer"),
        (((8, 8), "linear", 0, 2), {"input_ndim": 0}, "input_ndim 0 must be a positive integer"),
        # A truthy string was read as True: gather_out="no" gathered.
        (((8, 8), "linear", 1, 2), {"gather_out": "no"}, "gather_out 'no' must be True or False"),
    ],
)
def test_split_layouts_errors(args, kwargs, fragment):
    with pytest.raises(DialectError) as info:
        split_layouts(*args, **kwargs)
    assert fragment in str(info.value)


def test_vocab_range_errors():
    s = split_layouts((8, 8), "embedding", 0, 2)
    with pytest.raises(DialectError, match="rank 2 is outside the model-parallel group of 2"):
        s.vocab_range(2)
    row = split_layouts((8, 8), "linear", 0, 2)
    with pytest.raises(DialectError, match="vocab_range applies to embedding splits, not 'row'"):
        row.vocab_range(0)
