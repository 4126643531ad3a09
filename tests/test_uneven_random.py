"""Seeded random operators and redistributions on uneven shards (cut "chunk"/"balanced"), against numpy.

Each case draws a mesh of 2-8 simulated ranks over 1-3 axes, a cut, global shapes whose sizes need not divide
(sizes 1 to 7: some ranks hold empty blocks, some dims of size 1 are split) and random tensor maps. Every rank
must answer alike: either numpy's value (and, for floating results, the gradient of a random weighted sum
against central differences) or one refusal line raised before any collective. A redistribution between
random layouts must deliver the target's blocks in the source's dtype, with traced bytes equal to its plan's
and, without pending sums, to the lower bound. A few dozen cases, under a few seconds.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh, collect_trace
from spmdsim.nn import ops
from spmdsim.errors import SpmdsimError
from spmdsim.programs.plan import plan_redistribution
from spmdsim.programs.plan.volume import lower_bound

SIZES = (1, 1, 2, 3, 4, 5, 7)


def _mesh(rng):
    n = int(rng.integers(2, 9))
    parts = int(rng.integers(1, 4))
    sizes = [1] * parts
    p, m = 2, n
    while m > 1:
        while m % p:
            p += 1
        sizes[int(rng.integers(parts))] *= p
        m //= p
    return Layout(tuple(sizes), tuple(f"m{i}" for i in range(parts)), str(rng.choice(["chunk", "balanced"])))


def _map(rng, shape, names):
    free = list(names)
    rng.shuffle(free)
    out = []
    for _ in shape:
        entry = []
        while free and rng.random() < 0.6:
            entry.append(free.pop())
        out.append(tuple(entry) or None)
    return tuple(out)


def _shape(rng, lo=1, hi=3):
    return tuple(int(rng.choice(SIZES)) for _ in range(int(rng.integers(lo, hi + 1))))


def _softmax(x, d):
    e = np.exp(x - x.max(d, keepdims=True))
    return e / e.sum(d, keepdims=True)


def _layer_norm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b


def _case(kind, rng):
    """(operand shapes, DTensor program, numpy twin) of one random case of `kind`."""
    if kind == "broadcast":
        shape = _shape(rng)
        other = tuple(1 if rng.random() < 0.3 else s for s in shape[int(rng.integers(0, len(shape) + 1)):])
        return (shape, other), lambda a, b: ops.maximum(a * b, a - b), lambda a, b: np.maximum(a * b, a - b)
    if kind == "einsum":
        i, j, k, b = (int(rng.choice(SIZES)) for _ in range(4))
        return ((b, i, j), (b, j, k)), lambda x, y: ops.einsum("bij,bjk->bik", x, y), lambda x, y: x @ y
    if kind == "softmax":
        shape = _shape(rng)
        d = int(rng.integers(-len(shape), len(shape)))
        return (shape,), lambda x: ops.log_softmax(x, d) * 0.5, lambda x: np.log(_softmax(x, d)) * 0.5
    if kind == "layer_norm":
        shape = _shape(rng, 2)
        return (shape, shape[-1:], shape[-1:]), ops.layer_norm, _layer_norm
    if kind == "reduce":
        shape = _shape(rng)
        dims = tuple(int(v) for v in rng.choice(len(shape), int(rng.integers(1, len(shape) + 1)), replace=False))
        return (shape,), lambda x: ops.var(x, dims) + ops.max(x, dims), lambda x: x.var(dims) + x.max(dims)
    if kind == "slice":
        shape = _shape(rng, 2)
        d = int(rng.integers(len(shape)))
        n = shape[d]
        start = int(rng.integers(0, n))
        length = int(rng.integers(1, n - start + 1))
        index = tuple(slice(None) if e != d else slice(start, start + length) for e in range(len(shape)))
        return ((shape, shape), lambda x, y: ops.concatenate([ops.narrow(x, d, start, length), y], d),
                lambda x, y: np.concatenate([x[index], y], d))
    if kind == "getitem":
        shape = _shape(rng, 2)
        index = tuple(int(rng.integers(-s, s)) if rng.random() < 0.4 else slice(int(rng.integers(0, s)), None)
                      for s in shape)
        return (shape,), lambda x: x[index] * 2.0, lambda x: x[index] * 2.0
    if kind == "stack":
        shape = _shape(rng)
        d = int(rng.integers(0, len(shape) + 1))
        return (shape, shape), lambda x, y: ops.stack([x, y], d), lambda x, y: np.stack([x, y], d)
    if kind == "attention":
        b, t, h, e = (int(rng.choice(SIZES[:5])) for _ in range(4))
        shape = (b, t, h, e)

        def twin(q, k, v):
            s = np.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(e)
            s = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, s)
            return np.einsum("bhqk,bkhd->bqhd", _softmax(s, -1), v)
        return (shape,) * 3, lambda q, k, v: ops.attention(q, k, v, causal=True), twin
    raise AssertionError(kind)


KINDS = ("broadcast", "einsum", "softmax", "layer_norm", "reduce", "slice", "getitem", "stack", "attention")


def _run(layout, maps, arrays, program, upstream, gmap):
    """On every rank: ("ok", y, grads) or ("refused", message, collectives before it)."""
    mesh = Mesh(layout, spmdsim.world())
    with collect_trace() as trace:
        try:
            xs = [DTensor.from_global(mesh, a, layout(*m)).requires_grad_() for a, m in zip(arrays, maps)]
            y = program(*xs)
        except SpmdsimError as e:
            return "refused", str(e), len(trace.entries)
    y.backward(DTensor.from_global(mesh, upstream, layout(*gmap)))
    return "ok", y.gather(), [x.grad.gather() for x in xs]


def _numeric(twin, arrays, upstream, h=1e-6):
    def f(*a):
        y = np.asarray(twin(*a))
        return float(np.sum(np.where(np.isfinite(y), y, 0.0) * upstream))
    out = []
    for k, a in enumerate(arrays):
        g = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            hi, lo = [x.copy() for x in arrays], [x.copy() for x in arrays]
            hi[k][i] += h
            lo[k][i] -= h
            g[i] = (f(*hi) - f(*lo)) / (2 * h)
        out.append(g)
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_random_operators_on_uneven_shards(kind):
    ran = 0
    for seed in range(4):
        rng = np.random.default_rng([seed, KINDS.index(kind)])
        layout = _mesh(rng)
        shapes, program, twin = _case(kind, rng)
        maps = [_map(rng, s, layout.alias_name) for s in shapes]
        arrays = [rng.uniform(-1, 1, s) for s in shapes]
        want = np.asarray(twin(*arrays))
        upstream = rng.uniform(-1, 1, want.shape)
        gmap = _map(rng, want.shape, layout.alias_name)
        results = spmdsim.simulate(layout.num_devices, lambda: _run(layout, maps, arrays, program, upstream, gmap))
        what = (kind, seed, layout, shapes, maps)
        if results[0][0] == "refused":
            assert len({r[:2] for r in results}) == 1 and all(r[0] == "refused" for r in results), what
            assert "\n" not in results[0][1] and results[0][2] == 0, (what, results[0])
            continue
        ran += 1
        numeric = _numeric(twin, arrays, upstream)
        for _, y, grads in results:
            assert y.shape == want.shape and y.dtype == want.dtype, what
            np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12, err_msg=str(what))
            for g, n in zip(grads, numeric):
                np.testing.assert_allclose(g, n, rtol=1e-5, atol=1e-6, err_msg=str(what))
    assert ran >= 2  # most cases run (a refusal is the exception)


def _move(source, target, full):
    mesh = Mesh(source.layout, spmdsim.world())
    x = DTensor.from_global(mesh, full, source)
    with collect_trace() as trace:
        y = spmdsim.redistribute(x, target)
    block = None if target.partial else bool(np.array_equal(y.local, full[target.slices(mesh.rank, full.shape)]))
    return y.dtype.name, block, sum(e.bytes_received for e in trace.entries), y.gather()


def test_random_redistributions_between_uneven_layouts():
    for seed in range(30):
        rng = np.random.default_rng([seed, 99])
        layout = _mesh(rng)
        shape = _shape(rng)
        names = layout.alias_name
        smap, tmap = _map(rng, shape, names), _map(rng, shape, names)
        used = {a for e in smap if e for a in e}
        partial = tuple(a for a in names if a not in used and rng.random() < 0.3)
        dtype = str(rng.choice(["float64", "float32", "int32", "int8"]))
        full = rng.integers(-20, 20, shape).astype(dtype)
        source, target = layout(*smap, partial=partial), layout(*tmap)
        results = spmdsim.simulate(layout.num_devices, lambda: _move(source, target, full))
        plan = plan_redistribution(source, target, shape, dtype)
        what = (seed, layout, shape, source, target, dtype)
        for name, block, _, gathered in results:
            assert name == dtype and block and gathered.dtype == full.dtype, what
            np.testing.assert_array_equal(gathered, full, err_msg=str(what))
        assert [r[2] for r in results] == list(plan.bytes_received), what
        if not partial:
            assert list(plan.bytes_received) == list(lower_bound(layout(*smap), target, shape, full.itemsize)), what
