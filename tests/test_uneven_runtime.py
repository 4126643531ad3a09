"""Uneven shards on simulated ranks: redistribution, the collectives with counts, DTensor, the dry run."""
from __future__ import annotations

import math

import numpy as np

import spmdsim
from spmdsim import Layout
from spmdsim.plan import plan_redistribution

MAPS = (("mp", None), (None, "mp"), (("dp", "mp"), None), ("dp", "mp"), ("mp", "dp"), (None, None),
        (("mp", "dp"), None), (None, ("dp", "mp")))
SHAPE = (10, 7)


def _moves(cut: str):
    layout = Layout((2, 4), ("dp", "mp"), cut)
    return layout, [(layout(*s), layout(*t)) for s in MAPS for t in MAPS if s != t]


def _redistribute_all(cut: str):
    """Every move between MAPS on this rank: (op names traced, bytes received per move, all equal numpy?)."""
    from spmdsim.runtime import DTensor, Mesh, collect_trace, redistribute

    layout, moves = _moves(cut)
    mesh = Mesh(layout, spmdsim.world())
    full = np.arange(math.prod(SHAPE), dtype=np.float64).reshape(SHAPE)
    ops, received, good = [], [], True
    for source, target in moves:
        x = DTensor.from_global(mesh, full, source)
        with collect_trace() as trace:
            y = redistribute(x, target)
        good &= bool(np.array_equal(y.local, full[target.slices(mesh.rank, SHAPE)]))
        good &= bool(np.array_equal(y.gather(), full))
        ops.append(tuple(e.op for e in trace.entries))
        received.append(sum(e.bytes_received for e in trace.entries))
    return ops, received, good


def test_redistribution_on_uneven_shards_matches_numpy_and_the_plan():
    for cut in ("chunk", "balanced"):
        results = spmdsim.simulate(8, lambda: _redistribute_all(cut))
        assert all(good for _, _, good in results)
        _, moves = _moves(cut)
        for i, (source, target) in enumerate(moves):
            plan = plan_redistribution(source, target, SHAPE, "float64")
            # Each rank's traced bytes are the plan's, and the plan's are the lower bound.
            assert [r[1][i] for r in results] == list(plan.bytes_received) == list(plan.lower_bound), (source, target)
        # The collectives with counts ran (traced under their step kinds), beside exchanges (alltoallv).
        traced = {op for ops, _, _ in results for move in ops for op in move}
        assert {"allgather", "alltoall", "alltoallv"} <= traced, traced


def _partial_sums(cut: str):
    """Reduce_scatter with counts and Allreduce of pending sums on uneven shards, against numpy."""
    from spmdsim.runtime import DTensor, Mesh, collect_trace, redistribute

    layout = Layout((2, 4), ("dp", "mp"), cut)
    mesh = Mesh(layout, spmdsim.world())
    full = np.arange(math.prod(SHAPE), dtype=np.float64).reshape(SHAPE)
    out = []
    for target in (layout("mp", None), layout(None, "mp"), layout(("dp", "mp"), None), layout("dp", "mp")):
        # Each rank holds a quarter of the value on its mp coordinate: the sum over mp is `full`.
        x = DTensor.from_global(mesh, full / 4, layout(None, None)).local
        pending = DTensor.from_local(mesh, x, layout(None, None, partial="mp"), SHAPE)
        with collect_trace() as trace:
            y = redistribute(pending, target)
        out.append((bool(np.allclose(y.local, full[target.slices(mesh.rank, SHAPE)], rtol=1e-15, atol=0)),
                    tuple(e.op for e in trace.entries), sum(e.bytes_received for e in trace.entries)))
    return out


def test_pending_sums_reduce_scatter_with_counts():
    results = spmdsim.simulate(8, lambda: _partial_sums("balanced"))
    assert all(ok for rank in results for ok, _, _ in rank)
    # ("mp", None): balanced rows 3,3,2,2 of 7 float64 columns; each member gets 3 addends of its piece.
    assert [rank[0][1] for rank in results] == [("reduce_scatter",)] * 8
    assert [rank[0][2] for rank in results] == [3 * n * 7 * 8 for n in (3, 3, 2, 2)] * 2


def _dry_bytes(cut: str):
    from spmdsim.runtime import DTensor, Mesh, redistribute

    layout, moves = _moves(cut)
    mesh = Mesh(layout)
    for source, target in moves:
        redistribute(DTensor.zeros(mesh, source, SHAPE), target)
    return None


def test_dry_run_counts_each_ranks_own_bytes_on_uneven_shards():
    real = spmdsim.simulate(8, lambda: _redistribute_all("chunk"))
    dry = spmdsim.simulate(8, lambda: _dry_bytes("chunk"), dry_run=True)
    assert [r.bytes_received for r in dry.report.ranks] == [sum(rank[1]) for rank in real]
    assert len({r.bytes_received for r in dry.report.ranks}) > 1  # uneven: ranks differ


def test_from_local_on_an_uneven_cut_asks_for_the_global_shape():
    from spmdsim.errors import ShapeError
    from spmdsim.runtime import DTensor, Mesh

    def body():
        mesh = Mesh(Layout((2,), ("x",), "chunk"), spmdsim.world())
        try:
            DTensor.from_local(mesh, np.zeros((2, 3)), mesh.layout("x", None))
        except ShapeError as exc:
            return str(exc)
        return None

    assert spmdsim.simulate(2, body) == ["from_local on a layout cut 'chunk' needs global_shape= (its shards may "
                                         "differ in size between ranks)"] * 2
