"""Uneven shards on simulated ranks: redistribution, the collectives with counts, DTensor, the dry run."""
from __future__ import annotations

import math

import numpy as np
import pytest

import spmdsim
from spmdsim import Layout
from spmdsim.programs.plan import plan_redistribution

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


def _replay_uneven():
    """A captured step of collectives with counts (Reduce_scatter, Alltoallv), replayed on new inputs."""
    from spmdsim.nn import ops
    from spmdsim.runtime import DTensor, Mesh, capture, redistribute

    mesh = Mesh(Layout((2, 3), ("dp", "tp"), "chunk"), spmdsim.world())
    L = mesh.layout
    rng = np.random.default_rng(3)
    xs, ws = [rng.standard_normal((7, 10)) for _ in range(3)], [rng.standard_normal((10, 5)) for _ in range(3)]

    def step(x, w):  # K = 10 over tp (4, 4, 2), then 5 columns over tp (2, 2, 1), then 7 rows over tp
        return redistribute(ops.matmul(x, w, out_layout=L(None, "tp")), L("tp", None))

    x = DTensor.from_global(mesh, xs[0], L(None, "tp"))
    w = DTensor.from_global(mesh, ws[0], L("tp", None))
    graph = capture(step, x, w)
    out = []
    for k in (1, 2):
        z = graph(DTensor.from_global(mesh, xs[k], L(None, "tp")), DTensor.from_global(mesh, ws[k], L("tp", None)))
        want = (xs[k] @ ws[k])[L("tp", None).slices(mesh.rank, (7, 5))]
        out.append(bool(np.allclose(z.local, want, rtol=1e-12, atol=1e-12)))
    return out


def test_a_replayed_step_reruns_the_collectives_with_counts():
    assert spmdsim.simulate(6, _replay_uneven) == [[True, True]] * 6


def test_an_allreduce_of_uneven_blocks_is_planned_at_the_bytes_it_traces():
    """P -> B over an axis of 3 of a block of 7 float64 (56 bytes): the trace's ring Allreduce moves
    2 * 2 * 56 // 3 = 74 bytes, the even formula's too; the uneven plan took 2 * 2 * 7 // 3 = 9 elements,
    72 bytes, so a plan's bytes and the run's disagreed wherever a pending sum met an uneven split."""
    from spmdsim.runtime import DTensor, Mesh, collect_trace, redistribute

    layout = Layout((3, 2), ("a", "b"), cut="chunk")
    source, target, shape = layout(None, "b", partial="a"), layout(None, None), (7, 1)

    def body():
        mesh = Mesh(layout, spmdsim.world())
        x = DTensor.from_local(mesh, np.ones(source.local_shape(shape, mesh.rank)), source, shape)
        with collect_trace() as trace:
            y = redistribute(x, target)
        return sum(e.bytes_received for e in trace.entries), y.local.sum()

    results = spmdsim.simulate(6, body)
    plan = plan_redistribution(source, target, shape, "float64")
    assert [r[0] for r in results] == list(plan.bytes_received) == [74, 56] * 3
    assert [r[1] for r in results] == [21.0] * 6  # each of 7 rows summed over the 3 ranks of "a"


def test_from_local_blocks_of_different_sizes_are_caught_by_the_guard(monkeypatch):
    """Without global_shape each rank works the global shape out from its own block: blocks of (2 + rank, 2)
    gave ranks global shapes (4, 4) to (10, 4) and a sum of 28 on every rank, silently. The divergence guard
    (SPMDSIM_CHECK=1) now compares them where from_local makes them; without it, nothing is sent."""
    from spmdsim.errors import RuntimeMismatchError
    from spmdsim.runtime import DTensor, Mesh, collect_trace, debug

    def body():
        mesh = Mesh(Layout((2, 2), ("a", "b")), spmdsim.world())
        with collect_trace() as trace:
            x = DTensor.from_local(mesh, np.ones((2 + mesh.rank % 2, 2)), mesh.layout("a", "b"))
        return x.global_shape, len(trace.entries)

    # The simulated ranks take the process's settings when they start, read from the environment on first use.
    monkeypatch.delenv("SPMDSIM_CHECK", raising=False)
    monkeypatch.delenv("SPMDSIM_WATCHDOG", raising=False)
    debug._reset()
    try:
        assert spmdsim.simulate(4, body) == [((4, 4), 0), ((6, 4), 0)] * 2
        monkeypatch.setenv("SPMDSIM_CHECK", "1")
        debug._reset()
        with pytest.raises(RuntimeMismatchError, match=r"rank 1 calls from_local operands .*'the global shape from "
                                                       r"its block \(6, 4\)"):
            spmdsim.simulate(4, body)
    finally:
        monkeypatch.delenv("SPMDSIM_CHECK")
        debug._reset()


