"""Cases for the general operators: a DTensor program, its numpy twin, operands on random layouts.

`run_case` runs on every rank (MPI or simulated): it builds the operands in
their layouts (a pending operand holds its value on one member and zeros on
the others), checks the forward against numpy, runs ``y.backward(G)`` with a
seeded upstream gradient and compares every operand's gathered gradient with
central differences of ``sum(numpy_fn(...) * G)``, in float64 (the ranks share
them: spmdsim.runtime.shared_numeric_grads). Every rank returns the same errors
(the checks are collective).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from spmdsim import Layout, SeededTensor
from spmdsim.nn import ops
from spmdsim.references import norms

__all__ = ["Case", "run_case", "random_case", "CASES"]


@dataclass(frozen=True)
class Case:
    """One op on operands: global shapes, tensor maps, pending axes, and the mesh."""

    name: str
    mesh: tuple[int, ...]
    shapes: tuple[tuple[int, ...], ...]
    maps: tuple[tuple, ...]
    partial: tuple[tuple[str, ...], ...]
    positive: bool = False  # operands must be positive (log, sqrt, pow)
    grads: bool = True
    cut: str = "even"  # the mesh's cutting rule (Layout.cut): "chunk"/"balanced" split dims that do not divide


def _np_softmax(x: np.ndarray, d: int) -> np.ndarray:
    e = np.exp(x - x.max(d, keepdims=True))
    return e / e.sum(d, keepdims=True)


def _np_layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return norms.layer_norm(x, w, b, 1e-5)[0]


def _causal(shape: tuple[int, ...]) -> np.ndarray:
    return np.triu(np.ones(shape[-2:], bool), 1)


def _dropout_ref(x: np.ndarray) -> np.ndarray:
    keep = SeededTensor(x.shape, "float64", seed=7, low=0.0, high=1.0).full() >= 0.3
    return x * keep / 0.7


KEYS = np.array([[True] * 6 + [False] * 2, [True] * 5 + [False] * 3])  # attention's key mask: padding last


def _np_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = False, p: float = 0.0,
                  keys: Optional[np.ndarray] = None) -> np.ndarray:
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(_causal(s.shape), -np.inf, s)
    if keys is not None:
        s = np.where(keys[:, None, None, :], s, -np.inf)
    a = _np_softmax(s, -1)
    if p:
        a = a * (SeededTensor(a.shape, "float64", seed=7, low=0.0, high=1.0).full() >= p) / (1 - p)
    return np.einsum("bhqk,bkhd->bqhd", a, v)


_np_erf = np.vectorize(math.erf, otypes=[np.float64])
LABELS = np.array([0, 3, -100, 1, 2, -100, 3, 0])  # cross-entropy's classes for 8 rows of 4; -100 ignored


def _np_cross_entropy(z: np.ndarray, reduction: str, smooth: float = 0.0) -> np.ndarray:
    """PyTorch's F.cross_entropy(z, LABELS, reduction=..., label_smoothing=smooth) (ignore_index -100) in numpy."""
    lp = z - z.max(1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(1, keepdims=True))
    valid = LABELS != -100
    nll = -lp[np.arange(len(LABELS)), np.where(valid, LABELS, 0)]
    terms = np.where(valid, (1 - smooth) * nll - smooth * lp.mean(1), 0.0)
    return terms if reduction == "none" else terms.sum() / valid.sum()


def _padded_attention(q: Any, k: Any, v: Any) -> Any:
    """ops.attention, causal, with KEYS as its mask laid out with the keys split like q's queries (moved)."""
    from spmdsim import DTensor, TensorLayout

    keys = DTensor.from_global(q.mesh, KEYS, TensorLayout(q.layout.layout, ((), q.layout.tensor_map[1])))
    return ops.attention(q, k, v, causal=True, mask=keys)


