"""General operators by sharding rules on simulated ranks: hypothesis draws the meshes and layouts.

Every case (tests/generalkit.py) builds its operands on a random mesh of 1-3
axes with random tensor maps (several axes on one dim, pending operands),
checks the forward against numpy and every operand's float64 gradient
against central differences, on 8 and 4 simulated ranks. The rules' own
texts and refusals are checked without ranks.
"""
from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import spmdsim
from spmdsim import DTypeError, Layout, OperatorError, SeededTensor, ShapeError
from spmdsim.nn import ops
from spmdsim.programs.infer.einsum import infer_einsum, parse_einsum
from spmdsim.programs.infer.pointwise import infer_pointwise, infer_reduce

from generalkit import CASES, Case, random_case, run_case

L = Layout((2, 4), ("dp", "tp"))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(CASES)), seed=st.integers(0, 2 ** 32 - 1), ranks=st.sampled_from([8, 4]))
# Found by this test: a stack whose operand's split of the joined dim became a pending sum (mixed pending
# operands) kept the axis on the dim too ("axis 'm2' is used more than once").
@example(name="stack", seed=24570, ranks=8)
def test_every_rule_matches_numpy_forward_and_backward(name, seed, ranks):
    case = random_case(name, ranks, np.random.default_rng(seed))
    results = spmdsim.simulate(ranks, lambda: run_case(spmdsim.world(), case))
    assert len(set(results)) == 1  # every rank reached the same verdict
    assert results[0][2] is None, results[0][2]


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_op_on_a_fixed_split_layout(name):
    """Each op with every operand split on its last dim over 4 ranks (the hard case for norms)."""
    shapes = CASES[name][0]
    maps = tuple((None,) * (len(s) - 1) + ("m0" if s[-1] % 4 == 0 else None,) for s in shapes)
    case = Case(name, (4,), shapes, maps, ((),) * len(shapes), CASES[name][3])
    results = spmdsim.simulate(4, lambda: run_case(spmdsim.world(), case))
    assert results[0][2] is None, results[0][2]


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_op_on_a_pending_first_operand(name):
    """Each op with its first operand a pending sum over one axis: a rule that keeps the sum pending through
    an op that is not linear (softsign's LINEARITY "joint") gives each rank's part's value, not the sum's."""
    shapes = CASES[name][0]
    maps = tuple((None,) * len(s) for s in shapes)
    case = Case(name, (2, 2), shapes, maps, (("m1",),) + ((),) * (len(shapes) - 1), CASES[name][3])
    results = spmdsim.simulate(4, lambda: run_case(spmdsim.world(), case))
    assert results[0][2] is None, results[0][2]


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("rows, partial", [(("m0",), ()), (("m0", "m1"), ()), (None, ("m1",))])
def test_norms_over_a_whole_dim(name, rows, partial):
    """A row whole on every rank takes the norms' one-kernel path (its own backward): rows split over one or
    two axes, or the input pending over an axis, forward against numpy and the gradient against central
    differences, the weights replicated."""
    shapes = CASES[name][0]
    maps = ((rows, None),) + tuple((None,) for _ in shapes[1:])
    case = Case(name, (2, 2), shapes, maps, (partial,) + ((),) * (len(shapes) - 1), CASES[name][3])
    results = spmdsim.simulate(4, lambda: run_case(spmdsim.world(), case))
    assert results[0][2] is None, results[0][2]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2 ** 32 - 1), ranks=st.sampled_from([8, 4]))
def test_argmax_and_argmin_match_numpy_on_any_layout(seed, ranks):
    """First index on ties and NaN counted extreme, as numpy, over split dims (two Allreduces), whole dims
    (none) and every dim (dim None: the flattened index); floats with ties and NaNs, and integers."""
    rng = np.random.default_rng(seed)
    case = random_case("max", ranks, rng)  # a random mesh and a random (possibly pending) layout of (4, 8)
    values = rng.integers(0, 4, size=(4, 8)).astype(np.float64)  # few values: many ties
    if rng.random() < 0.5:
        values[tuple(rng.integers(0, [4, 8], size=(3, 2)).T)] = np.nan
    if rng.random() < 0.3:
        values = np.nan_to_num(values, nan=7.0).astype(np.int64)

    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout(case.mesh, tuple(f"m{i}" for i in range(len(case.mesh)))))
        partial = case.partial[0] if values.dtype.kind == "f" else ()  # an integer sum is exact too, but keep it plain
        x = DTensor.from_global(mesh, values, mesh.layout(*case.maps[0], partial=partial))
        wrong = []
        for dim in (None, 0, 1, -1):
            for keepdims in (False, True):
                for ours, theirs in ((ops.argmax, np.argmax), (ops.argmin, np.argmin)):
                    got = ours(x, dim, keepdims=keepdims)
                    want = theirs(values, axis=dim, keepdims=keepdims)
                    if got.local.dtype != np.int64 or not np.array_equal(got.gather(), want):
                        wrong.append((ours.__name__, dim, keepdims))
        if not np.array_equal(x.argmax(-1).gather(), np.argmax(values, -1)):  # DTensor's method, PyTorch's spelling
            wrong.append("x.argmax(-1)")
        return wrong

    results = spmdsim.simulate(ranks, body)
    assert results[0] == [], (case, values, results[0])


def test_equality_operators_compare_values_and_hashing_stays_identity():
    """``==`` and ``!=`` give bool DTensors as numpy's (operands on different layouts, a number), a DTensor is
    still a dict key by identity, and a one-element DTensor has a truth value (more: ambiguous)."""
    a = np.array([[0, 1, 2, 3], [4, 0, 6, 7]], dtype=np.float64)
    b = np.array([[0, 1, 0, 3], [4, 5, 6, 0]], dtype=np.float64)

    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2, 2), ("m0", "m1")))
        x = DTensor.from_global(mesh, a, mesh.layout("m0", "m1"))
        y = DTensor.from_global(mesh, b, mesh.layout(None, ("m1", "m0")))
        same, differ, zero = (x == y).gather(), (x != y).gather(), (x == 0.0).gather()
        table = {x: "x", y: "y"}
        found = [t for t in (y, x) if t is x]
        truth = [bool(ops.max(x) == 7.0), bool(ops.sum(x != y) == 3)]
        try:  # `in` compares values past the identical one, as over PyTorch's tensors: ambiguous, one line
            x in [y, x]
        except OperatorError as e:
            ambiguous = str(e)
        return same, differ, zero, table[x], x in [x, y], len(found), truth, ambiguous

    same, differ, zero, key, member, found, truth, ambiguous = spmdsim.simulate(4, body)[0]
    np.testing.assert_array_equal(same, a == b)
    np.testing.assert_array_equal(differ, a != b)
    np.testing.assert_array_equal(zero, a == 0)
    assert (key, member, found) == ("x", True, 1)
    assert truth == [True, True]
    assert ambiguous == ("the truth value of a DTensor of global shape (2, 4) is ambiguous; reduce it to one "
                         "element first (ops.max, ops.min, ops.sum) or compare gather()")


@pytest.mark.parametrize("ranks", [4, 8])
def test_embedding_padding_idx_row_gets_no_gradient(ranks):
    """PyTorch's padding_idx (negative from the end too): the padding row's gradient is zero, every other row's
    the scattered upstream, on vocabulary-split, dim-split and replicated tables; the lookup unchanged."""
    rng = np.random.default_rng(ranks)
    table, ids = rng.normal(size=(8, 4)), np.array([[0, 3, 3, 7], [5, 0, 1, 3]])
    upstream = rng.normal(size=(2, 4, 4))

    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2, ranks // 2), ("a", "b")))
        L = mesh.layout
        wrong = []
        for m in [(None, None), ("a", None), (("a", "b"), None), (None, "b"), ("a", "b")]:
            for pad in (3, -5, None):
                w = DTensor.from_global(mesh, table, L(*m)).requires_grad_()
                y = ops.embedding(DTensor.from_global(mesh, ids, L(None, None)), w, padding_idx=pad)
                ops.sum(y * DTensor.from_global(mesh, upstream, L(None, None, None))).backward()
                want = np.zeros_like(table)
                np.add.at(want, ids.reshape(-1), upstream.reshape(-1, 4))
                if pad is not None:
                    want[pad % 8] = 0
                if not (np.allclose(w.grad.gather(), want, rtol=1e-14, atol=1e-14)
                        and np.array_equal(y.gather(), table[ids])):
                    wrong.append((m, pad))
        try:
            ops.embedding(DTensor.from_global(mesh, ids, L(None, None)), w, padding_idx=8)
        except OperatorError as e:
            wrong.append(str(e))
        return wrong

    assert spmdsim.simulate(ranks, body)[0] == [
        "embedding: padding_idx 8 must be an integer from -8 to 7 (a row of the (8, ...) table)"]


def test_argmax_refusals_are_one_line():
    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((4,), ("m0",)))
        x = DTensor.from_global(mesh, np.zeros((4, 8)), mesh.layout(None, "m0"))
        said = []
        for call in (lambda: ops.argmax(x, 1.5), lambda: ops.argmax(x, 2), lambda: ops.argmin(x, True),
                     lambda: ops.argmax(np.zeros(3), 0)):
            try:
                call()
            except OperatorError as e:
                said.append(str(e))
        # A mask's argmax and argmin are numpy's (the first True, the first False), where they were refused
        mask = DTensor.from_global(mesh, MASK, mesh.layout(None, "m0"))
        return said, [(r.dtype, r.gather()) for r in (mask.argmax(1), mask.argmin(1), mask.argmax(), ops.argmin(mask))]

    said, masks = spmdsim.simulate(4, body)[0]
    assert said == ["argmax: dim 1.5 must be an integer or None (the flattened tensor)",
                    "argmax: dim 2 is out of range for a tensor of 2 dims (expected an integer from -2 to 1)",
                    "argmin: dim True must be an integer or None (the flattened tensor)",
                    said[3]]
    assert said[3].startswith("argmax: ") and "DTensor" in said[3] and "\n" not in said[3]
    wants = [MASK.argmax(1), MASK.argmin(1), MASK.argmax(), MASK.argmin()]
    assert [d for d, _ in masks] == [w.dtype for w in wants]
    assert all(np.array_equal(g, w) for (_, g), w in zip(masks, wants))


def test_a_complex_extreme_over_a_split_dim_is_refused_naming_the_op():
    """argmax, argmin, max and min of a complex tensor over a split dim were refused by the Allreduce inside
    ("allreduce: cannot take the max of dtype 'complex128'"), naming no op the program called; now by the op,
    before any collective. Over a dim each rank holds whole they stay numpy's (real part first)."""
    values = np.array([[1 + 2j, 3 - 1j], [3 + 0j, 0j]])

    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2,), ("m0",)))
        x = DTensor.from_global(mesh, values, mesh.layout("m0", None))
        said = []
        for call in (lambda: ops.argmax(x, 0), lambda: x.argmin(), lambda: ops.max(x, 0), lambda: ops.min(x)):
            try:
                call()
            except DTypeError as e:
                said.append(str(e))
        return said, [r.gather().tolist() for r in (ops.argmax(x, 1), ops.argmin(x, 1), ops.max(x, 1))]

    said, whole = spmdsim.simulate(2, body)[0]
    tail = (" of dtype 'complex128' over a dim split across ranks: ranks compare with MPI's MAX/MIN, which orders no "
            "complex numbers; expected an integer or real float dtype, or the reduced dims held whole on every rank "
            "(redistribute first)")
    assert said == [kind + tail for kind in ("argmax", "argmin", "max", "min")]
    assert whole == [values.argmax(1).tolist(), values.argmin(1).tolist(), values.max(1).tolist()]


