"""A DTensor op a number (Python or numpy) gives numpy's dtype and values on the same blocks, bfloat16 included.

numpy 2 with ml_dtypes is the reference: every binary pointwise op, both operand orders, on 2 simulated ranks
(each rank's block against the same slice of numpy's whole result: no collective, so a refusal on one rank
cannot hang the other). Pure; skipped without ml_dtypes.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, DTypeError, Layout, Mesh
from spmdsim.nn import ops
from spmdsim.nn.ops.pointwise import _KERNELS, pointwise

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)

BINARY = ["add", "sub", "mul", "div", "floordiv", "mod", "pow", "maximum", "minimum", "eq", "ne", "lt", "gt", "le",
          "ge", "and", "or", "xor", "logical_and", "logical_or", "logical_xor"]
BASE = np.array([-2.5, -1.0, 0.0, 0.5, 1.0, 3.0])
ARRAYS = {"bfloat16": BASE.astype(BF16), "float16": BASE.astype(np.float16), "float32": BASE.astype(np.float32),
          "int8": np.array([-3, -1, 0, 1, 2, 5], np.int8), "uint8": np.array([0, 1, 2, 3, 5, 7], np.uint8),
          "bool": BASE > 0}
# Python numbers are weak (NEP 50), numpy scalars strong; a bfloat16 scalar is ml_dtypes' own.
NUMBERS = [True, 3, -2, 300, 2 ** 70, 1.5, 0.1, np.float64(1.5), np.float16(1.5), np.int64(2), np.int16(2),
           np.uint8(2), BF16.type(1.5)]


def _same(got, want) -> bool:
    """Equal dtypes and values (NaN equal to NaN)."""
    if got.dtype != want.dtype:
        return False
    if got.dtype.kind in "fV":
        return np.array_equal(got.astype(np.float64), want.astype(np.float64), equal_nan=True)
    return np.array_equal(got, want)


def _promotes(a, b) -> bool:
    """Whether numpy (with the ml_dtypes installed) has a common dtype of `a` and `b`: ml_dtypes 0.7 has one for
    bfloat16 beside every numpy dtype; earlier ones none beside float16 and int16 and wider ints."""
    try:
        np.result_type(a, b)
    except TypeError:  # DTypePromotionError
        return False
    return True


def _compare(mesh, x, g, op, args, args_np):
    """(what differs, or None) for pointwise `op` of `args` against numpy's kernel on `args_np`."""
    try:
        with np.errstate(all="ignore"):
            want = np.asarray(_KERNELS[op](*args_np))
    except Exception as e:  # noqa: BLE001 - numpy's refusal, whatever its type
        want = e
    try:
        out = pointwise(op, *args)
        got = out.local
        if not isinstance(want, Exception):
            want = want[out.slices]
    except Exception as e:  # noqa: BLE001
        got = e
    if isinstance(want, Exception) or isinstance(got, Exception):
        if isinstance(want, Exception) != isinstance(got, Exception):
            return f"numpy {getattr(want, 'dtype', want)!r}, spmdsim {getattr(got, 'dtype', got)!r}"
        return None
    return None if _same(got, want) else f"numpy {want.dtype} {want}, spmdsim {got.dtype} {got}"


def test_a_number_beside_a_dtensor_is_numpys_in_every_binary_op():
    """bfloat16 x * 1.5 was float64 (a Python float beside a dtype of kind "V" was lifted to float64), where
    numpy's is float32; bfloat16 x + np.float16(1.5) (or np.int64(2)) raised numpy's DTypePromotionError from
    deep inside (np.result_type has no entry: numpy's ufunc computes in float32 / float64); a bfloat16 numpy
    scalar beside int8 or float16 was lifted as a Python float (float64, float16: numpy's are bfloat16 and
    float32); uint8 / -3 and logical_and(uint8, -3) were refused (numpy: float64, bool), float32 and 2**70 in
    a logical op computed (numpy refuses it: its logical ufuncs take a Python int as int64)."""
    warnings.simplefilter("ignore", RuntimeWarning)

    def body():
        mesh = Mesh(Layout((2,), ("x",)))
        bad = []
        for name, g in ARRAYS.items():
            x = DTensor.from_global(mesh, g, mesh.layout("x"))
            for number in NUMBERS:
                for op in BINARY:
                    for args, args_np, order in (((x, number), (g, number), "x, n"),
                                                 ((number, x), (number, g), "n, x")):
                        why = _compare(mesh, x, g, op, args, args_np)
                        if why:
                            bad.append(f"{op}({order}) {name} x, n {type(number).__name__} {number!r}: {why}")
        return bad

    bad = sorted({b for rank in spmdsim.simulate(2, body) for b in rank})
    assert not bad, f"{len(bad)} differ from numpy:\n" + "\n".join(bad[:20])


