"""Common numpy idioms on DTensors against numpy on the global array, drawn at random (a fixed seed, a few dozen
cases): each idiom's value and dtype on a random dtype and layout (split, whole, over two axes, pending), numpy's
refusals refused too (one line, a spmdsim error), and the float64 gradient against central differences.

Found by it: np.einsum('ij->i') of int32 gave int64 (numpy keeps int32), x.argmax() of a mask, np.round(x, -1),
+x and a 1-d operand of @ were refused (numpy computes them), x.any() of a pending sum was refused as a truncating
astype, a pending sum over 0.0 or times inf was NaN where numpy's is inf.
"""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh, SpmdsimError
from spmdsim.references.backward import numeric_grads

IDIOMS = {  # name -> (the idiom on an array or a DTensor, whether it has a gradient)
    "pow2": (lambda x: x ** 2, True), "pow3": (lambda x: x ** 3, True), "sqrt_abs": (lambda x: abs(x) ** 0.5, True),
    "rpow": (lambda x: 2.0 ** x, True), "row_product": (lambda x: x * x[0], True),
    "centred": (lambda x: x - x.mean(0), True), "scaled": (lambda x: x / (abs(x).sum(1, keepdims=True) + 1), True),
    "where": (lambda x: np.where(x > 0, x, 0.5), True), "clip": (lambda x: x.clip(-1, 1), True),
    "relu": (lambda x: np.maximum(x, 0), True), "prod_rows": (lambda x: x.prod(1), True),
    "prod": (lambda x: x.prod(), True), "ravel": (lambda x: x[:, :2].ravel() * 2, True),
    "join": (lambda x: np.concatenate([x, x[:1]], 0) * 3, True), "var": (lambda x: x.var(0), True),
    "std": (lambda x: x.std(), True), "max": (lambda x: x.max(1), True), "norm": (lambda x: np.linalg.norm(x), True),
    "round_tens": (lambda x: np.round(x * 10, -1), False), "einsum": (lambda x: np.einsum("ij->i", x), True),
    "sum_last": (lambda x: x.sum(-1), True), "mean": (lambda x: x.mean(), True), "any": (lambda x: x.any(0), False),
    "argmax": (lambda x: x.argmax(1), False), "big": (lambda x: x < 2 ** 40, False),
    "floordiv": (lambda x: x // 2, False), "mod": (lambda x: x % 3, False),
    "smooth": (lambda x: np.tanh(x) * np.exp(-x), True), "cols": (lambda x: x[:, 1:3].sum(0), True),
    "stack": (lambda x: np.stack([x, -x]).sum(0), True), "swap": (lambda x: x.swapaxes(0, 1) * 1.5, True),
    "outer": (lambda x: np.expand_dims(x, 0) * x[:, None], True), "square": (lambda x: x * x, True),
    "matvec": (lambda x: x @ x[0], True), "vecmat": (lambda x: x[:, 0] @ x, True),
    "dot": (lambda x: np.dot(x[0], x[1]), True), "positive": (lambda x: +x, True),
    "over_zero": (lambda x: x / 0.0, False), "times_inf": (lambda x: np.inf * x, False),
}
#: spmdsim's own refusals where numpy computes (docs/reference/operators.md): a reshape whose blocks would not stay
#: blocks, a sum of bools over a letter (numpy's einsum of bools is an or; a split letter would leave a pending count).
REFUSED = {"ravel": "OperatorError: ravel: reshape (4, 2) -> (8,) of x mapped",
           "einsum": "OperatorError: einsum 'ij->i': the operands have dtype 'bool', but it sums over 'j'"}
DTYPES = {"float64": lambda a: a, "float32": lambda a: a.astype(np.float32),
          "int32": lambda a: np.round(a * 3).astype(np.int32), "uint8": lambda a: np.round(abs(a) * 3).astype(np.uint8),
          "bool": lambda a: a > 0.2}
MAPS = [(("x", "y"), ()), ((None, None), ()), ((("x", "y"), None), ()), (("x", None), ("y",)), ((None, "y"), ()),
        (("y", "x"), ())]


#: The cases that found a defect, kept whatever the draw.
FOUND = [("einsum", "int32", MAPS[0]), ("einsum", "uint8", MAPS[1]), ("argmax", "bool", MAPS[0]),
         ("any", "float64", MAPS[3]), ("round_tens", "int32", MAPS[0]), ("over_zero", "float64", MAPS[3]),
         ("times_inf", "float32", MAPS[3]), ("positive", "int32", MAPS[0]), ("matvec", "float64", MAPS[0]),
         ("vecmat", "uint8", MAPS[1]), ("dot", "float64", MAPS[3])]


def _cases(seed: int, count: int) -> list:
    """`count` (idiom, dtype, (map, partial)): FOUND, then drawn from a fixed seed, every idiom once at least."""
    rng = np.random.default_rng(seed)
    names = list(IDIOMS) + [str(n) for n in rng.choice(list(IDIOMS), count - len(IDIOMS) - len(FOUND))]
    return FOUND + [(name, "float64" if k % 3 == 0 else str(rng.choice(list(DTYPES))),
                     MAPS[int(rng.integers(len(MAPS)))]) for k, name in enumerate(names)]


def _outcome(idiom, x):
    try:
        with np.errstate(all="ignore"):  # numpy's warnings of x / 0.0 (spmdsim's kernels say nothing either)
            return idiom(x), None
    except Exception as e:  # noqa: BLE001 - numpy's and spmdsim's refusals, compared below
        return None, e


@pytest.mark.parametrize("cut, devices", [("even", (2, 2)), ("chunk", (3, 2))])
def test_numpy_idioms_on_dtensors_match_numpy(cut, devices):
    base = np.random.default_rng(11).uniform(-2, 2, (4, 6))
    cases = _cases({"even": 1, "chunk": 2}[cut], 60)

    def body():
        mesh = Mesh(Layout(devices, ("x", "y"), cut=cut))
        out = []
        for name, dtype, (tmap, partial) in cases:
            a = DTYPES[dtype](base)
            if partial and dtype == "bool":
                partial = ()  # no pending sum of bools
            x = DTensor.from_global(mesh, a, mesh.layout(*tmap, partial=partial))
            grad = IDIOMS[name][1] and dtype == "float64"
            if grad:
                x.requires_grad_()
            y, error = _outcome(IDIOMS[name][0], x)
            if error is not None:
                out.append((None, f"{type(error).__name__}: {error}", isinstance(error, SpmdsimError), None))
                continue
            if grad:  # the upstream gradient seeded by the case's position, as the central differences' below
                up = np.random.default_rng(len(out)).uniform(-1, 1, y.global_shape)
                y.backward(DTensor.from_global(mesh, up, mesh.layout(*[None] * len(up.shape))))
            out.append((y.dtype, y.gather(), None, x.grad.gather() if grad else None))
        return out

    results = spmdsim.simulate(int(np.prod(devices)), body)
    bad = []
    for k, ((name, dtype, layout), (got_dtype, got, refused, grad)) in enumerate(zip(cases, results[0])):
        a = DTYPES[dtype](base)
        want, error = _outcome(IDIOMS[name][0], a)
        where = f"{name} of {dtype} on {layout}"
        if error is not None or got_dtype is None:
            if error is None and not (refused and got.startswith(REFUSED.get(name, "?"))) or not refused:
                bad.append(f"{where}: numpy {error!r}, spmdsim {got}")  # numpy computes it, or no one line
            continue
        want = np.asarray(want)
        if got_dtype != want.dtype or got.shape != want.shape:
            bad.append(f"{where}: {got_dtype}{got.shape} where numpy gives {want.dtype}{want.shape}")
        elif not np.allclose(got.astype(float), want.astype(float), rtol=1e-5 if dtype == "float32" else 1e-12,
                             atol=1e-12, equal_nan=True):
            bad.append(f"{where}: values differ by {np.max(np.abs(got.astype(float) - want)):.3g}")
        elif grad is not None:  # float64: against central differences of sum(idiom(a) * up)
            up = np.random.default_rng(k).uniform(-1, 1, want.shape)
            (numeric,) = numeric_grads(lambda g: IDIOMS[name][0](g) * up, base.copy())
            if not np.allclose(grad, numeric, rtol=1e-6, atol=1e-7):
                bad.append(f"{where}: gradient differs by {np.max(np.abs(grad - numeric)):.3g}")
    assert not bad, "\n".join(bad)