def test_a_reduce_scatter_with_counts_keeps_an_integer_dtype():
    """The Reduce_scatter with counts summed the addends with numpy's sum, which widens int32 (and int8, int16,
    uint8) to int64: a pending int32 sum redistributed onto uneven rows came back int64, and the next step moved
    twice the bytes its plan counted (3 rows over 4 chunk shards, then an Alltoall: rank 0 traced 280 B, its plan
    220). The sum now stays in the operands' dtype, as MPI's Reduce_scatter keeps it."""
    from spmdsim.runtime import DTensor, Mesh, collect_trace, redistribute

    layout = Layout((1, 2, 2), ("a", "b", "c"), cut="chunk")
    source, target, shape = layout(None, "b", None, partial="c"), layout(("a", "c", "b"), None, None), (3, 7, 5)
    full = np.arange(math.prod(shape)).reshape(shape) - 50

    def body():
        mesh = Mesh(layout, spmdsim.world())
        out = []
        for dtype in ("int32", "int8", "uint8", "float32"):
            # The value on the first member of each "c" pair, zeros on the other (the sum is `full`).
            x = DTensor.from_global(mesh, full.astype(dtype), source)
            with collect_trace() as trace:
                y = redistribute(x, target)
            out.append((y.dtype.name, y.local.dtype.name, sum(e.bytes_received for e in trace.entries),
                        bool(np.array_equal(y.gather(), full.astype(dtype)))))
        return out

    results = spmdsim.simulate(4, body)
    for dtype, got in zip(("int32", "int8", "uint8", "float32"), zip(*results)):
        plan = plan_redistribution(source, target, shape, dtype)
        assert [g[:2] for g in got] == [(dtype, dtype)] * 4
        assert [g[2] for g in got] == list(plan.bytes_received)
        assert all(g[3] for g in got)
    assert list(plan_redistribution(source, target, shape, "int32").bytes_received) == [220, 140, 200, 60]


def test_dtensor_constructors_cut_nested_shards_as_dtensor():
    """5 rows on (Shard(0), Shard(0)) over 2 x 4: DTensor's ranks hold rows [0], [1], [2], [], [3], [4], [], []
    (spmdsim's held [0], [1], [2], [3], [4], [], [], []). from_global, from_seeded and from_local (with
    global_shape) build those blocks; gather and a move to (Replicate(), Shard(0)) (DTensor: rows 0-1, 2-3,
    4, none per column) give the rows back."""
    from spmdsim import SeededTensor
    from spmdsim.layouts.dialects import placements_to_layout
    from spmdsim.runtime import DTensor, Mesh, redistribute

    full = np.arange(10.0).reshape(5, 2)
    seeded = SeededTensor((5, 2), "float64", seed=3)

    def body():
        mesh = Mesh(Layout((2, 4), ("dp", "tp"), cut="chunk"), spmdsim.world())
        nested = placements_to_layout("S(0), S(0)", mesh, 2)
        x = DTensor.from_global(mesh, full, nested)
        s = DTensor.from_seeded(mesh, nested, seeded)
        y = DTensor.from_local(mesh, x.local.copy(), nested, global_shape=(5, 2))
        moved = redistribute(y, placements_to_layout("R, S(0)", mesh, 2))
        return (x.local[:, 0].tolist(), np.array_equal(s.local, seeded.full()[s.slices]), s.slices[0],
                np.array_equal(y.gather(), full), moved.local[:, 0].tolist())

    got = spmdsim.simulate(8, body)
    assert [r[0] for r in got] == [[0.0], [2.0], [4.0], [], [6.0], [8.0], [], []]
    assert all(r[1] and r[3] for r in got)
    assert [(r[2].start, r[2].stop) for r in got] == [(0, 1), (1, 2), (2, 3), (3, 3), (3, 4), (4, 5), (5, 5), (5, 5)]
    assert [r[4] for r in got] == [[0.0, 2.0], [4.0, 6.0], [8.0], []] * 2