def test_where_and_clip_beside_bfloat16_are_numpys():
    """np.where promotes by np.result_type (bfloat16 and a Python float: float64), np.clip has no bfloat16 loop
    (float32, a Python int too), and clip by one bound is np.minimum / np.maximum (bfloat16 beside an int):
    spmdsim's where and clip were float64 for a float (the number lifted to float64) and float64 / bfloat16
    one-sided."""
    g = BASE.astype(BF16)
    c = np.array([True, False, True, False, True, True])
    cases = [(lambda x, m: ops.where(m, x, 1.5), lambda: np.where(c, g, 1.5)),
             (lambda x, m: ops.where(m, 2, x), lambda: np.where(c, 2, g)),
             (lambda x, m: ops.clip(x, 0.0, 1.5), lambda: np.clip(g, 0.0, 1.5)),
             (lambda x, m: ops.clip(x, 0, 2), lambda: np.clip(g, 0, 2)),
             (lambda x, m: ops.clip(x, None, 2), lambda: np.clip(g, None, 2)),
             (lambda x, m: x.clip(0.5), lambda: np.clip(g, 0.5, None)),
             (lambda x, m: x.clip(None, np.float16(1)), lambda: np.clip(g, None, np.float16(1))),
             (lambda x, m: x * 1.5, lambda: g * 1.5), (lambda x, m: 0.1 < x, lambda: 0.1 < g),
             (lambda x, m: np.float16(1.5) * x, lambda: np.float16(1.5) * g)]

    def body():
        mesh = Mesh(Layout((2,), ("x",)))
        x = DTensor.from_global(mesh, g, mesh.layout("x"))
        m = DTensor.from_global(mesh, c, mesh.layout("x"))
        got = [f(x, m).gather() for f, _ in cases]
        said = []
        for call in (lambda: x + 2 ** 100, lambda: x < 2 ** 100, lambda: np.logical_and(x.astype(np.float32), 2 ** 70)):
            try:
                call()
            except DTypeError as e:
                said.append(str(e))
        return got, said

    got, said = spmdsim.simulate(2, body)[0]
    wants = [ref() for _, ref in cases]
    assert [r.dtype.name for r in got] == [w.dtype.name for w in wants]
    assert all(_same(r, w) for r, w in zip(got, wants))
    # An int past int64 beside bfloat16: ml_dtypes before 0.7 converts a Python int through int64 and refuses it
    # (TypeError "expected number, got int"), 0.7 converts it as a float (then computed, as by numpy: the first
    # test); numpy's logical ufuncs refuse it beside any dtype (OverflowError).
    try:
        np.asarray(2 ** 100, BF16)
        refused = []
    except TypeError:
        refused = [f"{op}: the Python int of 31 digits is past int64, through which ml_dtypes converts a Python "
                   "int to bfloat16, the dtype it takes beside a DTensor of bfloat16 (numpy 2 refuses it too: "
                   "TypeError); convert first, e.g. x.astype('float64')" for op in ("add", "lt")]
    try:  # numpy 2.0 takes it by its truth; from 2.1 numpy refuses it
        np.logical_and(np.zeros(1, np.float32), 2 ** 70)
    except OverflowError:
        refused.append("logical_and: the Python int 1180591620717411303424 is out of bounds for int64, the dtype it "
                       "takes beside a DTensor of float32 (numpy 2 refuses it too: OverflowError); pass "
                       "its truth, True")
    assert said == refused


