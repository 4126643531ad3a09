"""Plain values entering the library: integers, shapes, dtypes, tolerances, containers (no MPI).

Each bad value raises one of our errors whose message quotes it; valid spellings
(numpy integers included) keep working.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from spmdsim import (
    DialectError, Layout, LayoutError, OperatorError, PlanError, SeededTensor, ShapeError, SpmdsimError,
)
from spmdsim.references import forward as reference
from spmdsim.layouts.dialects import parse_sbp, parse_strategy, split_layouts
from spmdsim.nn.ops.paddle_split import paddle_layout, paddle_param
from spmdsim.programs.infer.finish import out_layout_from_strategy
from spmdsim.programs.plan import emulate, plan_redistribution, shards_of
from spmdsim.base.validate import as_int, dtype_arg, int_arg, shape_arg, tolerance_arg

X8 = Layout((8,), ("x",))
M24 = Layout((2, 4), ("dp", "mp"))


# -- the shared helpers ---------------------------------------------------------------
def test_as_int_takes_python_and_numpy_integers_only():
    assert as_int(3) == 3 and type(as_int(np.int64(3))) is int and as_int(np.uint8(7)) == 7
    for bad in (True, np.bool_(True), 1.0, 1.5, "1", None, np.float64(2.0)):
        assert as_int(bad) is None, bad


@pytest.mark.parametrize("value, text", [
    (16.9, "16.9"), (True, "True"), ("16", "'16'"), (0, "0"), (None, "None"),
])
def test_int_arg_names_the_value(value, text):
    with pytest.raises(ShapeError, match=re.escape(f"size {text} must be an integer >= 1")):
        int_arg(value, "size", low=1)
    assert int_arg(np.int32(4), "size", low=1) == 4


@pytest.mark.parametrize("shape, fragment", [
    ((16.9, 8), "shape (16.9, 8) must hold integers, got 16.9 in dim 0"),
    ((True, 8), "shape (True, 8) must hold integers, got True in dim 0"),
    ("168", "shape '168' must be a sequence of integers"),
    (16, "shape 16 must be a sequence of integers"),
    ((4, -2), "shape (4, -2) must not have negative sizes, got -2 in dim 1"),
])
def test_shape_arg_rejects_what_it_would_have_truncated(shape, fragment):
    with pytest.raises(ShapeError, match=re.escape(fragment)):
        shape_arg(shape)


def test_shape_arg_keeps_int_shapes_and_converts_numpy_ones():
    assert shape_arg((16, 8)) == (16, 8)
    out = shape_arg(np.array([16, 8]))
    assert out == (16, 8) and all(type(s) is int for s in out)
    assert shape_arg([0, 4]) == (0, 4) and shape_arg(()) == ()


@pytest.mark.parametrize("dtype, fragment", [
    (None, "dtype None is not a dtype"),
    ("floaty", "dtype 'floaty' is not a numpy dtype"),
    (object, "dtype '|O' (object) is not numeric"),
    ("U4", "dtype '<U4' (str128) is not numeric"),
    (">f4", "dtype '>f4' (float32) is not in native byte order"),
    ("datetime64[s]", "is not numeric"),
])
def test_dtype_arg_names_the_dtype_and_lists_what_is_supported(dtype, fragment):
    with pytest.raises(ShapeError, match=re.escape(fragment)) as info:
        dtype_arg(dtype)
    assert "float16..float64" in str(info.value)


def test_an_fp8_dtype_points_to_the_fp8_products():
    """ops.astype(x, "float8_e4m3fn") said only 'not numeric': FP8 is a product's cast (fp8_linear)."""
    pytest.importorskip("ml_dtypes")
    with pytest.raises(ShapeError, match=re.escape("(float8_e4m3fn) is not numeric")) as info:
        dtype_arg("float8_e4m3fn")  # (ml_dtypes gives e5m2 numpy's kind "f": a float dtype_arg takes)
    assert "FP8 is a cast inside a product with its scale (spmdsim.nn.ops.fp8_linear" in str(info.value)


def test_dtype_arg_accepts_every_numeric_kind():
    for name in ("bool", "int8", "uint64", "float16", "float32", "float64", "complex64", "complex128"):
        assert dtype_arg(name) == np.dtype(name)
    assert dtype_arg(np.float32) == np.dtype("float32") and dtype_arg("=f4") == np.dtype("float32")


@pytest.mark.parametrize("value", [-1, -1e-9, math.nan, math.inf, "big", "1e-3", True, None])
def test_tolerance_arg_needs_a_finite_number_at_least_zero(value):
    with pytest.raises(SpmdsimError, match=re.escape(f"rtol {value!r} must be a finite number >= 0")):
        tolerance_arg(value, "rtol")
    assert tolerance_arg(0, "atol") == 0.0 and tolerance_arg(np.float32(1e-3), "atol") == pytest.approx(1e-3)