def _cross_entropy(z: Any, reduction: str, smooth: float = 0.0) -> Any:
    """ops.cross_entropy of z (resolved here first, as cross_entropy would itself) with LABELS split like its rows."""
    from spmdsim import DTensor, TensorLayout

    z = ops.resolved(z)
    labels = DTensor.from_global(z.mesh, LABELS, TensorLayout(z.layout.layout, z.layout.tensor_map[:1]))
    return ops.cross_entropy(z, labels, reduction=reduction, label_smoothing=smooth)


# name -> (operand shapes, DTensor program, numpy twin, positive operands)
CASES: dict[str, tuple[tuple[tuple[int, ...], ...], Callable, Callable, bool]] = {
    "einsum_matmul": (((4, 8), (8, 4)), lambda a, b: ops.einsum("ij,jk->ik", a, b),
                      lambda a, b: a @ b, False),
    "einsum_batched": (((2, 4, 8), (2, 8, 4)), lambda a, b: ops.einsum("bij,bjk->bik", a, b),
                       lambda a, b: a @ b, False),
    "einsum_scores": (((2, 4, 2, 4), (2, 4, 2, 4)), lambda q, k: ops.einsum("bqhd,bkhd->bhqk", q, k),
                      lambda q, k: np.einsum("bqhd,bkhd->bhqk", q, k), False),
    "einsum_outer_sum": (((4, 8), (8,)), lambda a, v: ops.einsum("ij,j->i", a, v),
                         lambda a, v: a @ v, False),
    "einsum_alone": (((4, 2, 8), (4, 8)), lambda a, b: ops.einsum("ijk,ik->j", a, b),
                     lambda a, b: np.einsum("ijk,ik->j", a, b), False),
    "einsum_ellipsis": (((2, 4, 8), (8, 4)), lambda a, b: ops.einsum("...k,kn->...n", a, b),
                        lambda a, b: a @ b, False),
    "add_broadcast": (((4, 8), (8,)), lambda a, b: a + b, lambda a, b: a + b, False),
    "sub_keepdim": (((4, 8), (4, 1)), lambda a, b: a - b, lambda a, b: a - b, False),
    "mul": (((4, 8), (4, 8)), lambda a, b: a * b, lambda a, b: a * b, False),
    "mul_scalar": (((4, 8),), lambda a: 3.0 * a - 1.0, lambda a: 3.0 * a - 1.0, False),
    "div": (((4, 8), (1, 8)), lambda a, b: a / b, lambda a, b: a / b, True),
    "maximum": (((4, 8), (8,)), lambda a, b: ops.maximum(a, b), lambda a, b: np.maximum(a, b), False),
    "exp_tanh": (((4, 8),), lambda a: ops.exp(ops.tanh(a)), lambda a: np.exp(np.tanh(a)), False),
    "log_sqrt": (((4, 8),), lambda a: ops.log(a) + ops.sqrt(a), lambda a: np.log(a) + np.sqrt(a), True),
    "pow": (((4, 8),), lambda a: a ** 3.0 + (-a), lambda a: a ** 3.0 - a, True),
    "sum": (((4, 8, 2),), lambda a: ops.sum(a, (0, 2)), lambda a: a.sum((0, 2)), False),
    "mean_keepdims": (((4, 8),), lambda a: ops.mean(a, 1, keepdims=True), lambda a: a.mean(1, keepdims=True),
                      False),
    "max": (((4, 8),), lambda a: ops.max(a, 1), lambda a: a.max(1), False),
    "prod": (((4, 8, 2),), lambda a: ops.prod(a, (0, 2)) + a.prod(1, keepdims=True).sum(),
             lambda a: a.prod((0, 2)) + a.prod(1, keepdims=True).sum(), True),
    "min_all": (((4, 8),), lambda a: ops.min(a), lambda a: a.min(), False),
    "softmax_last": (((4, 8),), lambda a: ops.softmax(a, -1), lambda a: _np_softmax(a, -1), False),
    "softmax_first": (((4, 8),), lambda a: ops.softmax(a, 0), lambda a: _np_softmax(a, 0), False),
    "log_softmax": (((4, 8),), lambda a: ops.log_softmax(a, -1),
                    lambda a: np.log(_np_softmax(a, -1)), False),
    "layer_norm": (((4, 8), (8,), (8,)), lambda x, w, b: ops.layer_norm(x, w, b), _np_layer_norm, False),
    "rms_norm": (((4, 8), (8,)), lambda x, w: ops.rms_norm(x, w),
                 lambda x, w: norms.rms_norm(x, w, 1e-6)[0], False),
    "masked_softmax": (((2, 8, 8),), lambda s: ops.softmax(ops.masked_fill(
        s, ops.causal_mask(s.mesh, s.global_shape), -np.inf), -1),
        lambda s: _np_softmax(np.where(_causal(s.shape), -np.inf, s), -1), False),
    "dropout": (((4, 8),), lambda a: ops.dropout(a, 0.3, seed=7), _dropout_ref, False),
    "sigmoid_silu": (((4, 8),), lambda a: ops.sigmoid(a) * ops.silu(a),
                     lambda a: 1 / (1 + np.exp(-a)) * a / (1 + np.exp(-a)), False),
    "sin_cos": (((4, 8),), lambda a: ops.sin(a) + ops.cos(3.0 * a), lambda a: np.sin(a) + np.cos(3.0 * a), False),
    "square_rsqrt": (((4, 8),), lambda a: ops.square(a) + ops.rsqrt(a), lambda a: a * a + 1 / np.sqrt(a), True),
    "clip": (((4, 8), (8,)), lambda a, b: ops.clip(a, -0.5, b), lambda a, b: np.clip(a, -0.5, b), False),
    "clip_low": (((4, 8),), lambda a: ops.clip(a, low=0.2), lambda a: np.maximum(a, 0.2), False),
    # narrow's and concatenate's sliced and joined dims have odd sizes: no random map splits them (local);
    # the *_split and rotate_halves cases' are even, so random maps split them (rows move).
    "narrow": (((4, 8, 5),), lambda a: ops.narrow(a, 2, 1, 3), lambda a: a[:, :, 1:4], False),
    "narrow_negative": (((3, 8),), lambda a: ops.narrow(a, 0, -2, 2), lambda a: a[-2:], False),
    "narrow_split": (((4, 8, 4),), lambda a: ops.narrow(a, 1, 2, 4), lambda a: a[:, 2:6], False),
    "getitem_split": (((8, 8),), lambda a: a[3:7, -1] * a[-1, 4:], lambda a: a[3:7, -1] * a[-1, 4:], False),
    "chunk_split": (((8, 4),), lambda a: ops.chunk(a, 4, 0)[1] - ops.chunk(a, 2, 0)[1][:2],
                    lambda a: a[2:4] - a[4:6], False),
    "concatenate_split": (((4, 8), (4, 4)), lambda a, b: ops.concatenate([a, b, a], 1),
                          lambda a, b: np.concatenate([a, b, a], 1), False),
    "rotate_halves": (((2, 4, 8),), lambda a: ops.concatenate([-a[..., 4:], a[..., :4]], -1) * a,
                      lambda a: np.concatenate([-a[..., 4:], a[..., :4]], -1) * a, False),
    "concatenate": (((3, 4, 2), (5, 4, 2)), lambda a, b: ops.concatenate([b, a], 0),
                    lambda a, b: np.concatenate([b, a], 0), False),
    "concatenate_last": (((4, 8, 3), (4, 8, 1)), lambda a, b: ops.concatenate([a, -b, a], -1),
                         lambda a, b: np.concatenate([a, -b, a], -1), False),
    "var": (((4, 8, 2),), lambda a: ops.var(a, (0, 2)), lambda a: a.var((0, 2)), False),
    "var_keepdims_bessel": (((4, 8),), lambda a: ops.var(a, -1, keepdims=True, correction=1),
                            lambda a: a.var(-1, keepdims=True, ddof=1), False),
    "chunk": (((4, 7),), lambda a: ops.concatenate(ops.chunk(a, 3, 1)[::-1], 1) * a,
              lambda a: np.concatenate(np.array_split(a, [3, 6], 1)[::-1], 1) * a, False),
    "not_equal": (((4, 8), (4, 8)), lambda a, b: ops.where(ops.not_equal(a, b), a, b * 2.0),
                  lambda a, b: np.where(a != b, a, b * 2.0), False),
    "stack": (((4, 8), (4, 8)), lambda a, b: ops.stack([a, b], 1), lambda a, b: np.stack([a, b], 1), False),
    "getitem": (((4, 8, 5),), lambda a: a[..., 1:4][:, None, :, -1], lambda a: a[..., 1:4][:, None, :, -1], False),
    "compare_mask": (((4, 8), (4, 1)), lambda a, b: ops.where(a < b, a, b * 2.0),
                     lambda a, b: np.where(a < b, a, b * 2.0), False),
    "broadcast_to": (((4, 1, 8),), lambda a: ops.broadcast_to(a, (2, 4, 3, 8)),
                     lambda a: np.broadcast_to(a, (2, 4, 3, 8)), False),
    "attention": (((2, 4, 2, 4), (2, 8, 2, 4), (2, 8, 2, 2)), lambda q, k, v: ops.attention(q, k, v),
                  _np_attention, False),
    # grouped-query attention: 2 key/value heads for 4 query heads (numpy: each repeated for its two)
    "attention_grouped": (((2, 4, 4, 4), (2, 8, 2, 4), (2, 8, 2, 2)), lambda q, k, v: ops.attention(q, k, v),
                          lambda q, k, v: _np_attention(q, np.repeat(k, 2, 2), np.repeat(v, 2, 2)), False),
    "attention_causal_dropout": (((2, 8, 2, 4),) * 3, lambda q, k, v: ops.attention(
        q, k, v, causal=True, dropout=0.3, seed=7), lambda q, k, v: _np_attention(q, k, v, True, 0.3), False),
    "erf_gelu_exact": (((4, 8),), lambda a: ops.gelu(a, approximate="none") - ops.erf(a),
                       lambda a: 0.5 * a * (1 + _np_erf(a / np.sqrt(2))) - _np_erf(a), False),
    "cross_entropy_ignore": (((8, 4),), lambda z: _cross_entropy(z, "mean"),
                             lambda z: _np_cross_entropy(z, "mean"), False),
    "cross_entropy_rows": (((8, 4),), lambda z: _cross_entropy(z, "none"),
                           lambda z: _np_cross_entropy(z, "none"), False),
    "cross_entropy_smoothing": (((8, 4),), lambda z: _cross_entropy(z, "mean", 0.1),
                                lambda z: _np_cross_entropy(z, "mean", 0.1), False),
    "attention_padding": (((2, 8, 2, 4),) * 3, _padded_attention,
                          lambda q, k, v: _np_attention(q, k, v, True, keys=KEYS), False),
    "where": (((4, 8), (4, 8)), lambda a, b: ops.where(ops.causal_mask(a.mesh, a.global_shape), a, b),
              lambda a, b: np.where(_causal(a.shape), a, b), False),
}