def test_clip_by_bfloat16_tensor_or_scalar_bounds_is_numpys_float32():
    """np.clip of bfloat16 beside bfloat16 bounds (arrays or ml_dtypes scalars; int8 x too) computes in float32 (it
    has no bfloat16 loop): spmdsim's clip by DTensor bounds was bfloat16, by bfloat16 scalars refused ("clip: low 1
    must be a real number"). One bound is np.maximum / np.minimum's: bfloat16 still."""
    g = BASE.astype(BF16)
    lo, hi, i8 = np.full(6, -1.0, BF16), np.full(6, 1.5, BF16), ARRAYS["int8"]
    wants = [np.clip(g, lo, hi), np.clip(g, lo, BF16.type(1.5)), np.clip(g, BF16.type(-1), BF16.type(1.5)),
             np.clip(i8, lo, hi), np.clip(g, lo, None), np.clip(g, BF16.type(-1), None)]

    def body():
        mesh = Mesh(Layout((2,), ("x",)))
        x, low, high, i = (DTensor.from_global(mesh, a, mesh.layout("x")) for a in (g, lo, hi, i8))
        return [t.gather() for t in (ops.clip(x, low, high), np.clip(x, low, BF16.type(1.5)),
                                     x.clip(BF16.type(-1), BF16.type(1.5)), ops.clip(i, low, high),
                                     ops.clip(x, low), ops.clip(x, BF16.type(-1)))]

    got = spmdsim.simulate(2, body)[0]
    assert [w.dtype.name for w in wants] == ["float32"] * 4 + ["bfloat16"] * 2
    assert [r.dtype.name for r in got] == [w.dtype.name for w in wants]
    assert all(_same(r, w) for r, w in zip(got, wants))


def test_clip_by_one_bound_of_a_wider_dtype_is_numpys():
    """One bound is np.maximum / np.minimum's, computed in the dtype x and that bound promote to. The missing
    bound was x's own dtype's extreme, which clipped the result again: int32 x clipped below by inf was int32's
    largest value (float64), a bool mask below by 300 was 1; beside a numpy scalar bound it was a Python inf or
    int, which widened uint8 by np.float32(2.5) to float64 and a mask by np.int8(-3) to int64."""
    i32, u8, mask = np.array([-3, 0, 7, 2, 1, 4], np.int32), ARRAYS["uint8"], ARRAYS["bool"]
    wants = [np.clip(i32, np.inf, None), np.clip(i32, 3e9, None), np.clip(mask, 300, None),
             np.clip(u8, np.float32(2.5), None), np.clip(mask, np.int8(-3), None), np.clip(i32, None, -np.inf),
             np.clip(mask, np.float32(0.5), None), np.clip(u8, None, np.int16(-1))]

    def body():
        mesh = Mesh(Layout((4,), ("x",), cut="chunk"))
        x, u, m = (DTensor.from_global(mesh, a, mesh.layout("x")) for a in (i32, u8, mask))
        return [t.gather() for t in (ops.clip(x, np.inf), x.clip(3e9), np.clip(m, 300, None),
                                     u.clip(np.float32(2.5)), ops.clip(m, np.int8(-3)), x.clip(None, -np.inf),
                                     ops.clip(m, np.float32(0.5)), np.clip(u, None, np.int16(-1)))]

    got = spmdsim.simulate(4, body)[0]
    assert [r.dtype.name for r in got] == [w.dtype.name for w in wants]
    assert all(np.array_equal(r, w) for r, w in zip(got, wants)), (got, wants)