# -- SeededTensor ------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, fragment", [
    (dict(shape=(16.9, 8)), "got 16.9"),
    (dict(shape="168"), "shape '168' must be a sequence"),
    (dict(shape=(True, 8)), "got True"),
    (dict(shape=(2, 8), seed=True), "seed True must be an integer"),
    (dict(shape=(2, 8), seed=1.5), "seed 1.5 must be an integer"),
    (dict(shape=(2, 8), high=math.inf), "high inf must be a finite number"),
    (dict(shape=(2, 8), low=-math.inf), "low -inf must be a finite number"),
    (dict(shape=(2, 8), low=math.nan), "low nan must be a finite number"),
    (dict(shape=(2, 8), low="0"), "low '0' must be a finite number"),
    (dict(shape=(2, 8), low=-3e38, high=3e38), "does not fit float32"),
    (dict(shape=(2, 8), dtype="int32", low=2**31, high=2**31 + 5), "does not fit int32"),
])
def test_seeded_tensor_refuses_values_it_used_to_truncate_or_overflow(kwargs, fragment):
    with pytest.raises(SpmdsimError, match=re.escape(fragment)):
        SeededTensor(**kwargs)


def test_seeded_tensor_takes_numpy_integers_and_stays_finite():
    t = SeededTensor(np.array([4, 2]), seed=np.int64(3))
    assert t.shape == (4, 2) and type(t.seed) is int
    assert np.array_equal(t.full(), SeededTensor((4, 2), seed=3).full())
    assert np.isfinite(SeededTensor((64,), "float32", low=-3e38, high=0.0).full()).all()
    with pytest.raises(ShapeError, match=re.escape("region dim 0 (0.5, 2) must be a slice or a (start, stop)")):
        t.region([(0.5, 2), (0, 2)])


# -- layouts ------------------------------------------------------------------------------
def test_layout_shapes_and_ranks_must_be_integers():
    tl = M24("dp", "mp")
    with pytest.raises(ShapeError, match=re.escape("shape (4.7, 8) must hold integers, got 4.7")):
        tl.bounds(0, (4.7, 8))
    with pytest.raises(LayoutError, match=re.escape("rank 1.5 must be an integer")):
        M24.coords(1.5)
    with pytest.raises(LayoutError, match=re.escape("rank 1.5 must be an integer")):
        tl.bounds(1.5, (4, 8))
    with pytest.raises(LayoutError, match=re.escape("rank '1' must be an integer")):
        tl.slices("1", (4, 8))
    with pytest.raises(LayoutError, match=re.escape("coordinates (0.5, 1)")):
        M24.rank_of((0.5, 1))
    with pytest.raises(LayoutError, match=re.escape("shard index (1.0, 0)")):
        tl.ranks_holding((1.0, 0))
    assert tl.bounds(np.int64(5), np.array([4, 8])) == ((2, 4), (2, 4))
    assert M24.coords(np.int32(5)) == (1, 1) and type(M24.coords(np.int32(5))[0]) is int


def test_layout_alias_name_is_not_one_string_and_numpy_sizes_are_welcome():
    with pytest.raises(LayoutError, match=re.escape("alias_name 'ab' must be a sequence, not one string")):
        Layout((2, 4), "ab")
    with pytest.raises(LayoutError, match=re.escape("alias_name 'x' must be a sequence")):
        Layout((8,), "x")
    with pytest.raises(LayoutError, match=re.escape("device_matrix '24' must be a sequence")):
        Layout("24", ("a", "b"))
    with pytest.raises(LayoutError, match=re.escape("got 2.0")):
        Layout((2.0, 4), ("a", "b"))
    layout = Layout(np.array([2, 4]), ("a", "b"))
    assert layout == Layout((2, 4), ("a", "b")) and type(layout.device_matrix[0]) is int


def test_divisibility_error_can_name_the_tensor():
    tl = Layout((8,), ("mp",))(None, "mp")
    with pytest.raises(ShapeError, match=re.escape(
            "ColumnParallelLinear weight W (96, 100): dim 1 of size 100 is not divisible by 8 shards "
            "over ('mp',)")):
        tl.check_shape((96, 100), "ColumnParallelLinear weight W")
    # Without a name it is "tensor", its shape beside it (which of a program's tensors does not divide).
    with pytest.raises(ShapeError, match=re.escape(
            "tensor (96, 100): dim 1 of size 100 is not divisible by 8 shards over ('mp',)")):
        tl.check_shape((96, 100))


