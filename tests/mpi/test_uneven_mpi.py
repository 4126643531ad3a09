"""Uneven shards under MPI: the collectives with counts and the exchange on a 7 x 5 tensor, and a MatMul.

Runs at any even world size (a (2, size / 2) mesh cut "chunk" and "balanced"); values are small integers
in float64, so every sum is exact in any order. Verdicts are combined over the world.
"""
from __future__ import annotations

import numpy as np
import engines
import pytest

from spmdsim import Layout, SeededTensor
from spmdsim.programs.plan import plan_redistribution

pytestmark = pytest.mark.mpi(min_size=4)

SHAPE = (7, 5)


def _full() -> np.ndarray:
    return SeededTensor(SHAPE, "int64", seed=11, low=-20, high=20).full().astype(np.float64)


@pytest.mark.parametrize("cut", ["chunk", "balanced"])
def test_redistribute_uneven_shards_matches_numpy_at_the_plan_bytes(cut):
    from spmdsim.runtime import DTensor, Mesh, collect_trace, redistribute

    comm = engines.world()
    if comm.size % 2:
        pytest.skip("an even world size")
    layout = Layout((2, comm.size // 2), ("dp", "mp"), cut)
    mesh = Mesh(layout, comm)
    full = _full()
    moves = [(layout("mp", None), layout(None, None)), (layout("mp", None), layout(None, "mp")),
             (layout(("dp", "mp"), None), layout(("mp", "dp"), None)), (layout("dp", "mp"), layout("mp", "dp"))]
    ok = True
    for source, target in moves:
        x = DTensor.from_global(mesh, full, source)
        with collect_trace() as trace:
            y = redistribute(x, target)
        plan = plan_redistribution(source, target, SHAPE, "float64")
        ok &= bool(np.array_equal(y.local, full[target.slices(comm.rank, SHAPE)]))
        ok &= sum(e.bytes_received for e in trace.entries) == plan.bytes_received[comm.rank] \
            == plan.lower_bound[comm.rank]
    # A pending sum over mp onto rows split over mp: Reduce_scatter with counts.
    quarter = DTensor.from_global(mesh, full, layout(None, None)).local / layout.axis_size("mp")
    pending = DTensor.from_local(mesh, quarter, layout(None, None, partial="mp"), SHAPE)
    with collect_trace() as trace:
        y = redistribute(pending, layout("mp", None))
    ok &= bool(np.allclose(y.local, full[layout("mp", None).slices(comm.rank, SHAPE)], rtol=1e-15, atol=0))
    ok &= [e.op for e in trace.entries] == ["reduce_scatter"]
    assert all(comm.allgather(bool(ok)))


def test_row_parallel_matmul_with_an_uneven_contracted_dim():
    from spmdsim.nn import ops
    from spmdsim.runtime import DTensor, Mesh

    comm = engines.world()
    layout = Layout((comm.size,), ("tp",), "balanced")
    mesh = Mesh(layout, comm)
    x, w = _full(), SeededTensor((5, 3), "int64", seed=12, low=-9, high=9).full().astype(np.float64)
    xd = DTensor.from_global(mesh, x, layout(None, "tp")).requires_grad_()
    wd = DTensor.from_global(mesh, w, layout("tp", None)).requires_grad_()
    y = ops.matmul(xd, wd)
    y.backward(DTensor.from_global(mesh, np.ones((7, 3)), y.layout))
    ok = np.array_equal(y.gather(), x @ w) and np.array_equal(wd.grad.gather(), x.T @ np.ones((7, 3)))
    assert all(comm.allgather(bool(ok)))