def test_bfloat16_beside_a_dtensor_numpy_has_no_promotion_for_is_numpys_ufunc_dtype():
    """bfloat16 beside a DTensor of float16, int16 and wider ints: np.result_type has no entry
    (DTypePromotionError) and every binary op crashed with its traceback, where numpy's ufunc computes in
    float32 (float16, int16, uint16) or float64 (int32 and wider). Now numpy's dtype and values in every binary
    op, both orders (the bitwise ops on floats refused, as numpy refuses them); np.where, np.concatenate and np.stack
    have no common dtype for them (numpy refuses) and neither has spmdsim: one line naming the op."""
    warnings.simplefilter("ignore", RuntimeWarning)
    ints = np.array([-3, -1, 0, 1, 2, 5])
    others = {name: (ints if name[0] == "i" else np.abs(ints)).astype(name) if name[0] in "iu"
              else BASE.astype(name) for name in ("float16", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                                                  "uint8", "float32")}
    g = ARRAYS["bfloat16"]
    c = BASE > 0

    def body():
        mesh = Mesh(Layout((2,), ("x",)))
        x = DTensor.from_global(mesh, g, mesh.layout("x"))
        bad, said = [], []
        for name, h in others.items():
            y = DTensor.from_global(mesh, h, mesh.layout("x"))
            for op in BINARY:
                for args, args_np, order in (((x, y), (g, h), "x, y"), ((y, x), (h, g), "y, x")):
                    why = _compare(mesh, x, g, op, args, args_np)
                    if why:
                        bad.append(f"{op}({order}) bfloat16 x, {name} y: {why}")
            if name in ("int32", "float16"):
                m = DTensor.from_global(mesh, c, mesh.layout("x"))
                for call in (lambda: ops.where(m, x, y), lambda: ops.concatenate([x, y]), lambda: ops.stack([y, x])):
                    try:
                        call()
                    except DTypeError as e:
                        said.append(str(e))
        return bad, said

    bad, said = spmdsim.simulate(2, body)[0]
    assert not bad, f"{len(bad)} differ from numpy:\n" + "\n".join(bad[:20])
    # (the op named: the line did not say which call refused); none where numpy promotes them (ml_dtypes 0.7)
    assert said == [f"{op}: no common dtype of bfloat16 and {name}: numpy has none (its np.result_type refuses them: "
                    "a join or np.where of them too); convert one first, e.g. x.astype('float32')"
                    for name in ("float16", "int32") if not _promotes(BF16, name)
                    for op in ("where", "concatenate", "stack")]