# -- planning -------------------------------------------------------------------------------
def test_plan_refuses_float_shapes_even_after_the_int_shape_is_cached():
    src, tgt = X8("x", None), X8(None, "x")
    assert plan_redistribution(src, tgt, (1024, 1024), "float32").shape == (1024, 1024)
    for shape, bad in (((1024.9, 1024), "1024.9"), ((1024.0, 1024), "1024.0"), ((True, 8), "True")):
        with pytest.raises(ShapeError, match=re.escape(f"got {bad} in dim 0")):
            plan_redistribution(src, tgt, shape, "float32")


@pytest.mark.parametrize("dtype, fragment", [
    (None, "dtype None is not a dtype"),
    ("U4", "dtype '<U4' (str128) is not numeric"),
    ("<U1", "dtype '<U1' (str32) is not numeric"),
    (object, "dtype '|O' (object) is not numeric"),
    (">f4", "dtype '>f4' (float32) is not in native byte order"),
])
def test_plan_needs_a_supported_dtype(dtype, fragment):
    with pytest.raises(PlanError, match=re.escape(fragment)):
        plan_redistribution(X8("x", None), X8(None, "x"), (16, 16), dtype)


def test_plan_refuses_pending_sums_of_bools_but_moves_bools():
    with pytest.raises(PlanError, match="a bool tensor cannot be a pending sum"):
        plan_redistribution(M24(None, None, partial="dp"), M24("mp", None), (8, 8), "bool")
    with pytest.raises(PlanError, match="a bool tensor cannot be a pending sum"):
        plan_redistribution(M24("mp", None), M24(None, None, partial="dp"), (8, 8), "bool")
    assert plan_redistribution(M24("mp", None), M24(None, "mp"), (8, 8), "bool").dtype == "bool"


@pytest.mark.parametrize("shape", [(0, 64), (64, 0), (0, 0)])
def test_zero_size_plans_emulate_to_zero_size_shards(shape):
    cases = [
        (X8("x", None), X8(None, "x")),
        (M24("dp", "mp"), M24("mp", "dp")),
        (M24(("dp", "mp"), None), M24(("mp", "dp"), None)),
        (M24(None, None, partial="mp"), M24("mp", None)),
        (M24("dp", "mp"), X8(None, "x")),
    ]
    for src, tgt in cases:
        plan = plan_redistribution(src, tgt, shape, "float32")
        assert all(n == 0 for step in plan.steps for n in step.bytes_received)
        out = emulate(plan, shards_of(src, np.zeros(shape, np.float32)))
        for rank in range(8):
            assert out[rank].shape == tgt.local_shape(shape)


# -- dialects ----------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["{2,1}", {2, 1}, {"a": 1}, "((2, 1), {1, 4})"])
def test_strategies_are_ordered_containers(value):
    with pytest.raises(DialectError, match=re.escape(f"strategy {value!r}")):
        parse_strategy(value)
    assert parse_strategy([2, 1]) == ((2, 1),) and parse_strategy(np.array([2, 1])) == ((2, 1),)


def test_sbp_is_an_ordered_container():
    with pytest.raises(DialectError, match=re.escape("sbp {'B'}")):
        parse_sbp({"B"})


def test_paddle_vocab_range_rank_must_be_an_integer():
    spec = split_layouts((16, 4), "embedding", 0, 4)
    with pytest.raises(DialectError, match=re.escape("rank 1.5 must be an integer (0 <= rank < 4)")):
        spec.vocab_range(1.5)
    with pytest.raises(DialectError, match=re.escape("rank True must be an integer")):
        spec.vocab_range(True)
    assert spec.vocab_range(np.int64(1)) == (4, 8)


def test_paddle_layout_and_params_check_their_integers():
    with pytest.raises(OperatorError, match=re.escape("num_partitions='8' must be a positive integer")):
        paddle_layout("8", 8)
    with pytest.raises(OperatorError, match=re.escape("num_partitions=2.0 must be a positive integer")):
        paddle_layout(2.0, 8)
    with pytest.raises(OperatorError, match=re.escape("world_size '8' must be a positive integer")):
        paddle_layout(2, "8")
    assert paddle_layout(np.int64(4), 8) == Layout((2, 4), ("dp", "mp"))
    assert paddle_param(np.int64(5), (4, 4), "float32", 0) == SeededTensor((4, 4), "float32", 5)
    with pytest.raises(OperatorError, match=re.escape("parameter attr 1.5 must be None, False")):
        paddle_param(1.5, (4, 4), "float32", 0)