def test_a_float16_mean_adds_in_float32_as_numpys():
    """numpy's np.mean adds float16 entries in float32 and rounds the mean once; ops.mean added them in float16, so
    a row whose sum passes 65504 had the mean inf (four entries of 40000 to 60000: numpy 52480), whole or split
    over ranks (a pending sum of float16 parts, each rounded once). The sum alone stays float16, as numpy's."""
    g = np.array([[60000, 60000, 50000, 40000], [1, 2, 3, 4]], np.float16)

    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2,), ("m0",)))
        out = []
        for spec in ((None, None), (None, "m0"), ("m0", None)):
            x = DTensor.from_global(mesh, g, mesh.layout(*spec))
            with np.errstate(over="ignore"):  # (the float16 sum's inf, as numpy's: its warning is numpy's too)
                out += [ops.mean(x, 1).gather(), x.mean().gather(), ops.sum(x, 1).gather()]
        return out

    with np.errstate(over="ignore"):
        summed_here = g.sum(1)
    for got in spmdsim.simulate(2, body):
        for split, (mean, whole, summed) in enumerate(zip(got[::3], got[1::3], got[2::3])):
            assert mean.dtype == whole.dtype == summed.dtype == np.float16
            assert mean.tolist() == g.mean(1).tolist() == [52480.0, 2.5]
            assert summed.tolist() == summed_here.tolist() == [np.inf, 10.0]
            # whole: numpy's; split, each rank's part rounded to float16 once more (26240 for numpy's 26256)
            assert whole == g.mean() if not split else abs(float(whole) - float(g.mean())) <= 2 ** -9 * g.mean()


def test_an_integer_mean_adds_in_float64_as_numpys():
    """numpy's np.mean adds integers and bools in float64; ops.mean added an int64 or uint64 block in its own dtype
    first, which wraps past 2**63 or 2**64: three entries of 2**62 had the mean -1.15e18 where numpy's is
    3.46e18, whole or split over ranks."""
    g = np.array([[2 ** 62, 2 ** 62, 2 ** 62, 1], [-3, 5, 7, 2]], np.int64)
    u = np.array([[2 ** 63, 2 ** 63, 1, 2]], np.uint64)

    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2,), ("m0",)))
        out = []
        for spec in ((None, None), (None, "m0")):
            x, y = (DTensor.from_global(mesh, a, mesh.layout(*spec)) for a in (g, u))
            out += [ops.mean(x, 1).gather(), x.mean().gather(), np.mean(y, 1).gather()]
        return out

    for got in spmdsim.simulate(2, body):
        for have, want in zip(got, [g.mean(1), g.mean(), u.mean(1)] * 2):
            assert have.dtype == want.dtype == np.float64
            assert np.allclose(have, want, rtol=1e-15, atol=0), (have, want)


def test_ops_astype_of_a_pending_float_sum_to_integers_is_refused_as_the_method_refuses_it():
    """x.astype('int64') of a pending sum of floats refuses in one line (the sum of truncated addends is not the
    truncated sum); ops.astype converted each rank's addend: 0.6 + 0.6 on two ranks gave 0 where numpy's is 1."""
    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2,), ("m0",)))
        pending = ops.sum(DTensor.from_global(mesh, np.array([0.6, 0.6]), mesh.layout("m0")))
        said = []
        for call in (lambda: ops.astype(pending, np.int64), lambda: pending.astype(np.int64)):
            try:
                said.append(ops.resolved(call()).item())
            except DTypeError as e:
                said.append(str(e))
        return said, ops.resolved(ops.astype(ops.resolved(pending), np.int64)).item()

    said, resolved = spmdsim.simulate(2, body)[0]
    line = ("astype('int64') of a pending sum over ('m0',) of dtype 'float64': the addends would be truncated one by "
            "one; resolve the sum first (redistribute to a layout without partial axes)")
    assert said == [line, line] and resolved == 1


def test_the_astype_method_is_recorded_for_autograd_as_ops_astype():
    """x.astype(dtype) (PyTorch's x.float(), x.half(): the porting guide's spelling) converted the blocks outside
    autograd: the gradient stopped there, so sum(x.astype('float32') * 3) had no gradient ("backward() of a loss
    that does not require grad") and sum(y * y.astype(y.dtype)) half of 2 y. It records the cast now, the
    gradient in x's dtype, as ops.astype."""
    g = np.array([1.0, -2.0, 3.0, 0.5])

    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2,), ("m0",)))
        a, b = (DTensor.from_global(mesh, g, mesh.layout("m0")).requires_grad_() for _ in range(2))
        ops.sum(a.astype(np.float32) * 3.0).backward()
        y = b * 1.0
        ops.sum(y * y.astype(y.dtype)).backward()
        return a.grad.gather(), b.grad.gather()

    for da, db in spmdsim.simulate(2, body):
        assert da.dtype == db.dtype == np.float64
        assert da.tolist() == [3.0] * 4 and db.tolist() == (2 * g).tolist()


def test_an_optimizer_given_a_cast_of_a_leaf_says_how_to_make_it_one():
    """With x.astype recorded, p.astype('float32').requires_grad_() of a leaf p is a non-leaf (PyTorch's p.to(...) of
    a leaf too): the optimizer's refusal said "computed by an op"; it says the cast and the no_grad way out."""
    from spmdsim.nn.autograd import no_grad
    from spmdsim.nn.optim import AdamW

    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2,), ("m0",)))
        p = DTensor.from_global(mesh, np.ones(4), mesh.layout("m0")).requires_grad_()
        with pytest.raises(OperatorError, match=r"not a leaf: a cast by x\.astype, which records it for the "
                           r"gradient; cast inside spmdsim\.nn\.autograd\.no_grad\(\), then requires_grad_\(\)"):
            AdamW([p.astype(np.float32).requires_grad_()])
        with no_grad():
            q = p.astype(np.float32)
        return len(AdamW([q.requires_grad_()]).params)

    assert spmdsim.simulate(2, body) == [1, 1]


def test_a_mean_over_no_entries_is_numpys_nan_without_numpys_warning():
    """ops.mean over a dim of size 0 is NaN, as numpy's; its 0 / 0 printed numpy's "RuntimeWarning: invalid value
    encountered in divide" from inside spmdsim/nn/ops/reduce.py (numpy's own mean warns "Mean of empty slice")."""
    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2,), ("m0",)))
        out = []
        for dtype in ("float64", "float32", "int32", "complex64"):
            for spec, dim in (((None, "m0"), 0), (("m0", None), 0), (("m0", None), None)):
                y = ops.mean(DTensor.zeros(mesh, mesh.layout(*spec), (0, 4), dtype), dim)
                out.append((dtype, dim, y.redistribute(mesh.layout(*[None] * y.ndim)).gather()))
        return out

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        means = spmdsim.simulate(2, body)[0]
    assert [str(w.message) for w in caught] == []
    for dtype, dim, got in means:
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = np.zeros((0, 4), dtype).mean(dim)
        assert (got.shape, got.dtype) == (want.shape, want.dtype) and np.isnan(got).all()


MASK = np.array([[False] * 5 + [True] * 3, [True] * 8, [False] * 8, [True, False] * 4])


def test_negative_and_subtract_of_booleans_are_refused_as_numpy_refuses_them_in_one_line():
    """numpy has no boolean negative, subtract or sign (a TypeError from inside the kernel: sign's was numpy's
    UFuncTypeError on every rank); refused before it runs, through the ops and the operators, and with a bool
    number; a bool beside an int still computes."""
    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2,), ("x",)))
        a = DTensor.from_global(mesh, np.array([True, False, True, False]), mesh.layout("x"))
        said = []
        for call in (lambda: ops.neg(a), lambda: -a, lambda: ops.sub(a, a), lambda: a - a, lambda: ops.sign(a),
                     lambda: np.sign(a)):
            try:
                call()
            except OperatorError as e:
                said.append(str(e))
        n = DTensor.from_global(mesh, np.arange(4), mesh.layout("x"))
        numbers = [(y.gather().tolist(), y.local.dtype.name) for y in (a + True, a * 2, a * 2.5, True + a)]
        try:
            a - True
        except OperatorError as e:
            said.append(str(e))
        return said, (a - n).gather(), ops.equal(a, False).gather(), numbers

    said, mixed, negated, numbers = spmdsim.simulate(2, body)[0]
    # A number beside bool tensors alone is of its own kind, as numpy 2 promotes it (NEP 50): it was lifted to
    # float64, so mask + True was 2.0 where numpy's is True.
    assert numbers == [([True, True, True, True], "bool"), ([2, 0, 2, 0], "int64"),
                       ([2.5, 0.0, 2.5, 0.0], "float64"), ([True, True, True, True], "bool")]
    neg = ("neg of bool DTensors: numpy has no boolean negative; use ops.equal(x, False) for logical not, or "
           "convert first, e.g. x.astype('int64')")
    sub = ("sub of bool DTensors: numpy has no boolean subtract; use ops.not_equal(a, b) for exclusive or, or "
           "convert first, e.g. x.astype('int64')")
    sign = ("sign of bool DTensors: numpy has no boolean sign; use the mask itself (True's sign is 1), or convert "
            "first, e.g. x.astype('int64')")
    assert said == [neg, neg, sub, sub, sign, sign, sub]
    assert mixed.tolist() == [1, -1, -1, -3] and negated.tolist() == [False, True, False, True]


def test_a_numpy_scalar_keeps_its_dtype_as_numpy_2_promotes_it():
    # NEP 50: a numpy scalar is strongly typed, a Python number weak. It was lifted as a Python number, so
    # float32 tensor + np.float64(0.1) was float32 (rounded) where numpy's is float64, bool + np.int8(3)
    # int64 where numpy's is int8; the gradient of the float32 operand stays float32.
    g = np.arange(6, dtype=np.float32).reshape(2, 3) / 7

    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2,), ("x",)))
        a = DTensor.from_global(mesh, g, mesh.layout("x", None)).requires_grad_()
        m = DTensor.from_global(mesh, g > 0.3, mesh.layout("x", None))
        i = DTensor.from_global(mesh, (g * 7).astype(np.int16), mesh.layout("x", None))
        results = [a + np.float64(0.1), a + 0.1, m + np.int8(3), i * np.int64(2), i * np.uint8(2), a * np.float16(2)]
        ops.sum(a * np.float64(0.1)).backward()
        return [r.gather() for r in results], a.grad.local.dtype

    got, grad_dtype = spmdsim.simulate(2, body)[0]
    wants = [g + np.float64(0.1), g + 0.1, (g > 0.3) + np.int8(3), (g * 7).astype(np.int16) * np.int64(2),
             (g * 7).astype(np.int16) * np.uint8(2), g * np.float16(2)]
    assert [r.dtype for r in got] == [w.dtype for w in wants]
    assert all(np.array_equal(r, w) for r, w in zip(got, wants))
    assert grad_dtype == np.float32


@pytest.mark.parametrize("cut, devices", [("even", (2, 2)), ("chunk", (3, 2))])
def test_prod_and_ravel_are_numpys(cut, devices):
    """x.prod() / np.prod / ops.prod and x.ravel() / np.ravel were AttributeErrors (numpy.prod: "no rule"). prod:
    numpy's values and dtypes (bool and int32 to int64, uint8 to uint64, float32 kept) over split and whole
    dims, a rank holding no rows (chunk: 4 rows over 6), a pending sum resolved first; its gradient with zeros
    in a row (the product of the others, not a division). ravel: reshape(-1), its gradient reshaped back; where
    a rank's block would not stay a block, one line naming what to do."""
    from spmdsim import DTensor, Mesh

    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 1.5, (4, 6))
    a[1, 2] = 0.0
    a[2, [0, 4]] = 0.0
    arrays = [a, a.astype(np.float32), (a * 4).astype(np.int32) - 2, (a * 4).astype(np.uint8), a > 0.8]

    def body():
        mesh = Mesh(Layout(devices, ("x", "y"), cut=cut))
        got = []
        for tmap in (("x", "y"), (None, None), (("x", "y"), None)):
            xs = [DTensor.from_global(mesh, g, mesh.layout(*tmap)) for g in arrays]
            got.append([(r.dtype, r.gather()) for x in xs
                        for r in (x.prod(), x.prod(axis=0), np.prod(x, axis=1, keepdims=True), ops.prod(x, (0, 1)))])
        x = DTensor.from_global(mesh, a, mesh.layout("x", "y")).requires_grad_()
        pending = DTensor.from_global(mesh, a, mesh.layout("x", None, partial=("y",)))
        weights = DTensor.from_global(mesh, np.arange(1.0, 5.0), mesh.layout(None))
        (ops.sum(x.prod(1) * weights) + x.prod(0).sum()).backward()
        rows = "x" if cut == "even" else None  # (chunk's 2, 2 and 0 rows are not a cut of the 24 entries)
        r = DTensor.from_global(mesh, a, mesh.layout(rows, None)).requires_grad_()
        flat = r.ravel()
        ops.sum(np.ravel(r) * DTensor.from_global(mesh, np.arange(24.0), mesh.layout(None))).backward()
        with pytest.raises(OperatorError) as e:
            x.ravel()
        return got, x.grad.gather(), pending.prod(0).gather(), flat.gather(), r.grad.gather(), str(e.value)

    got, grad, pending, flat, flat_grad, said = spmdsim.simulate(math.prod(devices), body)[0]
    for per_map in got:
        wants = [w for g in arrays for w in (g.prod(), g.prod(axis=0), g.prod(axis=1, keepdims=True), g.prod())]
        assert [d for d, _ in per_map] == [w.dtype for w in wants]
        assert all(np.allclose(v, w, rtol=1e-6, atol=0) for (_, v), w in zip(per_map, wants))
    others = np.ones_like(a)
    for i, j in np.ndindex(a.shape):
        others[i, j] = np.prod(np.delete(a[i], j)) * (i + 1) + np.prod(np.delete(a[:, j], i))
    assert np.allclose(grad, others, rtol=1e-13, atol=0)
    assert np.allclose(pending, a.prod(0), rtol=1e-13, atol=0)
    assert np.array_equal(flat, a.ravel()) and np.array_equal(flat_grad, np.arange(24.0).reshape(4, 6))
    assert said.startswith("ravel: reshape (4, 6) -> (24,) of x mapped") and "redistribute x" in said