#: Ops under which an operand may be a pending sum going in (the rule then keeps or resolves it).
PENDING_OK = frozenset(CASES)


def random_case(name: str, ranks: int, rng: np.random.Generator, pending: bool = True, cut: str = "even") -> Case:
    """A case of op `name` on a random mesh of `ranks` devices (1-3 axes) and random layouts.

    An uneven `cut` splits dims whether or not their sizes divide."""
    shapes = CASES[name][0]
    positive = CASES[name][3]
    axes_count = int(rng.integers(1, 4))
    sizes = _factor(ranks, axes_count, rng)
    names = tuple(f"m{i}" for i in range(len(sizes)))
    maps, partial = [], []
    for shape in shapes:
        free = list(names)
        rng.shuffle(free)
        entry_list = []
        for size in shape:
            entry: list[str] = []
            while free and rng.random() < 0.5:
                axis = free[-1]
                group = math.prod(sizes[names.index(a)] for a in entry) * sizes[names.index(axis)]
                if (size % group and cut == "even") or (cut != "even" and size <= 1):
                    break  # an uneven cut splits any size, but a size-1 dim is a broadcast one
                entry.append(free.pop())
            entry_list.append(tuple(entry) if entry else None)
        pend = tuple(a for a in free if pending and rng.random() < 0.25)
        maps.append(tuple(entry_list))
        partial.append(tuple(a for a in names if a in pend))
    return Case(name, sizes, shapes, tuple(maps), tuple(partial), positive, cut=cut)