def test_a_layout_cut_otherwise_than_its_mesh_names_the_mesh_to_make():
    """placements_to_layout(..., cut="chunk") on an even mesh (what its docstring says for torch.chunk's rule) was
    refused naming both layouts only; the line now says the mesh to make, and any other difference is as before."""
    from spmdsim import DTensor, LayoutError, Mesh, simulate
    from spmdsim.layouts.dialects import placements_to_layout

    def main(layout):
        mesh = Mesh(Layout((2, 4), ("dp", "tp")))
        DTensor.from_global(mesh, np.ones((6, 8)), layout(mesh))

    with pytest.raises(LayoutError) as caught:
        simulate(8, main, lambda mesh: placements_to_layout("R, S(0)", mesh, 2, cut="chunk"))
    assert str(caught.value) == ("tensor layout is over Layout(dp=2, tp=4, cut=chunk) but the mesh is Layout(dp=2, "
                                 "tp=4); a mesh cuts its tensors one way: make it Mesh(Layout((2, 4), ('dp', 'tp'), "
                                 "cut='chunk')) to cut by 'chunk'")
    with pytest.raises(LayoutError) as caught:
        simulate(8, main, lambda mesh: Layout((4, 2), ("dp", "tp"))("tp", None))
    assert str(caught.value) == "tensor layout is over Layout(dp=4, tp=2) but the mesh is Layout(dp=2, tp=4)"

    def fixed():
        mesh = Mesh(Layout((2, 4), ("dp", "tp"), cut="chunk"))
        return DTensor.from_global(mesh, np.arange(48.0).reshape(6, 8),
                                   placements_to_layout("R, S(0)", mesh, 2)).local.shape

    assert simulate(8, fixed) == [(2, 8), (2, 8), (2, 8), (0, 8)] * 2
    with pytest.raises(spmdsim.ShapeError) as caught:  # DTensor's placements of a dim the shards do not divide
        simulate(8, main, lambda mesh: placements_to_layout("R, S(0)", mesh, 2))
    assert str(caught.value) == ("tensor (6, 8): dim 0 of size 6 is not divisible by 4 shards over ('tp',); a mesh of "
                                 "Layout((2, 4), ('dp', 'tp'), cut='balanced') cuts it unevenly (shards differing "
                                 "by at most one), or of cut='chunk' as DTensor's torch.chunk does")


@pytest.mark.parametrize("make", ["from_global", "from_seeded", "full", "zeros", "redistribute"])
def test_a_size_an_even_mesh_cannot_cut_names_the_cuts_that_can(make):
    """Distributing a (10, 4) tensor with Shard(0) over 4 ranks: from_seeded, full, zeros, ones and redistribute
    named no way out ("... is not divisible by 4 shards over ('dp',)"), from_global only DTensor's torch.chunk
    rule. Each names the mesh's Layout call with cut="balanced" (the pieces 3, 3, 2, 2), and "chunk"."""
    from spmdsim import DTensor, Mesh, SeededTensor, ShapeError, redistribute
    from spmdsim.layouts.dialects import Shard, placements_to_layout

    def body(cut):
        mesh = Mesh(Layout((4,), ("dp",), cut=cut), spmdsim.world())
        layout = placements_to_layout([Shard(0)], mesh, 2)
        return {"from_global": lambda: DTensor.from_global(mesh, np.zeros((10, 4)), layout),
                "from_seeded": lambda: DTensor.from_seeded(mesh, layout, SeededTensor((10, 4), "float64", 1)),
                "full": lambda: DTensor.full(mesh, layout, (10, 4), 1.0),
                "zeros": lambda: DTensor.zeros(mesh, layout, (10, 4)),
                "redistribute": lambda: redistribute(DTensor.zeros(mesh, mesh.layout(None, None), (10, 4)), layout),
                }[make]().local.shape

    with pytest.raises(ShapeError) as caught:
        spmdsim.simulate(4, lambda: body("even"))
    assert str(caught.value) == ("tensor (10, 4): dim 0 of size 10 is not divisible by 4 shards over ('dp',); a mesh "
                                 "of Layout((4,), ('dp',), cut='balanced') cuts it unevenly (shards differing by at "
                                 "most one), or of cut='chunk' as DTensor's torch.chunk does")
    assert spmdsim.simulate(4, lambda: body("balanced")) == [(3, 4), (3, 4), (2, 4), (2, 4)]
    assert spmdsim.simulate(4, lambda: body("chunk")) == [(3, 4), (3, 4), (3, 4), (1, 4)]
