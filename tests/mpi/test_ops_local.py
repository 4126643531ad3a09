"""transpose, reshape and softmax on DTensors under MPI: each rank's block equals the numpy result's block.

With them (and matmul's transpose_b) attention runs on DTensors end to end:
single-head with the head dim split costs the two Allreduces of its split
contractions, multi-head with the heads split only the output projection's one.
"""
from __future__ import annotations

import numpy as np
import engines
import pytest

from spmdsim import Layout, OperatorError, SeededTensor, ShapeError
from spmdsim.references import forward as reference

pytestmark = pytest.mark.mpi(min_size=2)


def _world():
    return engines.world()  # MPI.COMM_WORLD, or the simulated rank's (tests/engines.py)


@engines.per_rank
def mesh2d():
    """(dp, mp) = (2, size/2) mesh (size/2 = 1 on two ranks)."""
    from spmdsim.runtime import Mesh

    if _world().size % 2:
        pytest.skip("needs an even rank count")
    m = Mesh(Layout((2, _world().size // 2), ("dp", "mp")), _world())
    yield m
    m.close()


def test_transpose_keeps_every_block_and_pending_sums(mesh2d):
    from spmdsim.nn.ops import transpose
    from spmdsim.runtime import DTensor

    mp = mesh2d.layout.device_matrix[1]
    src = SeededTensor((4, 3, 2 * mp), seed=1)
    x = DTensor.from_seeded(mesh2d, mesh2d.layout("dp", None, "mp"), src)
    y = transpose(x, (2, 0, 1))
    assert y.layout == mesh2d.layout("mp", "dp", None) and y.global_shape == (2 * mp, 4, 3)
    assert y.local.flags.c_contiguous
    assert np.array_equal(y.local, src.full().transpose(2, 0, 1)[y.slices])
    assert y.check(reference.transpose(src.full(), (2, 0, 1)), rtol=0, atol=0).passed
    # A pending sum stays pending, and resolves to the transposed sum.
    full = np.arange(4 * 2 * mp, dtype=np.float64).reshape(4, 2 * mp)
    split = mesh2d.layout(None, "mp")
    # Each of the two dp ranks holds half of its block: the addends sum to `full`.
    part = DTensor(mesh2d, full[split.slices(mesh2d.rank, full.shape)] / 2, split.with_partial(("dp",)),
                   full.shape)
    t = transpose(part)
    assert t.layout.partial == ("dp",)
    assert t.check(full.T, rtol=0, atol=0).passed


def test_softmax_along_a_whole_dim_and_along_a_split_one(mesh2d):
    from spmdsim.nn.ops import softmax
    from spmdsim.runtime import DTensor

    src = SeededTensor((4, 6), "float64", seed=2, low=-3, high=3)
    x = DTensor.from_seeded(mesh2d, mesh2d.layout("dp", None), src)
    y = softmax(x)
    assert y.layout == x.layout
    assert y.check(reference.softmax(src.full(), -1)).passed
    assert np.allclose(y.local.sum(axis=-1), 1.0)
    # Along the split dim: the row maximum and the sum of exponentials by Allreduce, no gather.
    z = softmax(x, 0)
    assert z.layout == x.layout
    assert z.check(reference.softmax(src.full(), 0)).passed


def test_attention_block_on_dtensors(mesh2d):
    # x (S, D) replicated; Q, K, V column-parallel over mp; scores = Q K^T (K split: Allreduce),
    # softmax along the whole key dim, P V (split over mp), row-parallel output projection (Allreduce).
    from spmdsim.nn.ops import matmul, softmax, transpose
    from spmdsim.runtime import DTensor, collect_trace

    L = mesh2d.layout
    mp = L.device_matrix[1]
    s, d, h = 8, 6, 4 * mp
    srcs = {name: SeededTensor(shape, "float64", seed, low=-1, high=1)
            for name, shape, seed in (("x", (s, d), 1), ("wq", (d, h), 2), ("wk", (d, h), 3),
                                      ("wv", (d, h), 4), ("wo", (h, d), 5))}
    x = DTensor.from_seeded(mesh2d, L(None, None), srcs["x"])
    wq, wk, wv = (DTensor.from_seeded(mesh2d, L(None, "mp"), srcs[n]) for n in ("wq", "wk", "wv"))
    wo = DTensor.from_seeded(mesh2d, L("mp", None), srcs["wo"])
    with collect_trace() as trace:
        q, k, v = matmul(x, wq), matmul(x, wk), matmul(x, wv)  # (S, H) split over mp, no communication
        scores = matmul(q, transpose(k))                        # contraction over H split: Allreduce
        p = softmax(scores)                                     # (S, S) whole rows on every rank
        out = matmul(matmul(p, v), wo)                          # (S, H) split, then Allreduce
    full = {n: t.full() for n, t in srcs.items()}
    qf, kf, vf = (full["x"] @ full[n] for n in ("wq", "wk", "wv"))
    want = reference.softmax(qf @ kf.T) @ vf @ full["wo"]
    assert out.check(want).passed
    assert np.allclose(scores.local, matmul(q, k, transpose_b=True).local)
    calls = [(e.op, e.axes) for e in trace.entries if e.group_size > 1]
    assert calls == ([("allreduce", ("mp",))] * 2 if mp > 1 else [])


def test_reshape_moves_no_data_and_keeps_every_block(mesh2d):
    from spmdsim.nn.ops import reshape
    from spmdsim.runtime import DTensor, collect_trace

    mp = mesh2d.layout.device_matrix[1]
    src = SeededTensor((4, 6, 4 * mp), seed=3)
    x = DTensor.from_seeded(mesh2d, mesh2d.layout("dp", None, "mp"), src)
    with collect_trace() as trace:
        heads = reshape(x, (4, 6, 2 * mp, 2))            # the split dim becomes (heads, width)
        flat = reshape(heads, (-1, 2 * mp * 2))          # dims 0-1 merge: dp stays on the merged dim
    assert heads.layout == mesh2d.layout("dp", None, "mp", None)
    assert flat.layout == mesh2d.layout("dp", "mp") and flat.global_shape == (24, 4 * mp)
    assert heads.check(src.full().reshape(4, 6, 2 * mp, 2), rtol=0, atol=0).passed
    assert flat.check(src.full().reshape(24, 4 * mp), rtol=0, atol=0).passed
    assert trace.entries == [] or all(e.group_size == 1 for e in trace.entries)
    # A pending sum stays pending through the reshape and resolves to the reshaped sum.
    full = np.arange(4 * 2 * mp, dtype=np.float64).reshape(4, 2 * mp)
    split = mesh2d.layout("dp", None)
    part = DTensor(mesh2d, full[split.slices(mesh2d.rank, full.shape)] / mp, split.with_partial(("mp",)),
                   full.shape)
    r = reshape(part, (4, mp, 2))
    assert r.layout.partial == ("mp",) and r.check(full.reshape(4, mp, 2), rtol=0, atol=0).passed
    # Merging a split minor dim into a whole major one would leave gaps in each rank's block:
    # refused on every rank alike, before any data moves.
    if mp > 1:
        with pytest.raises(OperatorError, match="redistribute x so those dims are whole"):
            reshape(x, (4, 6 * 4 * mp))


def test_multihead_attention_needs_one_allreduce(mesh2d):
    # x (B, S, D) batch over dp; heads split over mp (Megatron): Q/K/V column-parallel, reshape
    # to (B, S, H, W), heads to dim 1, attention per head with no communication, merge the heads
    # back and the row-parallel output projection ends in the one Allreduce over mp.
    from spmdsim.nn.ops import matmul, reshape, softmax, transpose
    from spmdsim.runtime import DTensor, collect_trace

    L = mesh2d.layout
    mp = L.device_matrix[1]
    b, s, d, h, w = 2, 6, 8, 2 * mp, 3
    srcs = {name: SeededTensor(shape, "float64", seed, low=-1, high=1)
            for name, shape, seed in (("x", (b, s, d), 1), ("wq", (d, h * w), 2), ("wk", (d, h * w), 3),
                                      ("wv", (d, h * w), 4), ("wo", (h * w, d), 5))}
    x = DTensor.from_seeded(mesh2d, L("dp", None, None), srcs["x"])
    wq, wk, wv = (DTensor.from_seeded(mesh2d, L(None, "mp"), srcs[n]) for n in ("wq", "wk", "wv"))
    wo = DTensor.from_seeded(mesh2d, L("mp", None), srcs["wo"])
    with collect_trace() as trace:
        q, k, v = (transpose(reshape(matmul(x, t), (b, s, h, w)), (0, 2, 1, 3)) for t in (wq, wk, wv))
        assert q.layout == L("dp", "mp", None, None)
        ctx = matmul(softmax(matmul(q, k, transpose_b=True)), v)
        out = matmul(reshape(transpose(ctx, (0, 2, 1, 3)), (b, s, h * w)), wo)
    f = {n: t.full() for n, t in srcs.items()}
    qf, kf, vf = ((f["x"] @ f[n]).reshape(b, s, h, w).transpose(0, 2, 1, 3) for n in ("wq", "wk", "wv"))
    ctx_f = reference.softmax(qf @ kf.transpose(0, 1, 3, 2)) @ vf
    assert out.layout == L("dp", None, None)
    assert out.check(ctx_f.transpose(0, 2, 1, 3).reshape(b, s, h * w) @ f["wo"]).passed
    calls = [(e.op, e.axes) for e in trace.entries if e.group_size > 1]
    assert calls == ([("allreduce", ("mp",))] if mp > 1 else [])


def test_gelu_and_softmax_refuse_integers_and_astype_converts(mesh2d):
    # GELU/softmax of an integer tensor would be truncated (GELU(1) = 0): refused, as PyTorch does.
    from spmdsim.nn.ops import gelu, relu, softmax
    from spmdsim.runtime import DTensor

    full = np.arange(-8, 8).reshape(4, 4)
    x = DTensor.from_global(mesh2d, full, mesh2d.layout("dp", None))
    for op in (gelu, softmax):
        with pytest.raises(OperatorError, match="needs a floating dtype .* x.astype"):
            op(x)
    assert relu(x).check(np.maximum(full, 0), rtol=0, atol=0).passed  # exact on integers
    y = gelu(x.astype("float64"))
    assert y.local.dtype == np.float64 and y.check(reference.gelu(full.astype(np.float64))).passed
    # A pending sum may widen but not be cut to integers addend by addend.
    part = DTensor(mesh2d, np.full((4, 4), 0.5), mesh2d.layout(None, None).with_partial(("dp",)), (4, 4))
    assert part.astype("float32").check(np.ones((4, 4)), rtol=0, atol=0).passed
    with pytest.raises(ShapeError, match="addends would be truncated"):
        part.astype("int64")


def test_scale_keeps_dtype_layout_and_pending_sums(mesh2d):
    from spmdsim.nn.ops import scale
    from spmdsim.runtime import DTensor

    src = SeededTensor((4, 6), "float32", seed=5)
    x = DTensor.from_seeded(mesh2d, mesh2d.layout("dp", None), src)
    y = scale(x, 0.5)
    assert y.local.dtype == np.float32 and y.layout == x.layout
    assert y.check(src.full() * np.float32(0.5), rtol=0, atol=0).passed
    part = DTensor(mesh2d, np.full((4, 4), 0.5), mesh2d.layout(None, None).with_partial(("dp",)), (4, 4))
    assert scale(part, 3).check(np.full((4, 4), 3.0), rtol=0, atol=0).passed
    ints = DTensor.from_global(mesh2d, np.arange(16).reshape(4, 4), mesh2d.layout("dp", None))
    assert scale(ints, -2).check(-2 * np.arange(16).reshape(4, 4), rtol=0, atol=0).passed
    for bad, match in ((0.5, "would truncate"), ("2", "must be a real number"), (float("nan"), "not NaN")):
        with pytest.raises(OperatorError, match=match):
            scale(ints, bad)


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
@pytest.mark.parametrize("kind", ["max", "min", "argmax", "argmin"])
def test_max_min_and_their_args_over_a_split_dim_keep_a_nan_as_numpy(mesh2d, kind, dtype):
    """MPI's MAX and MIN drop a NaN they compare second (MPICH's a > b ? a : b): a NaN in the last mp rank's
    columns gave max 5.0 for the row numpy makes NaN (simulated ranks' np.maximum kept it). Each element now
    travels with a NaN flag; finite rows are as before. bfloat16 (ml_dtypes', numpy kind 'V') too: its argmax
    over a split dim holding a NaN gave index 2**63 - 1, no rank's value equal to the NaN top."""
    from spmdsim.nn import ops
    from spmdsim.runtime import DTensor

    dtype = np.dtype(pytest.importorskip("ml_dtypes").bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    mp = mesh2d.layout.device_matrix[1]
    src = (np.arange(4.0 * 2 * mp).reshape(4, 2 * mp) % 7).astype(dtype)  # ties across ranks: the first wins
    src[0, -1] = np.nan  # the last mp rank's block
    src[2, 0] = np.nan  # the first's
    x = DTensor.from_global(mesh2d, src, mesh2d.layout("dp", "mp"))
    got = getattr(ops, kind)(x, 1).gather()
    want = getattr(np, kind)(src, 1)
    assert got.dtype == want.dtype and np.array_equal(got.astype(np.float64), want.astype(np.float64),
                                                      equal_nan=True), (got, want)
    whole = getattr(ops, kind)(x).gather()
    assert np.array_equal(whole.astype(np.float64), getattr(np, kind)(src).astype(np.float64), equal_nan=True)