def _factor(n: int, parts: int, rng: np.random.Generator) -> tuple[int, ...]:
    """`n` as a product of `parts` sizes, each prime factor on a random axis (2s for a power of two)."""
    sizes = [1] * parts
    p = 2
    while n > 1:
        while n % p:
            p += 1
        sizes[int(rng.integers(parts))] *= p
        n //= p
    return tuple(sizes)


def operands(case: Case, seed: int = 0) -> list[np.ndarray]:
    """The global operands (float64; positive ones in [0.5, 2))."""
    out = []
    for k, shape in enumerate(case.shapes):
        low, high = (0.5, 2.0) if case.positive else (-1.0, 1.0)
        out.append(SeededTensor(shape, "float64", seed=100 * seed + k + 1, low=low, high=high).full())
    return out


def _finite(y: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(y), y, 0.0)


def run_case(comm: Any, case: Case, seed: int = 0, meshes: Optional[dict] = None) -> tuple[float, float, Optional[str]]:
    """(forward max abs error, gradient max relative error, the first failing text or None) on every rank.

    `meshes`: Layout -> Mesh over `comm`, kept by the caller across cases (every rank runs the same cases in
    the same order, so all reuse the same mesh and its axis groups); None makes a mesh for this case."""
    from spmdsim.runtime import DTensor, Mesh, shared_numeric_grads

    layout = Layout(case.mesh, tuple(f"m{i}" for i in range(len(case.mesh))), case.cut)
    mesh = meshes.get(layout) if meshes is not None else None
    if mesh is None:
        mesh = Mesh(layout, comm)
        if meshes is not None:
            meshes[layout] = mesh
    L = mesh.layout
    _, program, twin, _ = CASES[case.name]
    arrays = operands(case, seed)
    xs = [DTensor.from_global(mesh, a, L(*m, partial=p)).requires_grad_()
          for a, m, p in zip(arrays, case.maps, case.partial)]
    y = program(*xs)
    expected = np.asarray(twin(*arrays))
    got = y.gather()
    finite = np.isfinite(expected)
    if got.shape != expected.shape or not np.array_equal(finite, np.isfinite(got)):
        return math.inf, math.inf, f"{case}: forward shape or infinities differ"
    forward = float(np.max(np.abs(np.where(finite, got - expected, 0.0)), initial=0.0))
    upstream = SeededTensor(expected.shape, "float64", seed=999, low=-1, high=1).full()
    y.backward(DTensor.from_global(mesh, upstream, L(*([None] * len(expected.shape)))))
    numeric = shared_numeric_grads(mesh, lambda *a: _finite(twin(*a)) * upstream, *arrays)
    worst = 0.0
    for x, want in zip(xs, numeric):
        have = x.grad.gather()
        worst = max(worst, float(np.max(np.abs(have - want) / (1e-6 + np.abs(want)), initial=0.0)))
    note = None if forward < 1e-10 and worst < 1e-5 else f"{case}: forward {forward:.3g}, gradient {worst:.3g}"
    return forward, worst, note