def test_out_strategy_counts_must_be_integers():
    local = M24("dp", None, partial="mp")
    with pytest.raises(OperatorError, match=re.escape("out_strategy (2.5, 1) must be a sequence of integer")):
        out_layout_from_strategy(local, (2.5, 1))
    assert out_layout_from_strategy(local, (np.int64(8), 1)) == M24(("dp", "mp"), None)


def test_out_strategy_refusal_says_what_would_follow():
    # "expected (2, 4) or one dim cut 1 times more (the contraction's ())" when K was not split
    with pytest.raises(OperatorError, match=re.escape("(cut (2, 4)); expected (2, 4): the contraction is not split, "
                                                      "so no pending sum is left to reduce-scatter")):
        out_layout_from_strategy(M24("dp", "mp"), (8, 4))
    with pytest.raises(OperatorError, match=re.escape("expected (2, 1), or one dim cut 4 times more ((8, 1) or "
                                                      "(2, 4)) by reduce-scattering the sum pending over the "
                                                      "contraction's axis 'mp'")):
        out_layout_from_strategy(M24("dp", None, partial="mp"), (2, 2))


# -- references ---------------------------------------------------------------------------------
def test_reference_matmul_needs_matrices():
    with pytest.raises(ShapeError, match=re.escape("got shapes (4,) and (4,)")):
        reference.matmul(np.ones(4), np.ones(4))
    with pytest.raises(ShapeError, match=re.escape("got shapes (4, 4) and (4,)")):
        reference.matmul(np.ones((4, 4)), [1.0, 2.0, 3.0, 4.0])


def test_reference_biases_must_match_out_features():
    x, w = SeededTensor((4, 6)), SeededTensor((6, 8))
    with pytest.raises(ShapeError, match=re.escape("linear bias of shape (3,) does not match out_features 8")):
        reference.linear_region(x, w, SeededTensor((3,)))
    with pytest.raises(ShapeError, match=re.escape("linear bias of shape (8, 1) does not match")):
        reference.linear_region(x, w, np.ones((8, 1)))
    w2 = SeededTensor((8, 6))
    with pytest.raises(ShapeError, match=re.escape("mlp b2 bias of shape (8,) does not match out_features 6")):
        reference.mlp_region(x, w, None, w2, SeededTensor((8,)))
    with pytest.raises(ShapeError, match=re.escape("mlp w2 of shape (6, 6)")):
        reference.mlp_region(x, w, None, SeededTensor((6, 6)), None)
    full = slice(None)
    got = reference.linear_region(x, w, SeededTensor((8,), seed=1))((full, full))
    want = reference.linear(x.full(), w.full(), SeededTensor((8,), seed=1).full())
    np.testing.assert_allclose(got, want)


def test_counted_makes_the_plural_of_the_nouns_messages_name():
    """counted wrote "2 axises", "2 waies" (the dialects kept their own helpers for these two) and "2 keies"; now
    axis, index and matrix are irregular, a vowel's y takes -s, and a phrase's last word is made plural."""
    from spmdsim.base.validate import counted

    nouns = ["axis", "way", "key", "entry", "index", "matrix", "batch", "dim", "MoE layer", "box", "array"]
    assert [counted(2, noun) for noun in nouns] == [
        "2 axes", "2 ways", "2 keys", "2 entries", "2 indices", "2 matrices", "2 batches", "2 dims", "2 MoE layers",
        "2 boxes", "2 arrays"]
    assert [counted(1, noun) for noun in ("axis", "way")] == ["1 axis", "1 way"]


def test_the_dialects_take_their_plurals_from_counted(monkeypatch):
    """The dialects kept their own "axes" and "ways" helpers (counted_axes, strategy._ways) while counted wrote
    "axises" and "waies": one place for plurals now, so a plural counted is taught reaches their messages."""
    from spmdsim.base import validate
    from spmdsim.layouts.dialects import matmul_layouts, sbp_to_layout

    monkeypatch.setitem(validate._IRREGULAR, "axis", "AXES")
    monkeypatch.setitem(validate._IRREGULAR, "way", "WAYS")
    with pytest.raises(DialectError, match=r"placement shape \(2, 2, 2\) has 3 AXES;"):
        sbp_to_layout("B, S(0)", (2, 2, 2), 2)
    with pytest.raises(DialectError, match=r"one name per mesh axis \(2 AXES\)"):
        sbp_to_layout("B, B", (2, 2), 1, mesh_axis_names=("a",))
    with pytest.raises(DialectError, match="contraction dim of x is split 4 WAYS but of w 2 WAYS"):
        matmul_layouts(((2, 4), (2, 1)), 8)
    with pytest.raises(DialectError, match="batch dim 0 of x is split 2 WAYS but batch dim 0 of w 4 WAYS"):
        matmul_layouts(((2, 2, 1), (4, 1, 2)), 8)