@pytest.mark.parametrize("split", [True, False])
def test_python_ints_beyond_an_integer_dtype_and_powers_of_bools_as_numpy_2(split):
    """NEP 50: an int32 DTensor compared with 2**40 is compared (every entry lies below it), as numpy 2 does;
    lifting the number to int32 raised numpy's OverflowError from deep inside. Arithmetic with it, a bool's
    comparison past int64 and a clip bound on the side where it clips are refused as numpy refuses them, in
    one line; a bound that clips nothing is dropped (numpy 2.4's clip; 2.0's refused it). ``mask ** 2`` is numpy's int8
    (its operator's np.square; np.power(mask, 2) is int64), and an integer to a negative integer power is refused
    on every rank (numpy's ValueError came from the kernel, on the ranks holding entries alone)."""
    from spmdsim import DTensor, DTypeError, Mesh

    ints = np.arange(-4, 4, dtype=np.int32).reshape(2, 4)
    small = np.arange(8, dtype=np.uint8).reshape(2, 4)
    calls = [lambda x, u, w, m: x < 2 ** 40, lambda x, u, w, m: 2 ** 40 >= x, lambda x, u, w, m: x == -2 ** 40,
             lambda x, u, w, m: x != 2 ** 40, lambda x, u, w, m: np.greater(x, -2 ** 40),
             lambda x, u, w, m: u <= -1, lambda x, u, w, m: w > 2 ** 70,
             lambda x, u, w, m: x.clip(0, 2 ** 40) if hasattr(x, "gather") else x.clip(0, None),
             lambda x, u, w, m: m ** 2, lambda x, u, w, m: m ** 3, lambda x, u, w, m: np.power(m, 2),
             lambda x, u, w, m: m < 2 ** 40, lambda x, u, w, m: x ** 2]
    bad = [lambda x, u, w, m: x + 2 ** 40, lambda x, u, w, m: u - 1 + -1, lambda x, u, w, m: m < 2 ** 70,
           lambda x, u, w, m: x.clip(2 ** 40, None), lambda x, u, w, m: x ** -1, lambda x, u, w, m: np.power(m, -2)]

    def body():
        mesh = Mesh(Layout((2, 2), ("x", "y")))
        lay = mesh.layout("x", "y") if split else mesh.layout(None, None)
        operands = [DTensor.from_global(mesh, a, lay) for a in (ints, small, ints.astype(np.int64), ints > 0)]
        x = operands[0]
        x < 1  # a cached call signature of an int32 DTensor and a Python int: found again for 2**40
        got = [(y.dtype, y.gather()) for y in (call(*operands) for call in calls)]
        said = []
        for call in bad:
            with pytest.raises((DTypeError, OperatorError)) as e:
                call(*operands)
            said.append(str(e.value))
        return got, said

    got, said = spmdsim.simulate(4, body)[0]
    wants = [call(ints, small, ints.astype(np.int64), ints > 0) for call in calls]
    assert [g[0] for g in got] == [w.dtype for w in wants]  # int8 for mask ** 2
    assert all(np.array_equal(g[1], w) for g, w in zip(got, wants))
    for call in bad:  # numpy refuses each
        with pytest.raises((OverflowError, ValueError)):
            call(ints, small, ints.astype(np.int64), ints > 0)
    assert said == [
        "add: the Python int 1099511627776 is out of bounds for int32, the dtype it takes beside a DTensor of int32 "
        "(numpy 2 refuses it too: OverflowError); convert first, e.g. x.astype('int64')",
        "add: the Python int -1 is out of bounds for uint8, the dtype it takes beside a DTensor of uint8 (numpy 2 "
        "refuses it too: OverflowError); convert first, e.g. x.astype('int64')",
        "lt: the Python int 1180591620717411303424 is out of bounds for int64, the dtype it takes beside a DTensor "
        "of bool (numpy 2 refuses it too: OverflowError); convert first, e.g. x.astype('float64')",
        "clip: the Python int 1099511627776 is out of bounds for int32, the dtype it takes beside a DTensor of "
        "int32 (numpy 2 refuses it too: OverflowError); convert first, e.g. x.astype('int64')",
        "pow: a DTensor of int32 to the negative integer power -1: numpy refuses integers to negative integer "
        "powers; use a float exponent (-1.0) or convert x first, e.g. x.astype('float64')",
        "pow: a DTensor of bool to the negative integer power -2: numpy refuses integers to negative integer "
        "powers; use a float exponent (-2.0) or convert x first, e.g. x.astype('float64')"]


@pytest.mark.parametrize("layout", [(None, None), ("x", None), (None, "y"), ("x", "y")])
def test_a_two_operand_einsum_to_a_scalar_and_its_gradients(layout):
    """einsum('ij,ij->') raised ShapeError (the pair's product came back 1-d: local shard shape (1,) does not
    match ()) on every layout, replicated too; the value and both gradients are numpy's."""
    g = np.arange(24.0).reshape(4, 6)
    h = np.cos(g)

    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2, 2), ("x", "y")))
        a = DTensor.from_global(mesh, g, mesh.layout(*layout)).requires_grad_()
        b = DTensor.from_global(mesh, h, mesh.layout(*layout)).requires_grad_()
        r = ops.einsum("ij,ij->", a, b)
        r.backward()
        return r.gather(), a.grad.gather(), b.grad.gather()

    value, ga, gb = spmdsim.simulate(4, body)[0]
    assert value.shape == () and np.isclose(value, (g * h).sum(), rtol=1e-14, atol=1e-13 * np.abs(g * h).sum())
    assert np.array_equal(ga, h) and np.array_equal(gb, g)


def test_the_gradient_of_a_0d_einsum_operand():
    """einsum('ij,->ij', a, s): s's gradient is a two-operand contraction to a scalar too (the same 1-d
    product raised ShapeError in the backward)."""
    g = np.arange(8.0).reshape(4, 2)

    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2,), ("x",)))
        a = DTensor.from_global(mesh, g, mesh.layout("x", None)).requires_grad_()
        s = DTensor.from_global(mesh, np.array(3.0), mesh.layout()).requires_grad_()
        y = ops.einsum("ij,->ij", a, s)
        ops.sum(y).backward()
        return y.gather(), s.grad.gather(), a.grad.gather()

    y, gs, ga = spmdsim.simulate(2, body)[0]
    assert np.array_equal(y, 3.0 * g) and gs.shape == () and gs == g.sum()
    assert np.array_equal(ga, np.full((4, 2), 3.0))


def test_concat_is_concatenate():
    """ops.concat was the module of the joins ('module' object is not callable): numpy 2's, PyTorch's and JAX's
    name for concatenate."""
    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((2,), ("x",)))
        a = DTensor.from_global(mesh, np.arange(4.0), mesh.layout("x"))
        return ops.concat([a, a], 0).gather()

    assert ops.concat is ops.concatenate
    assert spmdsim.simulate(2, body)[0].tolist() == [0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0]


def test_cross_entropy_options_refused_in_one_line():
    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((4,), ("m0",)))
        z = DTensor.from_global(mesh, np.zeros((8, 4)), mesh.layout("m0", None))
        y = DTensor.from_global(mesh, np.array([0, 1, 2, 3, 9, -100, 0, 0]), mesh.layout("m0"))
        said = []
        z3 = DTensor.from_global(mesh, np.zeros((2, 4, 4)), mesh.layout(None, "m0", None))
        for call in (lambda: ops.cross_entropy(z3, y), lambda: ops.cross_entropy(z, y, reduction="avg"),
                     lambda: ops.cross_entropy(z, y, ignore_index=1.5),
                     lambda: ops.cross_entropy(z, y), lambda: ops.cross_entropy(z, y, ignore_index=None),
                     lambda: ops.gelu(z, approximate="erf"), lambda: ops.cross_entropy(z, y, label_smoothing=1.5)):
            try:
                call()
            except (OperatorError, ShapeError) as e:
                said.append(str(e))
        return said

    assert spmdsim.simulate(4, body)[0] == [
        "cross_entropy: labels of shape (8,) do not match the logits' rows: expected (2, 4)",
        "cross_entropy: reduction 'avg' must be 'mean', 'sum' or 'none'",
        "cross_entropy: ignore_index 1.5 must be an integer or None",
        "cross_entropy: 1 label outside [0, 4): labels are class indices, from 0 to the number of classes - 1, "
        "or ignore_index -100",
        "cross_entropy: 2 labels outside [0, 4): labels are class indices, from 0 to the number of classes - 1",
        "gelu: approximate 'erf' must be 'tanh' or 'none' (as PyTorch's)",
        "cross_entropy: label_smoothing 1.5 must be a number from 0 to 1"]


