"""transpose and softmax on DTensors under MPI: each rank's block equals the numpy result's block.

With them (and matmul's transpose_b) an attention block runs on DTensors end to
end; its communication is exactly the two Allreduces of its split contractions.
"""
from __future__ import annotations

import numpy as np
import pytest

from spmdsim import Layout, OperatorError, SeededTensor
from spmdsim import reference

pytestmark = pytest.mark.mpi(min_size=2)


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.fixture
def mesh2d():
    """(dp, mp) = (2, size/2) mesh (size/2 = 1 on two ranks)."""
    from spmdsim.runtime import Mesh

    if _world().size % 2:
        pytest.skip("needs an even rank count")
    m = Mesh(Layout((2, _world().size // 2), ("dp", "mp")), _world())
    yield m
    m.close()


def test_transpose_keeps_every_block_and_pending_sums(mesh2d):
    from spmdsim.ops import transpose
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


def test_softmax_along_a_whole_dim_and_refused_along_a_split_one(mesh2d):
    from spmdsim.ops import softmax
    from spmdsim.runtime import DTensor

    src = SeededTensor((4, 6), "float64", seed=2, low=-3, high=3)
    x = DTensor.from_seeded(mesh2d, mesh2d.layout("dp", None), src)
    y = softmax(x)
    assert y.layout == x.layout
    assert y.check(reference.softmax(src.full(), -1)).passed
    assert np.allclose(y.local.sum(axis=-1), 1.0)
    with pytest.raises(OperatorError, match="no rank holds a whole row"):
        softmax(x, 0)


def test_attention_block_on_dtensors(mesh2d):
    # x (S, D) replicated; Q, K, V column-parallel over mp; scores = Q K^T (K split: Allreduce),
    # softmax along the whole key dim, P V (split over mp), row-parallel output projection (Allreduce).
    from spmdsim.ops import matmul, softmax, transpose
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
