"""MindSpore `.shard` strategies: parsing, seed derivations, MatMul layouts, errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

from spmdsim import DialectError, Layout, ShapeError, TensorLayout
from spmdsim.layouts.dialects import (
    REP_AXIS,
    format_strategy,
    layout_to_strategy,
    matmul_layouts,
    parse_strategy,
    strategy_layout,
    strategy_of,
    strategy_to_layout,
)


def _value_per_rank(tl: TensorLayout, shape) -> list[int]:
    """With an arange tensor whose every shard is one element: the value each rank holds."""
    data = np.arange(math.prod(shape)).reshape(shape)
    out = []
    for rank in range(tl.layout.num_devices):
        block = data[tl.slices(rank, shape)]
        assert block.size == 1
        out.append(int(block.ravel()[0]))
    return out


# -- parse_strategy ----------------------------------------------------------------
@pytest.mark.parametrize(
    "value, expected",
    [
        ("((2,1),(1,4))", ((2, 1), (1, 4))),
        ("((2, 1, 2, 2, 1),)", ((2, 1, 2, 2, 1),)),
        ("(2,1)", ((2, 1),)),
        (" [[2, 1], [1, 4]] ", ((2, 1), (1, 4))),
        ("(8,)", ((8,),)),
        ("((2, 1), ())", ((2, 1), ())),
        (((2, 1), (1, 4)), ((2, 1), (1, 4))),
        ([2, 1], ((2, 1),)),
        ((np.int64(2), np.int32(4)), ((2, 4),)),
        (np.array([[2, 1], [1, 4]]), ((2, 1), (1, 4))),
    ],
)
def test_parse_strategy_accepts(value, expected):
    parsed = parse_strategy(value)
    assert parsed == expected
    assert all(type(c) is int for counts in parsed for c in counts)


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("((2,1),(1,x))", "'((2,1),(1,x))' is not a tuple of positive integers"),
        ("((2,1)", "'((2,1)' is not a tuple"),
        ("(2,0)", "has 0 slices in dim 1"),
        ("((2,1),(1,-4))", "has -4 slices in dim 1 of input 1"),
        ("((2.5,1),)", "has 2.5 slices in dim 0 of input 0"),
        ((True, 2), "has True slices in dim 0"),
        ("((2,1),3)", "mixes integers and tuples"),
        ("()", "'()' is empty"),
        ("4", "'4' must be a tuple"),
        (None, "None must be a tuple"),
        ("((2,1),(1,4)),", "'((2,1),(1,4)),' nests tuples three deep (its trailing comma wraps it in one more "
                           "tuple: drop the comma): input 0 is ((2, 1), (1, 4)); expected a tuple of positive "
                           "integers or a tuple of such tuples"),
        ((((2, 1),), (1, 4)), "nests tuples three deep: input 0 is ((2, 1),)"),
    ],
)
def test_parse_strategy_errors_name_the_value(value, fragment):
    with pytest.raises(DialectError, match="strategy") as info:
        parse_strategy(value)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_format_strategy_round_trips():
    for text in ("((2, 1), (1, 4))", "((2, 1, 2, 2, 1),)", "((8,),)", "((2, 1), ())"):
        assert format_strategy(text) == text
        assert parse_strategy(format_strategy(text)) == parse_strategy(text)
    assert format_strategy((2, 1)) == "((2, 1),)"


# -- single tensor: seed 000 section 2.2 --------------------------------------------
def test_seed_shard_full_8_ranks_rank_holds_its_number():
    # input_strategy ((2, 1, 2, 2, 1),): dev_matrix = strategy, tensor_map (4,3,2,1,0);
    # the seed's strides (4, 4, 2, 1, 1) give shard number == rank.
    tl = strategy_to_layout("((2, 1, 2, 2, 1),)", 8)
    assert tl.layout == Layout((2, 1, 2, 2, 1), ("axis_0", "axis_1", "axis_2", "axis_3", "axis_4"))
    assert tl.tensor_map == (("axis_0",), ("axis_1",), ("axis_2",), ("axis_3",), ("axis_4",))
    assert _value_per_rank(tl, (2, 1, 2, 2, 1)) == list(range(8))


def test_seed_shard_equals_layout_with_dims_in_order():
    # The seed simulates .shard with a Layout: same slices on every rank.
    tl = strategy_to_layout((2, 1, 2, 2, 1), 8)
    ref = Layout((2, 1, 2, 2, 1), ("a", "b", "c", "d", "e"))("a", "b", "c", "d", "e")
    shape = (4, 3, 2, 6, 5)
    assert tl.rank_slices(shape) == ref.rank_slices(shape)


def test_seed_shard_strategy_does_not_fit_layout_example_shape():
    # docs/explanation/semantics.md's Layout example tensor (1, 2, 1, 2, 2) cannot take strategy (2, 1, 2, 2, 1):
    # dim 0 of size 1 does not split in 2.
    with pytest.raises(ShapeError, match=r"tensor \(1, 2, 1, 2, 2\): dim 0 of size 1 "):
        strategy_to_layout((2, 1, 2, 2, 1), 8).slices(0, (1, 2, 1, 2, 2))


def test_seed_shard_not_full_repeats_on_neighbouring_ranks():
    # input_strategy ((2, 1, 1, 2, 1),) on 8 ranks: 4 shards, repeated twice; MindSpore puts
    # the repeat axis on the right, so ranks 2i and 2i+1 hold the same shard.
    tl = strategy_to_layout(((2, 1, 1, 2, 1),), 8)
    assert tl.layout.device_matrix == (2, 1, 1, 2, 1, 2)
    assert tl.layout.alias_name[-1] == REP_AXIS == "rep"
    assert tl.replicated_axes == ("rep",)
    assert _value_per_rank(tl, (2, 1, 1, 2, 1)) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert tl.replica_groups() == ((0, 1), (2, 3), (4, 5), (6, 7))


def test_design_two_axis_example_as_strategy():
    tl = strategy_to_layout((2, 4), 8)
    assert _value_per_rank(tl, (2, 4)) == list(range(8))


def test_strategy_layout_scalar_and_world_of_one():
    assert strategy_to_layout((1, 1), 1).layout.device_matrix == (1, 1)
    scalar = strategy_to_layout("((),)", 4)
    assert scalar.layout == Layout((4,), ("rep",)) and scalar.ndim == 0
    assert strategy_to_layout((), 4) == scalar


@pytest.mark.parametrize(
    "strategy, world, fragment",
    [
        ((2, 3), 8, "strategy (2, 3) uses 6 devices, which does not divide the world size 8"),
        ((4, 4), 8, "strategy (4, 4) needs 16 devices but the world size is 8"),
        ((2, 1), 0, "mesh shape 0 must be a positive integer"),
        ((2, 1), "8", "mesh shape '8' is not a mesh; expected a mesh shape"),
        (((2, 1), (1, 4)), 8, "has 2 inputs; expected one tensor's slice counts"),
    ],
)
def test_strategy_layout_errors(strategy, world, fragment):
    with pytest.raises(DialectError) as info:
        strategy_to_layout(strategy, world)
    assert fragment in str(info.value)


def test_layout_to_strategy_and_deprecated_names():
    tl = Layout((2, 2, 2), ("dp", "sp", "mp"))("mp", ("sp", "dp"))
    assert layout_to_strategy(tl) == (2, 4)
    assert layout_to_strategy(tl.with_partial(())) == (2, 4)
    with pytest.warns(DeprecationWarning, match="strategy_of"):
        assert strategy_of(tl, strategy_to_layout((4, 2), 8)) == ((2, 4), (4, 2))
    with pytest.warns(DeprecationWarning, match="strategy_to_layout"):
        assert strategy_layout((4, 2), 8) == strategy_to_layout((4, 2), 8)


def test_strategy_to_layout_takes_a_mesh_shape_ndim_and_names():
    tl = strategy_to_layout((2, 1), (2, 4), 2, ("dp", "mp"))
    assert tl.layout == Layout((2, 1, 4), ("dp", "mp", "rep")) and tl.tensor_map == (("dp",), ("mp",))
    with pytest.raises(DialectError, match="has 2 dims but ndim is 3"):
        strategy_to_layout((2, 1), 8, 3)
    with pytest.raises(DialectError, match="expected a TensorLayout, got"):
        layout_to_strategy((2, 4))


# -- MatMul -----------------------------------------------------------------------
def test_matmul_seed_001_example():
    # [[2, 1], [1, 4]] on 8 devices: devices 0-3 get X0, 4-7 X1; W_j on devices j and j+4.
    m = matmul_layouts("((2, 1), (1, 4))", 8)
    assert m.layout == Layout((2, 1, 4), ("m", "k", "n"))
    assert m.x.tensor_map == (("m",), ("k",))
    assert m.w.tensor_map == (("k",), ("n",))
    assert m.out.tensor_map == (("m",), ("n",)) and m.out.partial == ()
    assert [m.x.shard_index(r)[0] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [m.w.shard_index(r)[1] for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_matmul_split_contraction_is_partial_over_k():
    m = matmul_layouts(((2, 4), (4, 1)), 8)  # seed 003 matmul1
    assert m.layout == Layout((2, 4, 1), ("m", "k", "n"))
    assert m.out.partial == ("k",) and m.contraction_axis == "k"
    assert m.reduced_out.partial == ()
    assert m.layout.axis_groups(("k",))[0] == (0, 1, 2, 3)
    assert (layout_to_strategy(m.x), layout_to_strategy(m.w)) == ((2, 4), (4, 1)) == m.strategy


def test_matmul_rep_axis_on_the_right():
    m = matmul_layouts(((2, 1), (1, 2)), 8)
    assert m.layout == Layout((2, 1, 2, 2), ("m", "k", "n", "rep"))
    assert m.out.replicated_axes == ("k", "rep")
    assert m.x.replica_groups()[0] == (0, 1, 2, 3)


def test_matmul_transpose_flags_must_be_bools():
    # transpose_a="no" was read as True (x stored (k, m)); numpy's bools are bools.
    with pytest.raises(DialectError, match="transpose_a 'no' must be True or False"):
        matmul_layouts(((2, 4), (4, 1)), 8, transpose_a="no")
    with pytest.raises(DialectError, match="transpose_b 1 must be True or False"):
        matmul_layouts(((2, 4), (4, 1)), 8, transpose_b=1)
    assert matmul_layouts(((2, 4), (1, 4)), 8, transpose_b=np.bool_(True)).transpose_b is True


def test_matmul_transposes_use_storage_order():
    mb = matmul_layouts(((2, 4), (1, 4)), 8, transpose_b=True)  # w stored (n, k)
    assert mb.layout.device_matrix == (2, 4, 1)
    assert mb.w.tensor_map == (("n",), ("k",))
    ma = matmul_layouts(((4, 2), (4, 1)), 8, transpose_a=True)  # x stored (k, m)
    assert ma.layout.device_matrix == (2, 4, 1)
    assert ma.x.tensor_map == (("k",), ("m",))
    assert (layout_to_strategy(ma.x), layout_to_strategy(ma.w)) == ((4, 2), (4, 1))


def test_matmul_batched_aligns_batch_dims_from_the_right():
    m = matmul_layouts(((2, 2, 1, 2), (2, 2, 2)), 16)
    assert m.layout == Layout((2, 2, 1, 2, 2), ("batch0", "batch1", "m", "k", "n"))
    assert m.x.tensor_map[:2] == (("batch0",), ("batch1",))
    assert m.w.tensor_map == (("batch1",), ("k",), ("n",))
    assert m.out.tensor_map == (("batch0",), ("batch1",), ("m",), ("n",))


def _check_matmul_numerically(m, x_shape, w_shape, seed=0):
    """Local products summed over each "k" group equal the reference slice of X @ W."""
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    xl = np.swapaxes(x, -1, -2) if m.transpose_a else x
    wl = np.swapaxes(w, -1, -2) if m.transpose_b else w
    ref = xl @ wl
    local = {}
    for r in range(m.layout.num_devices):
        xs, ws = x[m.x.slices(r, x_shape)], w[m.w.slices(r, w_shape)]
        xs = np.swapaxes(xs, -1, -2) if m.transpose_a else xs
        ws = np.swapaxes(ws, -1, -2) if m.transpose_b else ws
        local[r] = xs @ ws
    for group in m.layout.axis_groups(m.out.partial):
        total = sum(local[r] for r in group)
        for r in group:
            np.testing.assert_allclose(total, ref[m.out.slices(r, ref.shape)], atol=1e-12)


@pytest.mark.parametrize(
    "strategy, world, ta, tb, x_shape, w_shape",
    [
        (((2, 1), (1, 4)), 8, False, False, (4, 6), (6, 8)),
        (((2, 4), (4, 1)), 8, False, False, (4, 8), (8, 6)),
        (((1, 8), (8, 1)), 8, False, False, (2, 16), (16, 3)),
        (((2, 2), (2, 1)), 8, False, False, (4, 4), (4, 2)),
        (((2, 4), (1, 4)), 8, False, True, (4, 8), (3, 8)),
        (((4, 2), (4, 1)), 8, True, False, (8, 4), (8, 3)),
        (((2, 2), (1, 2)), 4, True, True, (4, 2), (3, 4)),
        (((2, 2, 2), (2, 2, 1)), 8, False, False, (2, 4, 4), (2, 4, 3)),
        (((2, 1, 2, 2), (2, 1)), 8, False, False, (2, 3, 2, 4), (4, 2)),
    ],
)
def test_matmul_layouts_compute_the_product(strategy, world, ta, tb, x_shape, w_shape):
    _check_matmul_numerically(matmul_layouts(strategy, world, ta, tb), x_shape, w_shape)


@pytest.mark.parametrize(
    "strategy, kwargs, fragment",
    [
        (((2, 4), (2, 1)), {},
         "contraction dim of x is split 4 ways but of w 2 ways; they must be equal"),
        (((2, 4), (4, 2)), {"transpose_b": True},
         "contraction dim of x is split 4 ways but of w 2 ways"),
        (((2, 2, 1), (4, 1, 2)), {}, "batch dim 0 of x is split 2 ways but batch dim 0 of w 4 ways"),
        # A count of 1 read "split 1 ways", "1 input(s)".
        (((2, 1), (2, 1)), {}, "contraction dim of x is split 1 way but of w 2 ways; they must be equal"),
        (((1, 2, 1), (2, 1, 1)), {}, "batch dim 0 of x is split 1 way but batch dim 0 of w 2 ways"),
        (((2, 1),), {}, "has 1 input; expected two"),
        (((2, 1), (1, 1), (1, 1)), {}, "has 3 inputs; expected two"),
        (((2,), (2, 1)), {}, "matmul strategy for x (2,) has 1 dim; expected at least 2"),
        (((4, 2), (2, 4)), {}, "needs 32 devices but the world size is 8"),
        (((3, 1), (1, 1)), {}, "uses 3 devices, which does not divide the world size 8"),
        ("((2, 1), (1, q))", {}, "strategy '((2, 1), (1, q))' is not a tuple"),
    ],
)
def test_matmul_errors(strategy, kwargs, fragment):
    with pytest.raises(DialectError) as info:
        matmul_layouts(strategy, 8, **kwargs)
    assert fragment in str(info.value)


def test_threads_parse_strategies_at_once():
    """Simulated ranks are threads: eight parsing strategies at once, each switched out inside garbage
    collections (a callback that yields), all get their tuples. CPython 3.11 counts the AST constructor's
    depth per interpreter (gh-106905): without parse_strategy's lock one of them raised SystemError
    ("AST constructor recursion depth mismatch"), as tests/mpi/test_ops_matmul.py once did on 8 simulated
    ranks."""
    import gc
    import threading
    import time

    from spmdsim.layouts.dialects.strategy import parse_strategy

    got, errors = [], []

    def switch(phase: str, info: dict) -> None:
        time.sleep(0)  # another thread runs in the middle of the collection

    def parse() -> None:
        try:
            for _ in range(500):
                got.append(parse_strategy("((2,1),(1,4))"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threshold = gc.get_threshold()
    gc.callbacks.append(switch)
    gc.set_threshold(5)
    try:
        threads = [threading.Thread(target=parse) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.callbacks.remove(switch)
        gc.set_threshold(*threshold)
    assert not errors, errors[0]
    assert got == [((2, 1), (1, 4))] * 4000