@pytest.mark.parametrize("batch", [4092, 4096])  # float32 holds (batch + 1)^2 exactly up to 4,094 rows
def test_cross_entropy_counts_ride_with_the_loss_exactly(batch):
    """The out-of-range and ignored counts share the loss's Allreduce (one number while the dtype holds it
    exactly, else two): the mean's divisor and the error's count are exact either way."""
    rng = np.random.default_rng(batch)
    z = rng.normal(size=(batch, 4)).astype(np.float32)
    y = rng.integers(0, 4, size=batch)
    y[rng.choice(batch, 1000, replace=False)] = -100
    lp = z.astype(np.float64) - np.log(np.exp(z.astype(np.float64)).sum(1, keepdims=True))
    keep = y != -100
    want = -lp[np.arange(batch)[keep], y[keep]].mean()

    def body():
        from spmdsim import DTensor, Mesh

        mesh = Mesh(Layout((4,), ("m0",)))
        zd = DTensor.from_global(mesh, z, mesh.layout("m0", None))
        loss = float(ops.cross_entropy(zd, DTensor.from_global(mesh, y, mesh.layout("m0"))).item())
        bad = y.copy()
        bad[[0, batch // 2, batch - 1]] = 9  # on three ranks
        try:
            ops.cross_entropy(zd, DTensor.from_global(mesh, bad, mesh.layout("m0")))
        except OperatorError as e:
            return loss, str(e)
        return loss, None

    loss, said = spmdsim.simulate(4, body)[0]
    assert abs(loss - want) <= 1e-5 * abs(want)
    assert said == ("cross_entropy: 3 labels outside [0, 4): labels are class indices, from 0 to the number of "
                    "classes - 1, or ignore_index -100")


@pytest.mark.parametrize("ignored", ["all", "some"])
def test_cross_entropy_with_ignored_rows_is_pytorchs_and_the_references(ignored):
    """Every label ignored: "mean" is NaN (0 / 0) and its gradient 0, as PyTorch's (its backward writes the counted
    rows only); "sum" and "none" 0 with a 0 gradient; no RuntimeWarning on any layout. Some ignored: the mean over
    the counted rows. The single-process reference (reference_grad.cross_entropy) gives the same values."""
    import warnings

    from spmdsim import DTensor, Mesh
    from spmdsim.references import backward as rg

    z = np.arange(32.0).reshape(8, 4) / 7
    y = np.full(8, -100) if ignored == "all" else np.array([1, -100, 3, 0, -100, 2, 2, -100])
    want_loss, want_grad = rg.cross_entropy(z, y)
    assert (math.isnan(want_loss) and not want_grad.any()) if ignored == "all" else want_loss > 0

    def body():
        mesh = Mesh(Layout((2, 2), ("a", "b")))
        out = []
        for rows, cols in ((None, None), ("a", None), (("a", "b"), None), ("a", "b"), (None, ("b", "a"))):
            for reduction in ("mean", "sum", "none"):
                zd = DTensor.from_global(mesh, z, mesh.layout(rows, cols)).requires_grad_()
                loss = ops.cross_entropy(zd, DTensor.from_global(mesh, y, mesh.layout(rows)), reduction=reduction)
                (ops.sum(loss) if reduction == "none" else loss).backward()
                out.append((reduction, loss.gather(), zd.grad.gather()))
        return out

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 0 / 0 and inf * 0 warned in the backward
        results = spmdsim.simulate(4, body)
    for reduction, loss, grad in results[0]:
        if reduction == "mean":
            assert np.allclose(loss, want_loss, rtol=1e-14, atol=0, equal_nan=True)
            assert np.allclose(grad, want_grad, rtol=1e-13, atol=1e-16)
        elif ignored == "all":
            assert not np.any(loss) and not np.any(grad)
        else:
            counted = np.count_nonzero(y != -100)
            assert np.allclose(np.sum(loss), want_loss * counted, rtol=1e-14)
            assert np.allclose(grad, want_grad * counted, rtol=1e-13, atol=1e-16)


def test_cross_entropy_refuses_mislaid_labels_before_summing_pending_logits():
    """Logits still a pending sum are added up first (one Allreduce); labels not split like their rows are refused
    before it, every rank alike, with no collective run (the layouts are every rank's)."""
    from spmdsim import DTensor, Mesh, TensorLayout, collect_trace

    def body():
        mesh = Mesh(Layout((2, 2), ("a", "b")))
        pending = TensorLayout(mesh.layout, (("a",), ()), ("b",))
        z = DTensor.from_local(mesh, np.ones((2, 4)), pending, (4, 4))
        with collect_trace() as trace:
            try:
                ops.cross_entropy(z, DTensor.from_global(mesh, np.zeros(4, int), mesh.layout(None)))
            except OperatorError as e:
                return str(e), trace.counts()
            return None, trace.counts()

    assert spmdsim.simulate(4, body) == [("cross_entropy: labels (None,) must be split like the logits' batch dim "
                                          "((\"a\", None)): expected map (('a',),)", {})] * 4


def test_einsum_rule_keeps_free_splits_and_leaves_contracted_ones_pending():
    plan = infer_einsum("bsd,de->bse", (L("dp", None, "tp"), L("tp", None)), ((4, 8, 16), (16, 32)), "float64")
    assert plan.local == L("dp", None, None, partial=("tp",))
    assert plan.targets == (L("dp", None, "tp"), L("tp", None))
    assert "contracted letter 'd' is split over \"tp\"" in plan.why()


def test_einsum_rule_moves_the_cheaper_operand():
    # x split on its contracted dim over tp, w whole: slicing w (free) beats gathering x.
    plan = infer_einsum("ij,jk->ik", (L(None, "tp"), L(None, None)), ((8, 64), (64, 4)), "float64")
    assert plan.targets == (L(None, "tp"), L("tp", None))
    assert plan.choice.moved == (0, 0)
    assert "a local slice, no communication" in plan.why()
    # Both split the contracted dim over different axes: one of them moves, by the fewer bytes.
    plan = infer_einsum("ij,jk->ik", (L(None, "tp"), L("dp", None)), ((8, 64), (64, 4)), "float64")
    assert plan.targets[0].tensor_map[1] == plan.targets[1].tensor_map[0]
    assert sum(plan.choice.moved) == min(plan.choice.moved[0] + plan.choice.moved[1], sum(plan.choice.moved))
    assert "the least of 2 choices" in plan.why()


def test_two_pending_operands_resolve_one_and_say_why():
    p = L(None, None, partial=("tp",))
    plan = infer_einsum("ij,jk->ik", (p, L(None, None, partial=("tp",))), ((4, 8), (8, 2)), "float64")
    assert plan.resolved == (1,) and plan.local.partial == ("tp",)
    assert "a product of sums is not the sum of the products" in plan.why()


def test_elementwise_pending_rules():
    pending = L("dp", None, partial=("tp",))
    assert infer_pointwise("mul", (pending, L()), ((4, 8), ()), "float64").out == pending
    assert infer_pointwise("add", (pending, pending), ((4, 8), (4, 8)), "float64").out == pending
    exp = infer_pointwise("exp", (pending,), ((4, 8),), "float64")
    assert exp.out == L("dp", None) and exp.resolved == (0,)
    assert "exp(a + b) != exp(a) + exp(b)" in exp.why()
    div = infer_pointwise("div", (L("dp", None), pending), ((4, 8), (4, 8)), "float64")
    assert div.resolved == (1,) and not div.out.partial
    assert "dividing by a sum is not the sum of divisions" in div.why()
    # A small pending mean is resolved at its own size rather than making the large result pending.
    sub = infer_pointwise("sub", (L("dp", None), L("dp", None, partial=("tp",))), ((8, 64), (8, 1)), "float64")
    assert sub.out == L("dp", None) and sub.resolved == (1,)


def test_reduction_rules():
    plan = infer_reduce("sum", L("dp", "tp"), (1,), False)
    assert plan.out == L("dp", partial=("tp",)) and not plan.steps
    plan = infer_reduce("max", L("dp", "tp"), (1,), True)
    assert plan.out == L("dp", None) and str(plan.steps[0]).endswith("via Allreduce(MAX) on ('tp',)")
    plan = infer_reduce("min", L("dp", None, partial=("tp",)), (0,), False)
    assert plan.target == L("dp", None) and "min of a sum is not the sum of mins" in plan.why()


@pytest.mark.parametrize("spec, ndims, message", [
    ("ij,jk", (2,), "names 2 operands but 1 were given"),
    ("ii->i", (2,), "letter 'i' repeats in operand 0"),
    ("ij->k", (2,), "output letter 'k' is in no operand"),
    ("ij->ii", (2,), "output letter 'i' repeats"),
    ("i$->i", (2,), "character '$' is not a letter"),
    ("ijk->i", (2,), "operand 0 has 2 dims but subscripts 'ijk'"),
    ("ij->j->i", (2,), "has 2 '->'; expected at most one, between the operands and the output"),
    ("ij-j", (2,), "'-' is not part of a '->'"),
])
def test_einsum_spec_errors_are_one_line(spec, ndims, message):
    with pytest.raises(OperatorError, match=re.escape(message)):
        parse_einsum(spec, ndims)


def test_einsum_spec_implicit_output_and_ellipsis():
    assert str(parse_einsum("ij,jk", (2, 2))) == "ij,jk->ik"
    assert str(parse_einsum("...ij,jk->...ik", (4, 2))) == "ABij,jk->ABik"


def _on_ranks(n, fn):
    return spmdsim.simulate(n, fn)


def test_bad_operands_get_one_line():
    from spmdsim.runtime import DTensor, Mesh

    def body():
        mesh = Mesh(Layout((4,), ("tp",)), spmdsim.world())
        x = DTensor.from_global(mesh, np.ones((4, 8)), mesh.layout(None, "tp"))
        q = DTensor.from_global(mesh, np.ones((2, 8, 2, 4)), mesh.layout(None, "tp", None, None))
        v = DTensor.from_global(mesh, np.ones((2, 4, 2, 2)), mesh.layout(None, "tp", None, None))
        k4 = DTensor.from_global(mesh, np.ones((2, 4, 2, 4)), mesh.layout(None, "tp", None, None))
        ids = DTensor.from_global(mesh, np.zeros(4, np.int64), mesh.layout(None))
        cases = [
            (lambda: x + np.ones(3), OperatorError, "add: operand ndarray of shape (3,) must be a DTensor"),
            (lambda: x * DTensor.from_global(mesh, np.ones((3, 8)), mesh.layout(None, "tp")), ShapeError,
             "mul: shapes (4, 8), (3, 8) do not broadcast"),
            (lambda: ops.einsum("ij,jk->ik", x, x), ShapeError, "letter 'j' has size 8 in operand 0 but 4"),
            (lambda: ops.einsum(x, x), OperatorError, "einsum spec DTensor DTensor(shape=(4, 8), layout=(None, "
             "\"tp\"), dtype=float64,... must be a string like 'ij,jk->ik', given first: einsum(spec, *operands)"),
            (lambda: ops.sum(x, 2), OperatorError, "sum: dim 2 is out of range for a tensor of 2 dims"),
            (lambda: ops.max(x, (1, -1)), OperatorError, "max: dim -1 is given twice"),
            (lambda: ops.softmax(x, None), OperatorError, "softmax: dim None is out of range for a tensor of 2 dims "
             "(expected an integer from -2 to 1)"),
            (lambda: ops.dropout(x, 1.0, seed=1), OperatorError, "dropout: p 1.0 must be a number with 0 <= p < 1"),
            (lambda: ops.dropout(x, 0.1, seed="a"), OperatorError, "dropout: seed 'a' must be an integer"),
            (lambda: ops.dropout(x, 0.1), OperatorError, "dropout: a seed is required (an integer, different per "
                                                          "layer and step"),
            (lambda: ops.layer_norm(x, eps=-1), OperatorError, "layer_norm: eps -1 must be a non-negative"),
            (lambda: ops.where(x, x, x), OperatorError, "where: condition must be a bool DTensor"),
            (lambda: x.masked_fill(x > 0, "-inf"), OperatorError, "masked_fill: value str '-inf' must be a real "
             "number (float('-inf') for minus infinity) or a DTensor"),
            (lambda: ops.causal_mask(mesh, (4,)), OperatorError, "causal_mask shape (4,) needs at least 2 dims"),
            (lambda: x.backward(), OperatorError, "backward() needs a scalar loss"),
            (lambda: ops.attention(x, x, x), ShapeError, "attention: q of global shape (4, 8) has 2 dims; expected "
                                                          "4, (batch, sequence, heads, head dim)"),
            (lambda: ops.attention(q, q, v), ShapeError, "attention: v of global shape (2, 4, 2, 2) does not fit k's "
                                                          "(2, 8, 2, 4); expected the same batch, sequence and heads"),
            (lambda: ops.attention(q, k4, k4, causal=True), ShapeError, "attention: causal with 8 queries and 4 "
                                                                       "keys; expected as many queries as keys"),
            (lambda: ops.attention(q, q, q, dropout=0.1), OperatorError, "attention: dropout needs a seed"),
            (lambda: ops.var(x, 1, correction=-1), OperatorError, "var: correction -1 must be a non-negative integer"),
            (lambda: ops.var(x, 0, correction=4), OperatorError, "var: correction 4 leaves no degrees of freedom "
                                                                  "over 4 entries"),
            (lambda: ops.chunk(x, 0), OperatorError, "chunk: chunks 0 must be a positive integer"),
            (lambda: ops.attention(q, q, q, causal=1), OperatorError, "attention: causal 1 must be True or False"),
            (lambda: ops.attention(q, q, q, batch_first="no"), OperatorError,
             "attention: batch_first 'no' must be True or False"),
            (lambda: ops.matmul(x, x, transpose_a="yes"), OperatorError, "matmul: transpose_a 'yes' must be True or "
                                                                          "False"),
            (lambda: ops.matmul(x, x, transpose_b=1), OperatorError, "matmul: transpose_b 1 must be True or False"),
            (lambda: ops.linear(x, x, reduce="no"), OperatorError, "linear: reduce 'no' must be True or False"),
            (lambda: ops.embedding(ids, x, gather_out="no"), OperatorError,
             "embedding: gather_out 'no' must be True or False"),
            (lambda: ops.dropout(x, 0.1, seed=1, training="no"), OperatorError,
             "dropout: training 'no' must be True or False"),
            (lambda: ops.attention(q, q, q, training="no"), OperatorError,
             "attention: training 'no' must be True or False"),
            (lambda: ops.dropout(x, 0.1, seed=1, mask_dims=(0, 0)), OperatorError,
             "dropout: mask_dims (0, 0) must be a permutation of the tensor's 2 dims, e.g. (1, 0)"),
            (lambda: ops.dropout(x, 0.1, seed=1, mask_dims="ab"), OperatorError,
             "dropout: mask_dims 'ab' must be a permutation of the tensor's 2 dims"),
            (lambda: ops.attention(q, q, np.ones(3)), OperatorError,
             "attention: v must be a DTensor, got ndarray of shape (3,)"),
            (lambda: ops.attention(q, q, q, mask=x), OperatorError, "attention: mask must be a bool DTensor (True "
                                                                     "where a key takes part), got dtype 'float64'"),
            (lambda: ops.attention(q, q, q, mask=x > 0.0), ShapeError, "attention: mask of global shape (4, 8); "
                                                                        "expected (batch, keys) (2, 8)"),
        ]
        for call, kind, text in cases:
            with pytest.raises(kind, match=re.escape(text)):
                call()
        return True

    assert all(_on_ranks(4, body))


def test_norm_weights_and_masks_are_checked_in_one_line_naming_the_op():
    """A layer_norm/rms_norm weight or bias of another shape than (n,), or a numpy array, was a numpy
    ValueError/AttributeError inside kept="megatron"'s kernel, and named 'mul'/'add' otherwise (or, as
    (1,) or (n, n), broadcast silently); masked_fill's float mask was refused naming 'where'."""
    from spmdsim.runtime import DTensor, Mesh

    def body():
        mesh = Mesh(Layout((2,), ("tp",)), spmdsim.world())
        x = DTensor.from_global(mesh, np.ones((4, 8)), mesh.layout("tp", None))
        xs = DTensor.from_global(mesh, np.ones((4, 8)), mesh.layout(None, "tp"))  # the normalized dim split
        w7, w1 = (DTensor.from_global(mesh, np.ones(shape), mesh.layout(None)) for shape in ((7,), (1,)))
        w88 = DTensor.from_global(mesh, np.ones((8, 8)), mesh.layout(None, None))
        w8 = DTensor.from_global(mesh, np.ones(8), mesh.layout(None))
        fit = "does not fit x's last dim of size 8 (x of shape (4, 8)); expected shape (8,)"
        cases = [
            (lambda: ops.layer_norm(x, w7, kept="megatron"), f"layer_norm: weight of shape (7,) {fit}"),
            (lambda: ops.layer_norm(x, w8, w7), f"layer_norm: bias of shape (7,) {fit}"),
            (lambda: ops.layer_norm(xs, w88), f"layer_norm: weight of shape (8, 8) {fit}"),
            (lambda: ops.layer_norm(x, w1), f"layer_norm: weight of shape (1,) {fit}"),
            (lambda: ops.rms_norm(x, w7), f"rms_norm: weight of shape (7,) {fit}"),
            (lambda: ops.layer_norm(x, np.ones(8), kept="megatron"),
             "layer_norm: weight must be a DTensor, got ndarray of shape (8,)"),
            (lambda: ops.masked_fill(x, x, 0.0), "masked_fill: mask must be a bool DTensor, got dtype 'float64'"),
        ]
        for call, text in cases:
            with pytest.raises(ShapeError if "expected shape" in text else OperatorError, match=re.escape(text)):
                call()
        return True

    assert all(_on_ranks(2, body))


def test_backward_with_an_upstream_gradient_checks_it():
    from spmdsim.runtime import DTensor, Mesh

    def body():
        mesh = Mesh(Layout((4,), ("tp",)), spmdsim.world())
        x = DTensor.from_global(mesh, np.arange(16.0).reshape(4, 4), mesh.layout(None, "tp")).requires_grad_()
        y = x * x
        with pytest.raises(OperatorError, match=re.escape("gradient of global shape (4, 2) for a tensor of "
                                                          "global shape (4, 4)")):
            y.backward(DTensor.from_global(mesh, np.ones((4, 2)), mesh.layout(None, None)))
        y.backward(DTensor.from_global(mesh, np.full((4, 4), 3.0), mesh.layout("tp", None)))
        return x.grad.gather()

    grad = _on_ranks(4, body)[0]
    assert np.array_equal(grad, 6.0 * np.arange(16.0).reshape(4, 4))


def test_a_pending_scalar_loss_backpropagates():
    from spmdsim.runtime import DTensor, Mesh

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        w = DTensor.from_global(mesh, np.arange(8.0).reshape(4, 2), mesh.layout("dp", "tp")).requires_grad_()
        loss = ops.mean(w * w)
        assert loss.layout.partial == ("dp", "tp")
        loss.backward()
        return w.grad.gather(), ops.resolved(loss).local

    grad, value = _on_ranks(4, body)[0]
    full = np.arange(8.0).reshape(4, 2)
    assert np.allclose(grad, 2 * full / 8) and np.isclose(value, (full ** 2).mean())


class _Cube(spmdsim.nn.autograd.Function):
    @staticmethod
    def forward(ctx, x, k):
        ctx.save_for_backward(x)
        ctx.k = k
        return k * x ** 3

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return 3 * ctx.k * x ** 2 * dy


def test_custom_autograd_function_on_shards():
    from spmdsim.runtime import DTensor, Mesh

    src = SeededTensor((4, 8), "float64", seed=3)

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_seeded(mesh, mesh.layout("dp", "tp"), src).requires_grad_()
        y = _Cube.apply(x, 2.0)
        assert y.check(2.0 * src.full() ** 3).passed
        ops.sum(y).backward()
        with pytest.raises(OperatorError, match=re.escape("is a pending sum; resolve it first with "
                                                          "spmdsim.nn.ops.resolved(x) (one Allreduce, on every rank)")):
            _Cube.apply(ops.sum(x, 1, keepdims=True), 1.0)
        return x.grad.gather()

    assert np.allclose(_on_ranks(4, body)[0], 6.0 * src.full() ** 2)


def test_dropout_mask_does_not_depend_on_the_layout():
    from spmdsim.runtime import DTensor, Mesh

    src = SeededTensor((8, 8), "float64", seed=5)

    def body(tmap):
        mesh = Mesh(Layout((2, 4), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_seeded(mesh, mesh.layout(*tmap), src)
        return ops.dropout(x, 0.5, seed=11).gather()

    a = _on_ranks(8, lambda: body(("dp", "tp")))[0]
    b = _on_ranks(8, lambda: body((None, ("tp", "dp"))))[0]
    keep = SeededTensor((8, 8), "float64", seed=11, low=0.0, high=1.0).full() >= 0.5
    assert np.array_equal(a, b) and np.array_equal(a, src.full() * keep * 2.0)
    assert 0.25 < keep.mean() < 0.75


@pytest.mark.parametrize("tmap", [("tp", "dp", None), (None, ("dp", "tp"), None), (("tp", "dp"), None, None)])
def test_dropout_mask_dims_drops_what_the_transposed_twin_drops(tmap):
    """A sequence-first (T, B, D) tensor with mask_dims (1, 0, 2) keeps and scales exactly the entries its
    batch-first twin keeps (spmdsim.models.gpt's activations against its one-process reference), forward and
    gradient, the result C-ordered as every block."""
    from spmdsim.runtime import DTensor, Mesh

    src = SeededTensor((8, 8, 6), "float64", seed=3)  # (T, B, D)

    def body():
        mesh = Mesh(Layout((2, 4), ("dp", "tp")), spmdsim.world())
        x = DTensor.from_seeded(mesh, mesh.layout(*tmap), src).requires_grad_()
        y = ops.dropout(x, 0.3, seed=9, mask_dims=(1, 0, 2))
        ops.sum(y * y).backward()
        # Again (the mask's geometry as kept for this layout) and with the dims as a list (worked out anew).
        again = [ops.dropout(x, 0.3, seed=9, mask_dims=dims).gather() for dims in ((1, 0, 2), [1, 0, 2])]
        return y.gather(), x.grad.gather(), y.local.flags.c_contiguous, again

    keep = (SeededTensor((8, 8, 6), "float64", seed=9, low=0.0, high=1.0).full() >= 0.3).transpose(1, 0, 2)
    want = src.full() * keep * (1.0 / (1.0 - 0.3))  # the product dropout makes, rounded alike
    for y, grad, c_order, again in _on_ranks(8, body):
        assert np.array_equal(y, want) and c_order and all(np.array_equal(a, want) for a in again)
        assert np.allclose(grad, 2 * want * keep / 0.7, rtol=1e-14, atol=0)


@pytest.mark.parametrize("maps", [(("dp", None, "tp", None), None), (("tp", "dp", None, None), ("dp", None)),
                                  ((None, ("dp", "tp"), None, None), None), ((None, "dp", "tp", None), ("dp", "tp"))])
def test_sequence_first_attention_is_the_batch_first_one_transposed(maps):
    """ops.attention(batch_first=False) on (T, B, H, D) operands: the batch-first result and every gradient,
    transposed (causal, dropout drawn over (B, H, Tq, Tk), a padding mask), query rows split or not."""
    from spmdsim.runtime import DTensor, Mesh

    qmap, mask_map = maps
    rng = np.random.default_rng(4)
    qkv = [rng.standard_normal((4, 8, 4, 3)) for _ in range(3)]  # (B, T, H, D)
    g = rng.standard_normal((4, 8, 4, 3))
    pad = np.ones((4, 8), bool)
    pad[1, 5:] = False

    def run(mesh, batch_first):
        L = mesh.layout
        order = (0, 1, 2, 3) if batch_first else (1, 0, 2, 3)
        tmap = tuple(qmap[d] for d in order)
        xs = [DTensor.from_global(mesh, a.transpose(order).copy(), L(*tmap)).requires_grad_() for a in qkv]
        mask = None if mask_map is None else DTensor.from_global(mesh, pad, L(*mask_map))
        y = ops.attention(*xs, causal=True, dropout=0.25, seed=6, mask=mask, batch_first=batch_first)
        ops.sum(y * DTensor.from_global(mesh, g.transpose(order).copy(), y.layout)).backward()
        return [t.gather().transpose(order) for t in [y] + [x.grad for x in xs]]

    def body():
        mesh = Mesh(Layout((2, 4), ("dp", "tp")), spmdsim.world())
        return run(mesh, True), run(mesh, False)

    for batch_first, seq_first in _on_ranks(8, body):
        for a, b in zip(batch_first, seq_first):
            assert np.allclose(a, b, rtol=1e-13, atol=1e-13, equal_nan=True)
        assert np.isfinite(batch_first[0]).all()


def test_causal_mask_blocks_are_each_callers_own():
    """A mask asked for again (kept per layout, rank and shape) is the same block, and a fresh array."""
    from spmdsim.runtime import Mesh

    def body():
        mesh = Mesh(Layout((2, 4), ("dp", "tp")), spmdsim.world())
        layout = mesh.layout(None, "tp")
        first = ops.causal_mask(mesh, (8, 8), layout)
        first.local[...] = True  # the caller's own block: the next mask is not touched
        again = ops.causal_mask(mesh, (8, 8), layout)
        return again.gather(), ops.causal_mask(mesh, (8, 8)).local

    want = np.triu(np.ones((8, 8), bool), 1)
    for split, whole in _on_ranks(8, body):
        assert np.array_equal(split, want) and np.array_equal(whole, want)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), batched=st.booleans(), ta=st.booleans(), tb=st.booleans())
def test_matmul_is_einsum_on_every_layout_matmul_accepts(seed, batched, ta, tb):
    """On any layouts matmul accepts (MindSpore's contract: K split alike), einsum plans the same local
    product: no operand moves, the same output map, pending over the same axes."""
    from spmdsim.programs.infer import infer_matmul

    rng = np.random.default_rng(seed)
    case = random_case("einsum_batched" if batched else "einsum_matmul", int(rng.choice([4, 8])), rng)
    layout = Layout(case.mesh, tuple(f"m{i}" for i in range(len(case.mesh))))
    (xs, ws), (xm, wm) = case.shapes, [list(m) for m in case.maps]
    # Make w's K split x's (and take those axes off w's other dims); its batch dims follow x's.
    k_axes = tuple(xm[-1] or ())
    wm = [None if e is None else tuple(a for a in e if a not in k_axes) or None for e in wm]
    wm[-2] = xm[-1]
    if batched:
        wm[0] = xm[0]
    if set(ax for e in wm[-1:] if e for ax in e) & set(ax for e in xm[:-1] if e for ax in e):
        wm[-1] = None  # N may not reuse an axis of x's batch or M dims
    used_w = {a for e in wm if e for a in e}
    w_partial = () if case.partial[0] else tuple(a for a in case.partial[1] if a not in used_w)
    x, w = layout(*xm, partial=case.partial[0]), layout(*wm, partial=w_partial)
    if set(x.partial) & set(w.split_axes) or set(w.partial) & set(x.split_axes):
        return  # matmul refuses these (resolve first); einsum resolves them
    # The stored (transposed) forms and einsum's letters for them.
    sx = "bkm" if ta else "bmk"
    sw = "bnk" if tb else "bkn"
    if not batched:
        sx, sw = sx[1:], sw[1:]
    swap = lambda seq: (*seq[:-2], seq[-1], seq[-2])  # noqa: E731 - the last two dims exchanged
    xt = layout(*swap(xm), partial=x.partial) if ta else x
    wt = layout(*swap(wm), partial=w.partial) if tb else w
    x_shape, w_shape = (swap(xs) if ta else xs), (swap(ws) if tb else ws)
    mat = infer_matmul(xt, wt, transpose_a=ta, transpose_b=tb, reduce=False)
    ein = infer_einsum(f"{sx},{sw}->{'b' if batched else ''}mn", (xt, wt), (x_shape, w_shape), "float64")
    assert ein.choice.moved == (0, 0)
    assert [t.tensor_map for t in ein.targets] == [xt.tensor_map, wt.tensor_map]
    assert ein.local.tensor_map == mat.local.tensor_map
    # A pending sum over an axis of size 1 is already whole: matmul keeps its name, einsum drops it.
    cut = lambda p: {a for a in p if layout.axis_size(a) > 1}  # noqa: E731
    assert cut(ein.local.partial) == cut(mat.local.partial)


def test_a_scalar_converts_to_a_python_number_without_communication():
    from spmdsim.runtime import DTensor, Mesh

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        w = DTensor.from_global(mesh, np.arange(8.0).reshape(4, 2), mesh.layout("dp", "tp"))
        pending = ops.mean(w * w)
        with pytest.raises(OperatorError, match=re.escape("item(): the scalar is a pending sum over ('dp', 'tp')")):
            pending.item()
        with pytest.raises(OperatorError, match=re.escape("float(x) needs a 0-d DTensor (a scalar such as a loss), "
                                                          "got global shape (4, 2)")):
            float(w)
        with pytest.raises(OperatorError, match=re.escape("float(x): the scalar is a pending sum over ('dp', 'tp')")):
            float(pending)  # (it said item(), a call the program did not make)
        with pytest.raises(OperatorError, match=re.escape("int(x): the scalar is a pending sum")):
            int(pending)
        loss = ops.resolved(pending)
        # Only rank 0 asks, as a training loop's print does: no collective, so no hang.
        return (float(loss), loss.item()) if mesh.rank == 0 else None

    value, item = _on_ranks(4, body)[0]
    assert value == item == (np.arange(8.0) ** 2).mean() and type(value) is float


def test_a_repeated_move_and_result_call_no_layout_hash_or_compare():
    """The executor's programs and the results' checks are keyed by the layout objects (a step passes the
    same ones every time): a repeated redistribution and operator result call no TensorLayout __hash__ or
    __eq__ (Python functions); an equal layout that is another object still finds the same move."""
    from spmdsim.layouts.layout import TensorLayout
    from spmdsim.runtime import DTensor, Mesh, redistribute

    calls = []
    plain_eq, plain_hash = TensorLayout.__eq__, TensorLayout.__hash__

    def counted_eq(a, b):
        calls.append("eq")
        return plain_eq(a, b)

    def counted_hash(a):
        calls.append("hash")
        return plain_hash(a)

    def body():
        mesh = Mesh(Layout((1,), ("tp",)), spmdsim.world())
        src, dst = mesh.layout("tp", None), mesh.layout(None, None)
        x = DTensor.from_global(mesh, np.arange(8.0).reshape(4, 2), src)
        first, total = redistribute(x, dst), x + x
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(TensorLayout, "__eq__", counted_eq)
            patch.setattr(TensorLayout, "__hash__", counted_hash)
            again, summed = redistribute(x, dst), x + x
            counted = list(calls)
            other = redistribute(x, mesh.layout(None, None))  # an equal target, another object
        assert other.layout == dst and np.array_equal(other.local, first.local)
        assert np.array_equal(again.local, first.local) and np.array_equal(summed.local, total.local)
        return counted

    assert _on_ranks(1, body) == [[]]


def test_an_operators_decision_is_kept_per_signature_and_keyed_on_cut_dtype_and_map():
    """ops._common.decided (what pointwise and einsum decide, kept as DTensor's sharding propagation cache):
    a repeated call signature is answered from the table; a layout differing only in its cut rule, a
    dtype or a tensor map is another entry, planned on its own."""
    from spmdsim.nn.ops._common import decided

    even, chunk = Layout((2, 4), ("dp", "tp")), Layout((2, 4), ("dp", "tp"), cut="chunk")
    f64, f32 = np.dtype(np.float64), np.dtype(np.float32)
    args = ((even("dp", "tp"), even("dp", "tp")), ((8, 12), (8, 12)), (f64, f64))
    first = decided(infer_pointwise, "add", *args)
    assert decided(infer_pointwise, "add", *args) is first
    again = decided(infer_pointwise, "add", (even("dp", "tp"), even("dp", "tp")), *args[1:])  # equal, new objects
    assert again[0] == first[0] and again[1:] == first[1:]
    assert first[1:] == (f64, "float64", (True, True))
    on_chunk = decided(infer_pointwise, "add", (chunk("dp", "tp"), chunk("dp", "tp")), *args[1:])
    assert on_chunk is not first and on_chunk[0].out.layout.cut == "chunk"
    narrow = decided(infer_pointwise, "add", args[0], args[1], (f32, f64))
    assert narrow[1:3] == (f64, "float64") and narrow is not first
    moved = decided(infer_pointwise, "add", (even("dp", "tp"), even("tp", "dp")), *args[1:])
    assert moved[3] != (True, True)  # one operand moves to the other's map
    spec = decided(infer_einsum, "ij,jk->ik", (even("dp", None), even(None, "tp")), ((8, 12), (12, 4)),
                   (f32, f32))
    assert spec[1:3] == (f32, "float32") and spec[3] == (True, True) and spec[0].local.partial == ()


@pytest.mark.parametrize("maps", [(("dp", "tp"), ("tp",)), ((None, "dp"), (None,)), (("tp", None), ("dp",))])
def test_floor_divide_and_remainder_are_numpys_with_pytorchs_gradients(maps):
    """x // y and x % y (and their reflected and ufunc spellings) on split operands, integer ids and floats:
    numpy's values; gradients zero for //, dy and -dy * (x // y) for % (PyTorch's remainder backward)."""
    x = np.random.default_rng(0).uniform(-3.0, 3.0, (4, 8))
    y = np.random.default_rng(1).uniform(0.5, 2.0, (8,))
    ids = np.arange(32).reshape(4, 8)

    def run():
        mesh = spmdsim.Mesh(L)
        X = spmdsim.DTensor.from_global(mesh, x, mesh.layout(*maps[0])).requires_grad_()
        Y = spmdsim.DTensor.from_global(mesh, y, mesh.layout(*maps[1])).requires_grad_()
        I = spmdsim.DTensor.from_global(mesh, ids, mesh.layout(*maps[0]))
        ints = [(I // 5).gather(), (I % 3).gather(), (100 // (I + 1)).gather(), (7 % (I + 1)).gather(),
                np.floor_divide(I, 4).gather(), np.remainder(I, 6).gather(), ops.remainder(I, 4).gather()]
        out = ops.remainder(X, Y) * 3.0 + ops.floor_divide(X, Y)
        got = out.gather()
        out.sum().backward()
        return ints, got, X.grad.gather(), Y.grad.gather(), (I // 5).dtype

    ints, got, gx, gy, kind = spmdsim.simulate(8, run)[0]
    want = [ids // 5, ids % 3, 100 // (ids + 1), 7 % (ids + 1), ids // 4, ids % 6, ids % 4]
    assert all(np.array_equal(a, b) for a, b in zip(ints, want)) and kind == ids.dtype
    np.testing.assert_array_equal(got, (x % y) * 3.0 + x // y)
    np.testing.assert_array_equal(gx, np.full_like(x, 3.0))
    np.testing.assert_allclose(gy, (-3.0 * np.floor_divide(x, y)).sum(0), rtol=1e-15)


def test_pytorch_and_numpy_method_spellings_are_spmdsims_operators():
    """x.abs(), x.square(), x.pow(2), x.relu(), x.sigmoid(), x.clamp(min, max), x.clip(lo, hi), x.mm(w),
    x.matmul(w), x.clone(), x.copy(): the operators' values on a split tensor, gradients through clone;
    x.numpy() and x.tolist() refused in one line naming gather()."""
    a = np.arange(-16.0, 16.0).reshape(4, 8)
    w = np.arange(24.0).reshape(8, 3) / 10

    def run():
        mesh = spmdsim.Mesh(L)
        x = spmdsim.DTensor.from_global(mesh, a, mesh.layout("dp", "tp")).requires_grad_()
        W = spmdsim.DTensor.from_global(mesh, w, mesh.layout("tp", None))
        got = [t.gather() for t in (x.abs(), x.square(), x.pow(2), x.relu(), x.sigmoid(), x.clamp(min=-1, max=2),
                                    x.clip(0, 3), x.mm(W), x.matmul(W), x.clone(), x.copy())]
        (x.clone() * 3.0).sum().backward()
        refused = []
        for call in (x.numpy, x.tolist):
            with pytest.raises(OperatorError) as caught:
                call()
            refused.append(str(caught.value))
        return got, x.grad.gather(), refused

    got, grad, refused = spmdsim.simulate(8, run)[0]
    want = [np.abs(a), a * a, a ** 2, np.maximum(a, 0), 1 / (1 + np.exp(-a)), np.clip(a, -1, 2), np.clip(a, 0, 3),
            a @ w, a @ w, a, a]
    for g, e in zip(got, want):
        np.testing.assert_allclose(g, e, rtol=1e-15, atol=1e-15)
    np.testing.assert_array_equal(grad, np.full_like(a, 3.0))
    assert all("x.gather" in text and "\n" not in text for text in refused)


def test_round_floor_ceil_and_sign_are_numpys_with_zero_gradients():
    """np.round(x), np.round(x, 2), round(x), round(x, 1), x.round(3), np.rint, np.around, np.floor, np.ceil,
    np.sign of a split tensor: numpy's values (halves to even; decimals as numpy's x * 10**d rounded, divided);
    no gradient flows through them."""
    a = np.array([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 1.234, -1.2345],
                  [0.0, 3.7, -3.7, 2.0, 1.05, 2.675, -0.125, 9.999]] * 2)

    def run():
        mesh = spmdsim.Mesh(L)
        x = spmdsim.DTensor.from_global(mesh, a, mesh.layout("dp", "tp")).requires_grad_()
        got = [t.gather() for t in (np.round(x), np.round(x, 2), round(x), round(x, 1), x.round(3), np.rint(x),
                                    np.around(x, 1), np.floor(x), np.ceil(x), np.sign(x), ops.round(x, 2))]
        (ops.round(x) + ops.floor(x) * 2.0 + ops.ceil(x) + ops.sign(x) + x).sum().backward()
        # Negative decimals as numpy's (tens, hundreds: they were refused); an integer's keep its dtype
        n = spmdsim.DTensor.from_global(mesh, (a * 10).astype(np.int32), mesh.layout("dp", "tp"))
        got += [t.gather() for t in (ops.round(x * 10.0, -1), np.round(x * 100.0, -2), n.round(-1))]
        with pytest.raises(OperatorError, match=r"^round of a bool DTensor to decimals -1: numpy refuses it"):
            ops.round(x > 0, -1)
        with pytest.raises(OperatorError, match=r"^round: decimals 1.5 must be an integer$"):
            ops.round(x, 1.5)
        return got, x.grad.gather()

    got, grad = spmdsim.simulate(8, run)[0]
    want = [np.round(a), np.round(a, 2), np.round(a), np.round(a, 1), np.round(a, 3), np.rint(a), np.around(a, 1),
            np.floor(a), np.ceil(a), np.sign(a), np.round(a, 2), np.round(a * 10.0, -1), np.round(a * 100.0, -2),
            np.round((a * 10).astype(np.int32), -1)]
    assert got[-1].dtype == np.int32
    for g, e in zip(got, want):
        np.testing.assert_array_equal(g, e)
    np.testing.assert_array_equal(grad, np.ones_like(a))


def test_round_keeps_integers_and_rint_makes_floats_as_numpy():
    ids = np.arange(-4, 12).reshape(2, 8)

    def run():
        mesh = spmdsim.Mesh(L)
        x = spmdsim.DTensor.from_global(mesh, ids, mesh.layout(None, "tp"))
        return [(t.gather(), t.dtype) for t in (np.round(x), ops.round(x), np.rint(x), np.floor(x), np.sign(x))]

    got = spmdsim.simulate(8, run)[0]
    for (value, dtype), want in zip(got, (np.round(ids), np.round(ids), np.rint(ids), np.floor(ids), np.sign(ids))):
        assert dtype == want.dtype and np.array_equal(value, want), (dtype, want.dtype)


def test_masks_value_tests_log1p_expm1_and_numpy_reduction_methods():
    """m & m2, m | m2, m ^ m2, ~m, np.logical_*; np.isnan/isinf/isfinite; m.any(), m.all(axis=1); x.var(axis, ddof)
    and x.std() as numpy's (ddof 0 by default; PyTorch's is 1); np.log1p and np.expm1 with their gradients."""
    a = np.arange(1.0, 33.0).reshape(4, 8)
    nan = a.copy()
    nan[0, 0], nan[1, 1] = np.nan, np.inf

    def run():
        mesh = spmdsim.Mesh(L)
        x = spmdsim.DTensor.from_global(mesh, a, mesh.layout("dp", "tp")).requires_grad_()
        n = spmdsim.DTensor.from_global(mesh, nan, mesh.layout(None, "tp"))
        m, m2 = x > 9.0, x < 20.0
        masks = [t.gather() for t in (m & m2, m | m2, m ^ m2, ~m, np.logical_and(m, m2), np.logical_or(m, m2),
                                      np.logical_xor(m, m2), np.logical_not(m), np.isnan(n), np.isinf(n),
                                      np.isfinite(n), m.any(axis=1), m.all(1), ops.resolved(m.any()),
                                      ops.resolved(m.all()))]
        stats = [t.gather() for t in (ops.resolved(x.var()), x.var(axis=1), x.var(0, ddof=1), x.std(axis=1),
                                      ops.resolved(x.std(ddof=1)))]
        (np.log1p(x) + np.expm1(x / 16.0)).sum().backward()
        return masks, stats, (np.log1p(x).gather(), np.expm1(x / 16.0).gather()), x.grad.gather()

    masks, stats, values, grad = spmdsim.simulate(8, run)[0]
    A, B = a > 9.0, a < 20.0
    want = [A & B, A | B, A ^ B, ~A, A & B, A | B, A ^ B, ~A, np.isnan(nan), np.isinf(nan), np.isfinite(nan),
            A.any(1), A.all(1), A.any(), A.all()]
    assert all(np.array_equal(g, w) for g, w in zip(masks, want))
    for g, w in zip(stats, (a.var(), a.var(1), a.var(0, ddof=1), a.std(1), a.std(ddof=1))):
        np.testing.assert_allclose(g, w, rtol=1e-13)
    np.testing.assert_allclose(values[0], np.log1p(a), rtol=1e-15)
    np.testing.assert_allclose(values[1], np.expm1(a / 16.0), rtol=1e-15)
    np.testing.assert_allclose(grad, 1 / (1 + a) + np.exp(a / 16.0) / 16.0, rtol=1e-14)


@pytest.mark.parametrize("dtype", ["complex128", "complex64"])
def test_the_variance_of_a_complex_tensor_is_real_as_numpys(dtype):
    """ops.var of a complex x was the mean of (x - mean)**2, a complex number (0-10j where numpy's var is 10.0,
    a silent wrong answer); numpy's and PyTorch's is the mean of |x - mean|**2, in the real dtype of x's parts.
    x.std() and np.var(x) go through it too."""
    a = (np.arange(32.0).reshape(4, 8) - 9 + 1j * np.arange(32.0)[::-1].reshape(4, 8) ** 1.5).astype(dtype)

    def run():
        mesh = spmdsim.Mesh(Layout((2, 2), ("dp", "tp")))
        x = spmdsim.DTensor.from_global(mesh, a, mesh.layout("dp", "tp"))
        return [t.gather() for t in (ops.resolved(ops.var(x)), ops.var(x, 1), ops.var(x, 0, correction=1),
                                     x.std(axis=1), ops.resolved(np.var(x, axis=0)))]

    got = spmdsim.simulate(4, run)[0]
    for g, w in zip(got, (a.var(), a.var(1), a.var(0, ddof=1), a.std(1), a.var(0))):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=1e-5 if dtype == "complex64" else 1e-13)


def test_bitwise_ops_of_floats_are_refused_in_one_line_naming_the_op_and_dtype():
    """x & y, x | 1, ~x, np.bitwise_xor of float DTensors (a Python float beside an int one, uint64 beside int64:
    float64) raised numpy's TypeError from the kernel ("ufunc 'bitwise_and' not supported for the input types"),
    naming no dtype; now one DTypeError naming the op, the dtypes and what it takes, the same on every rank."""
    def run():
        mesh = spmdsim.Mesh(L)
        x = spmdsim.DTensor.from_global(mesh, np.arange(32.0).reshape(4, 8), mesh.layout("dp", "tp"))
        i = spmdsim.DTensor.from_global(mesh, np.arange(32).reshape(4, 8), mesh.layout(None, "tp"))
        u = spmdsim.DTensor.from_global(mesh, np.arange(32, dtype=np.uint64).reshape(4, 8), mesh.layout(None, "tp"))
        said = []
        for call in (lambda: x & (x > 3), lambda: ~x, lambda: np.bitwise_xor(i, x), lambda: i | 1.5,
                     lambda: u & i):
            try:
                call()
            except Exception as e:  # noqa: BLE001 - what each rank raised, compared below
                said.append(f"{type(e).__name__}: {e}")
        return said, (i & 6).gather()

    got = spmdsim.simulate(8, run)
    assert all(said == got[0][0] for said, _ in got)
    floats = "numpy's bitwise ops take integer or bool operands, not float64; convert first, e.g. x.astype('int64'), " \
             "or compare for a mask, e.g. x > 0"
    assert got[0][0] == [f"DTypeError: bitwise_and (&) of float64 and bool: {floats}",
                         f"DTypeError: invert (~) of float64: {floats}",
                         f"DTypeError: bitwise_xor (^) of int64 and float64: {floats}",
                         f"DTypeError: bitwise_or (|) of int64 and float64: {floats}",
                         "DTypeError: bitwise_and (&) of uint64 and int64: numpy's bitwise ops take integer or bool "
                         "operands of a common integer dtype, and these promote to float64; convert one first, e.g. "
                         "x.astype('int64')"]
    assert np.array_equal(got[0][1], np.arange(32).reshape(4, 8) & 6)  # integers as numpy's


def test_a_bool_mask_index_is_refused_in_one_line_naming_where():
    def run():
        mesh = spmdsim.Mesh(L)
        x = spmdsim.DTensor.from_global(mesh, np.arange(32.0).reshape(4, 8), mesh.layout("dp", "tp"))
        with pytest.raises(OperatorError) as caught:
            x[x > 3.0]
        return str(caught.value)

    said = spmdsim.simulate(8, run)[0]
    assert said.startswith("x[mask] of a DTensor: a bool mask picks a number of elements that depends on the values")
    assert "ops.where(mask, x, 0.0)" in said and "\n" not in said


def test_attention_takes_q_k_and_v_on_two_mesh_objects_of_one_layout():
    """Every operator takes operands on two Mesh objects of one layout (ops._operands.same_mesh); attention refused
    them ("k is on another mesh than q"). Now its values and gradients are those on one Mesh object, and operands
    on meshes of different layouts are refused naming both."""
    from spmdsim import DTensor, Mesh

    rng = np.random.default_rng(0)
    Q, K, V = (rng.standard_normal((2, 4, 2, 3)) for _ in range(3))

    def body(two):
        m1 = Mesh(Layout((2, 2), ("dp", "tp")))
        m2 = Mesh(Layout((2, 2), ("dp", "tp"))) if two else m1
        q = DTensor.from_global(m1, Q, m1.layout("dp", None, "tp", None)).requires_grad_()
        k, v = (DTensor.from_global(m2, a, m2.layout("dp", None, "tp", None)).requires_grad_() for a in (K, V))
        o = ops.attention(q, k, v, causal=True, dropout=0.1, seed=5)
        ops.sum(o * o).backward()
        other = Mesh(Layout((4,), ("x",)))
        try:
            ops.attention(q, DTensor.from_global(other, K, other.layout(None, "x", None, None)), v)
            refused = None
        except OperatorError as e:
            refused = str(e)
        return [t.gather() for t in (o, q.grad, k.grad, v.grad)], refused

    one, two = spmdsim.simulate(4, lambda: body(False))[0], spmdsim.simulate(4, lambda: body(True))[0]
    assert all(np.array_equal(a, b) for a, b in zip(one[0], two[0]))
    assert two[1] == "attention: k is on mesh Layout(x=4), q on Layout(dp=2, tp=2); expected one mesh"


def refusals(calls, error=OperatorError) -> list:
    """What each call raised (its `error`'s message), None where it returned: each rank's, compared across ranks."""
    said = []
    for call in calls:
        try:
            call()
            said.append(None)
        except error as e:
            said.append(str(e))
    return said


def test_erf_floor_ceil_floor_divide_and_remainder_of_complex_are_refused_in_one_line():
    """ops.erf of a complex DTensor cast it to float in the kernel (numpy's ComplexWarning, the imaginary part
    dropped); np.floor, np.ceil, // and % of one raised numpy's TypeError from the kernel, naming no dtype. Each is
    now one DTypeError naming the op and the dtype, the same on every rank (PyTorch's erf refuses complex, numpy has
    none; numpy's floor, ceil, floor_divide and remainder have no complex loop); exp, sign and round of complex stay
    numpy's."""
    z = (np.arange(64.0) * 1j).reshape(8, 8) + 0.5

    def run():
        mesh = spmdsim.Mesh(L)
        x = spmdsim.DTensor.from_global(mesh, z, mesh.layout("dp", "tp"))
        said = refusals((lambda: ops.erf(x), lambda: np.floor(x), lambda: ops.ceil(x), lambda: x // 2.0,
                         lambda: ops.remainder(ops.abs(x), x)), DTypeError)
        return said, [t.gather() for t in (ops.exp(x), ops.sign(x), ops.round(x, 1))]

    got = spmdsim.simulate(8, run)
    assert all(said == got[0][0] for said, _ in got)
    real = "takes bool, integer or float operands, not complex"
    assert got[0][0] == [f"erf of complex128: PyTorch's erf refuses it (numpy has none); erf {real}",
                         f"floor of complex128: numpy's floor refuses it; floor {real}",
                         f"ceil of complex128: numpy's ceil refuses it; ceil {real}",
                         f"floor_divide (//) of complex128: numpy's floor_divide refuses it; floor_divide (//) {real}",
                         "remainder (%) of float64 and complex128: numpy's remainder refuses it; "
                         f"remainder (%) {real}"]
    for value, want in zip(got[0][1], (np.exp(z), np.sign(z), np.round(z, 1))):
        np.testing.assert_allclose(value, want, rtol=1e-14)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("maps", [("dp", None), (None, "tp"), ("dp", "tp")])
def test_mse_loss_and_the_gradient_of_a_mean_over_no_entries(maps):
    """mse_loss of a (0, 8) tensor gave 0.0 (its divisor was at least 1) where the mean of nothing is NaN, as
    numpy's mean and PyTorch's mse_loss give (and ops.mean here); now NaN, silently as PyTorch's, its gradients
    empty, and the reference's too (it raised ZeroDivisionError). The gradient of ops.mean over no entries divided
    by 0 (numpy's warnings on every rank) to spread over nothing: now the empty gradient, no warning."""
    from spmdsim.references.backward import mse_loss

    def run():
        mesh = spmdsim.Mesh(L)
        y, target = (spmdsim.DTensor.from_global(mesh, np.zeros((0, 8), dtype), mesh.layout(*maps)).requires_grad_()
                     for dtype in (np.float64, np.float32))
        loss = ops.mse_loss(y, target)
        loss.backward()
        x = spmdsim.DTensor.from_global(mesh, np.zeros((0, 8)), mesh.layout(*maps)).requires_grad_()
        with np.errstate(invalid="ignore"):  # the forward's 0 / 0 warns, as numpy's mean of nothing does
            mean = ops.mean(x, 0)
        ops.sum(mean).backward()
        return loss.local, y.grad.gather(), target.grad.gather(), mean.gather(), x.grad.gather()

    loss, dy, dtarget, mean, dx = spmdsim.simulate(8, run)[0]
    assert np.isnan(loss) and loss.dtype == np.float64 and loss.shape == ()
    assert dy.shape == dtarget.shape == dx.shape == (0, 8) and dtarget.dtype == np.float32
    assert np.isnan(mean).all() and mean.shape == (8,)
    value, grad = mse_loss(np.zeros((0, 8)), np.zeros((0, 8)))
    assert np.isnan(value) and grad.shape == (0, 8)


@pytest.mark.parametrize("maps", [("dp", None), (None, "tp"), ("dp", "tp")])
def test_max_and_min_over_a_dim_of_size_0_are_refused_as_argmax_is(maps):
    """ops.max and ops.min over a dim of size 0 gave the identities -inf and inf (over a split dim and a whole one
    alike), where numpy raises ("zero-size array to reduction operation maximum which has no identity") and
    ops.argmax refused; now one OperatorError, the same on every rank, for them, x.max(), np.min(x) and argmax.
    Over the other dim the result is the empty one, as numpy's; x.any() and x.all() of no entries stay numpy's
    False and True, and softmax and log_softmax along a split empty dim (a max along it shifted them) the empty
    result, forward and backward."""
    def run():
        mesh = spmdsim.Mesh(L)
        x = spmdsim.DTensor.from_global(mesh, np.zeros((0, 8)), mesh.layout(*maps)).requires_grad_()
        said = refusals((lambda: ops.max(x), lambda: ops.min(x, 0), lambda: x.max(axis=0), lambda: np.min(x),
                         lambda: ops.argmax(x, 0), lambda: ops.max(x, (0, 1), keepdims=True)))
        t = spmdsim.DTensor.from_global(mesh, np.zeros((8, 0)), mesh.layout(*maps)).requires_grad_()
        soft = ops.softmax(t, 1) + ops.log_softmax(t, 1)
        ops.sum(soft).backward()
        kept = [r.gather() for r in (ops.max(x, 1), ops.min(x, 1), x.any(), x.all(), (x > 0).any(0), soft, t.grad)]
        return said, kept

    got = spmdsim.simulate(8, run)
    assert all(said == got[0][0] for said, _ in got)
    empty = "of an empty tensor (shape (0, 8)) has no answer, as numpy's: it has no entries to take it of"
    dim0 = "over dim 0 of a tensor of shape (0, 8) has no answer, as numpy's: dim 0 has size 0"
    assert got[0][0] == [f"max {empty}", f"min {dim0}", f"max {dim0}", f"min {empty}", f"argmax {dim0}",
                         f"max {empty}"]
    most, least, anything, everything, columns, soft, grad = got[0][1]
    assert most.shape == least.shape == (0,) and anything == np.False_ and everything == np.True_
    assert np.array_equal(columns, np.zeros(8, bool)) and soft.shape == grad.shape == (8, 0)


@pytest.mark.parametrize("maps", [("dp", None), (None, None)])
def test_softmax_along_a_whole_dim_of_size_0_is_the_empty_result(maps):
    """ops.softmax(x, 1) of an (8, 0) x whose dim 1 is whole raised numpy's ValueError from its kernel ("zero-size
    array to reduction operation maximum which has no identity"), where a split dim 1 and log_softmax gave the
    empty result; now the empty result too (numpy's exp(x) / sum(exp(x)): an (8, 0) array), in x's dtype,
    forward and backward, and x.softmax(0) along the dim of size 8 is numpy's as well."""
    def run():
        mesh = spmdsim.Mesh(L)
        x = spmdsim.DTensor.from_global(mesh, np.zeros((8, 0), np.float32), mesh.layout(*maps)).requires_grad_()
        y = ops.softmax(x, 1)
        ops.sum(y * 2.0).backward()
        return y.gather(), x.grad.gather(), x.softmax(0).gather()

    y, grad, along = spmdsim.simulate(8, run)[0]
    want = np.exp(np.zeros((8, 0), np.float32))
    want = want / want.sum(1, keepdims=True)
    assert y.shape == grad.shape == along.shape == want.shape == (8, 0)
    assert y.dtype == grad.dtype == along.dtype == want.dtype == np.float32


@pytest.mark.parametrize("maps", [("dp", None), ("dp", "tp")])
def test_layer_norm_and_rms_norm_over_a_last_dim_of_size_0_are_refused_in_one_line(maps):
    """layer_norm and rms_norm of an (8, 0) x raised ZeroDivisionError from their 1 / n (the whole-row kernel's and
    the split composite's): normalizing over no entries has no mean to take. Now one OperatorError naming the op
    and x's shape, the same on every rank, before any collective; no rows, (0, 8), is the empty result."""
    def run():
        mesh = spmdsim.Mesh(L)
        x = spmdsim.DTensor.from_global(mesh, np.zeros((8, 0)), mesh.layout(*maps))
        said = refusals((lambda: ops.layer_norm(x), lambda: ops.rms_norm(x), lambda: ops.layer_norm(x, kept="megatron"),
                         lambda: ops.rms_norm(x.astype("float32"), kept="megatron")))
        rows = spmdsim.DTensor.from_global(mesh, np.zeros((0, 8)), mesh.layout(*maps)).requires_grad_()
        y = ops.layer_norm(rows) + ops.rms_norm(rows)
        ops.sum(y).backward()
        return said, y.gather(), rows.grad.gather()

    got = spmdsim.simulate(8, run)
    assert all(said == got[0][0] for said, _, _ in got)
    why = "of x of shape (8, 0): its last dim, the one it normalizes over, has size 0 (no entries to take a mean " \
          "of); expected at least 1 entry"
    assert got[0][0] == [f"layer_norm {why}", f"rms_norm {why}"] * 2
    assert got[0][1].shape == got[0][2].shape == (0, 8)


def test_attention_without_heads_head_dim_or_keys_is_refused_and_without_queries_is_empty():
    """attention with a head dim of 0 raised ZeroDivisionError (its 1 / sqrt(0)); with no keys numpy's "zero-size
    array to reduction operation maximum"; with 0 heads "k of global shape (2, 8, 0, 4) does not fit q's (2, 8, 0,
    4)" (the same shapes). Each is now one ShapeError saying which dim of which operand has no entries, before
    any move, for the unfused core, flash, sequence-first operands and ring_attention alike. No query rows (keys
    there) is the empty result, forward and backward, on every path (flash's backward failed on its empty list
    of tiles), k's and v's gradients zero."""
    from spmdsim.nn.ops.ring_attention import ring_attention

    def run():
        mesh = spmdsim.Mesh(L)
        split = mesh.layout("dp", None, "tp", None)
        first = spmdsim.DTensor.from_global(mesh, np.ones((0, 2, 4, 4)), mesh.layout(None, "dp", "tp", None))
        ring = spmdsim.DTensor.from_global(mesh, np.ones((8, 2, 4, 0)), mesh.layout("tp", "dp", None, None))
        said = refusals([lambda s=s, f=f: ops.attention(*(spmdsim.DTensor.from_global(mesh, np.ones(s), split),) * 3,
                                                        flash=f)
                         for s in ((2, 8, 4, 0), (2, 0, 4, 4), (2, 8, 0, 4)) for f in (False, True)]
                        + [lambda: ops.attention(first, first, first, batch_first=False),
                           lambda: ring_attention(ring, ring, ring, "tp")], ShapeError)
        got = []
        for kw in ({}, {"flash": True}, {"recompute": True}):
            q = spmdsim.DTensor.from_global(mesh, np.ones((2, 0, 4, 4)), split).requires_grad_()
            k, v = (spmdsim.DTensor.from_global(mesh, np.ones((2, 8, 4, 4)), split).requires_grad_() for _ in "kv")
            out = ops.attention(q, k, v, **kw)
            ops.sum(out).backward()
            got.append([t.gather() for t in (out, q.grad, k.grad, v.grad)])
        return said, got

    ranks = spmdsim.simulate(8, run)
    assert all(said == ranks[0][0] for said, _ in ranks)
    dim3 = "has a head dim of 0 (dim 3): its scores would be sums of no products, scaled by 1 / sqrt(0); expected " \
           "a head dim of at least 1"
    keys = "each query row's softmax would be over no keys; expected at least 1 key"
    assert ranks[0][0] == [f"attention: q of global shape (2, 8, 4, 0) {dim3}"] * 2 + \
        [f"attention: k of global shape (2, 0, 4, 4) has 0 keys (dim 1): {keys}"] * 2 + \
        ["attention: q of global shape (2, 8, 0, 4) has 0 heads (dim 2); expected at least 1 head"] * 2 + \
        [f"attention: k of global shape (0, 2, 4, 4) has 0 keys (dim 0): {keys}",
         f"ring_attention: q of global shape (8, 2, 4, 0) {dim3}"]
    for out, dq, dk, dv in ranks[0][1]:
        assert out.shape == dq.shape == (2, 0, 4, 4)
        assert np.array_equal(dk, np.zeros((2, 8, 4, 4))) and np.array_equal(dv, np.zeros((2, 8, 4, 4)))


def test_round_to_decimals_past_the_dtypes_powers_of_ten_is_refused_where_numpy_gives_nan():
    """ops.round(x, 400) of float64 raised OverflowError from Python's 10.0 ** 400. numpy's np.round(x, 400) is NaN
    for every entry (x * inf / inf; 0 * inf for a zero), asserted here, not x rounded: now one OperatorError naming
    decimals, the dtype and the range, on every rank, wherever 10**|decimals| overflows the float dtype the scaling
    computes in (float64 past 308 either way, where -400 gave numpy's NaN; float32 past 38). Within the range the
    values are numpy's; an integer rounded past its digits is 0 (numpy's int64 gives -2**63 there)."""
    a = np.arange(64.0).reshape(8, 8) / 7
    with np.errstate(all="ignore"):
        assert np.isnan(np.round(a, 400)).all() and np.isnan(np.round(a, -309)).all()
        assert np.isnan(np.round(a.astype(np.float32), 39)).all()
        want = [np.round(a, 308), np.round(a, -308), np.round(a.astype(np.float32), 38)]

    def run():
        mesh = spmdsim.Mesh(L)
        x = spmdsim.DTensor.from_global(mesh, a, mesh.layout("dp", "tp"))
        said = refusals((lambda: ops.round(x, 400), lambda: np.round(x, -309), lambda: x.astype("float32").round(39)))
        ints = spmdsim.DTensor.from_global(mesh, (a * 1e6).astype(np.int64), mesh.layout("dp", "tp"))
        with np.errstate(over="ignore"):  # numpy's too: x * 1e308 overflows to inf
            kept = [ops.round(x, 308), ops.round(x, -308), ops.round(x.astype("float32"), 38), ops.round(ints, -400)]
        return said, [t.gather() for t in kept]

    got = spmdsim.simulate(8, run)
    assert all(said == got[0][0] for said, _ in got)
    nan = "where numpy's np.round gives NaN for every entry; expected decimals from"
    assert got[0][0] == [f"round: decimals 400 is out of range for float64: 10**400 overflows float64, {nan} -308 to "
                         "308",
                         f"round: decimals -309 is out of range for float64: 10**309 overflows float64, {nan} -308 to "
                         "308",
                         f"round: decimals 39 is out of range for float32: 10**39 overflows float32, {nan} -38 to 38"]
    *values, zeros = got[0][1]
    for value, expected in zip(values, want):
        assert value.dtype == expected.dtype and np.array_equal(value, expected)
    assert zeros.dtype == np.int64 and not zeros.any()