def _said(call) -> str:
    """What `call` raised, as its type and line ("OK" where it returned)."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - numpy's own error too, compared by the tests
        return f"{type(e).__name__}: {e}"
    return "OK"


def test_linear_of_a_bias_numpy_has_no_common_dtype_with_its_products_names_the_op():
    """ops.linear of a float16 x and w with a bfloat16 bias raised numpy's DTypePromotionError (its traceback,
    from spmdsim.nn.ops._common.add_bias) and, where the product stays a pending sum (reduce=False), on the first
    rank of the reduction only: the other ran on. Now one line naming the op and the dtypes, on every rank."""
    def body():
        mesh = Mesh(Layout((2,), ("x",)))
        f16 = lambda shape, *entries: DTensor.from_global(mesh, np.ones(shape, np.float16), mesh.layout(*entries))
        bias = lambda *entries: DTensor.from_global(mesh, np.ones(4, BF16), mesh.layout(*entries))
        column = f16((3, 6), None, None), f16((6, 4), None, "x"), bias("x")
        row = f16((3, 6), None, "x"), f16((6, 4), "x", None), bias(None)
        said = [_said(lambda: ops.linear(*column)), _said(lambda: ops.linear(*row)),
                _said(lambda: ops.linear(*row, reduce=False))]
        if said != ["OK"] * 3:
            return said
        return [t.gather() for t in (ops.linear(*column), ops.linear(*row), ops.linear(*row, reduce=False))]

    if _promotes(np.float16, BF16):  # ml_dtypes 0.7: numpy's sum of the float16 product and the bias
        want = np.ones((3, 6), np.float16) @ np.ones((6, 4), np.float16) + np.ones(4, BF16)
        for rank in spmdsim.simulate(2, body):
            assert all(_same(got, want) for got in rank), (rank, want.dtype)
        return
    line = ("DTypeError: linear: no common dtype of bfloat16 and float16: numpy has none (its np.result_type "
            "refuses a product of one plus a bias of the other); convert one first, e.g. x.astype('float32')")
    assert spmdsim.simulate(2, body) == [[line] * 3] * 2


def test_a_row_parallel_pending_sum_beside_a_wider_bias_is_of_the_sums_dtype_on_every_rank():
    """ops.linear(reduce=False) of float32 x and w split on the contraction, with a float64 bias: the first rank of
    the pending sum added the bias (float64) and the other kept its float32 part, so the next collective met two
    dtypes (spmdsim's RuntimeMismatchError, or a hang under MPI). Now every rank's part is float64, and the sum,
    float64 and reduce=True's alike, is numpy's."""
    rng = np.random.default_rng(7)
    x, w, b = rng.standard_normal((3, 6)).astype(np.float32), rng.standard_normal((6, 4)).astype(np.float32), \
        rng.standard_normal(4)

    def body():
        mesh = Mesh(Layout((2,), ("x",)))
        xd = DTensor.from_global(mesh, x, mesh.layout(None, "x"))
        wd = DTensor.from_global(mesh, w, mesh.layout("x", None))
        bd = DTensor.from_global(mesh, b, mesh.layout(None))
        pending = ops.linear(xd, wd, bd, reduce=False)
        return pending.local.dtype.name, pending.gather(), ops.linear(xd, wd, bd).gather()

    want = x @ w + b
    for dtype, summed, reduced in spmdsim.simulate(2, body):
        assert dtype == summed.dtype.name == reduced.dtype.name == "float64"
        np.testing.assert_allclose(summed, want, rtol=1e-6, atol=1e-6)  # float32 products of 6 terms
        np.testing.assert_allclose(reduced, want, rtol=1e-6, atol=1e-6)


def _norms(dtypes, dry=False):
    """layer_norm (weight and bias) and rms_norm (weight) of x (4, 8) on 2 simulated ranks, per (x's dtype, the
    weight's): rows split (whole on each rank: one fused node) or the last dim split (the composite), kept "graph"
    or "megatron"; each result's block gathered (float64) with its dtype, and the weight's and bias's gradients."""
    rng = np.random.default_rng(5)
    x, g, b, dy = (rng.standard_normal((4, 8)), rng.standard_normal(8), rng.standard_normal(8),
                   rng.standard_normal((4, 8)))

    def body():
        mesh = Mesh(Layout((2,), ("r",)))
        out = []
        for dx, dw in dtypes:
            for layout in (mesh.layout("r", None), mesh.layout(None, "r")):
                for kept in ("graph", "megatron"):
                    for op in ("layer_norm", "rms_norm"):
                        xd = DTensor.from_global(mesh, x.astype(dx), layout).requires_grad_()
                        gd, bd = (DTensor.from_global(mesh, v.astype(dw), mesh.layout(None)).requires_grad_()
                                  for v in (g, b))
                        y = ops.layer_norm(xd, gd, bd, kept=kept) if op == "layer_norm" else ops.rms_norm(xd, gd,
                                                                                                        kept=kept)
                        y.backward(DTensor.from_global(mesh, dy.astype(y.dtype), layout))
                        grads = (gd.grad.gather(), bd.grad.gather() if op == "layer_norm" else None)
                        out.append((op, kept, y.dtype.name, y.gather().astype(np.float64)) + grads)
        return out

    return spmdsim.simulate(2, body, dry_run=dry)[0]


def test_a_norms_dtype_is_the_graphs_for_every_layout_and_kept_real_or_dry():
    """layer_norm and rms_norm beside a weight of another dtype: kept="megatron" with rows whole refused a float16
    x beside a bfloat16 weight (np.result_type) and gave a bfloat16 x beside a float32 weight bfloat16 on a real
    run (its kernel rounded to x's dtype) but float32 on a dry one, and the composite (the last dim split) gave
    bfloat16 x beside a bfloat16 weight float32 (a Python float beside its bfloat16 sums), where the graph's fused
    node gives what ops.mul and ops.add give: float32, float32, bfloat16. Now every layout and kept gives it, real
    or dry, each within rounding of the graph's whole rows (the layer norm's megatron values its, bit for bit)."""
    cases = ((np.float16, BF16), (BF16, np.float32), (BF16, BF16))
    real, dry = _norms(cases), _norms(cases, dry=True)
    for i, want in enumerate(("float32", "float32", "bfloat16")):
        runs = real[8 * i:8 * i + 8]  # (rows whole, last dim split) x (graph, megatron) x (layer_norm, rms_norm)
        assert [r[2] for r in runs] == [r[2] for r in dry[8 * i:8 * i + 8]] == [want] * 8, (cases[i], runs, dry)
        for op in ("layer_norm", "rms_norm"):
            same = [r[3] for r in runs if r[0] == op]
            u = 2.0 ** -8 if BF16 in cases[i] else 2.0 ** -11  # the unit roundoff of the narrowest dtype
            assert all(np.all(np.abs(y - same[0]) <= 8 * u * (1 + np.abs(same[0]))) for y in same), (cases[i], op)
        assert np.array_equal(runs[0][3], runs[2][3])  # the layer norm's rows whole: megatron's values are the graph's


def test_a_megatron_layer_norm_beside_a_float32_weight_has_the_graphs_weight_and_bias_gradients():
    """kept="megatron"'s layer norm of a bfloat16 x beside a float32 weight and bias: its rule rounded dY to x's
    dtype, where the graph's (its output now float32, as the graph's) takes dY as the walk gives it, float32. Now
    the weight's and bias's gradients are the graph's, bit for bit (rows whole on each rank)."""
    graph, megatron = _norms(((BF16, np.float32),))[0:3:2]  # layer_norm, rows whole: graph, megatron
    assert graph[:2] == ("layer_norm", "graph") and megatron[:2] == ("layer_norm", "megatron")
    for g, m in zip(graph[4:], megatron[4:]):
        assert g.dtype == m.dtype == np.float32 and np.array_equal(g, m)


def test_a_products_dtype_and_values_do_not_depend_on_whether_ranks_split_its_contraction():
    """ops.matmul and ops.linear of bfloat16 blocks: a split contraction dim sized its pending sum by
    np.result_type (bfloat16 beside bfloat16, each rank's part rounded before the Allreduce; numpy's
    DTypePromotionError for float16 beside bfloat16) where the whole one is precision.product's float32 product.
    Now every layout gives np.matmul's dtype (float32) and the float32 product's values, whose two sums
    (whole, or a part per rank added by the collective) differ within float32's rounding of K terms; the
    single-process reference (spmdsim.references.forward.matmul, which refused float16 beside bfloat16) gives it too."""
    from spmdsim.references import forward as reference

    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((3, 8)), rng.standard_normal((8, 5))
    pairs = ((BF16, BF16), (np.float16, BF16), (np.float32, BF16))

    def body():
        mesh = Mesh(Layout((2,), ("k",)))
        got = []
        for dx, dw in pairs:
            for k in (None, "k"):  # the contraction dim whole on every rank, or split over both
                a = DTensor.from_global(mesh, x.astype(dx), mesh.layout(None, k))
                b = DTensor.from_global(mesh, w.astype(dw), mesh.layout(k, None))
                got += [ops.matmul(a, b).local, ops.linear(a, b).local]
        return got

    got = spmdsim.simulate(2, body)[0]
    for i, (dx, dw) in enumerate(pairs):
        xs, ws = x.astype(dx), w.astype(dw)
        want = reference.matmul(xs, ws)
        bound = 8 * np.finfo(np.float32).eps * (np.abs(xs.astype(np.float64)) @ np.abs(ws.astype(np.float64)))
        for y in got[4 * i:4 * i + 4]:  # matmul and linear, whole and split
            assert y.dtype == want.dtype == np.float32, (dx, dw, y.dtype, want.dtype)
            assert np.all(np.abs(y.astype(np.float64) - want) <= bound), (dx, dw)
