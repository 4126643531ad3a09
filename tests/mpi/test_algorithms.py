"""Emulated collective algorithms against MPI's own collectives, on groups of 2 to 8 ranks and mesh axes."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from spmdsim import Layout, SpmdsimError
from spmdsim.algorithms import ALGORITHMS, NAMES, parse_name, schedule
from spmdsim.runtime.algorithms import collect_rounds, result_shape, run_collective

pytestmark = pytest.mark.mpi(min_size=2)

WORLD = MPI.COMM_WORLD
# The world cut into groups of these sizes: 8 ranks cover 2, 3, 5, 6 and 8; 4 ranks cover 3 and 4.
SPLITS = {8: [(8,), (2, 6), (3, 5)], 4: [(4,), (3, 1)], 2: [(2,)]}
DTYPES = ("float64", "int32", "float32")


def _builtin(comm, collective, x, root):
    """MPI's own collective on the same input (blocks along dim 0)."""
    out = np.empty(result_shape(collective, x.shape, comm.Get_size()), x.dtype)
    if collective == "allreduce":
        comm.Allreduce(x, out)
    elif collective == "allgather":
        comm.Allgather(x, out)
    elif collective == "reduce_scatter":
        comm.Reduce_scatter_block(x, out)
    elif collective == "alltoall":
        comm.Alltoall(x, out)
    else:
        out[...] = x
        comm.Bcast(out, root)
    return out


def _mismatches(comm, rows=12):
    """(name, dtype) pairs where the emulated algorithm differs from MPI on `comm`, this rank."""
    p, me = comm.Get_size(), comm.Get_rank()
    rng = np.random.default_rng(100 + me)
    bad = []
    for name in NAMES:
        collective, _ = parse_name(name)
        for dtype in DTYPES:
            x = (rng.standard_normal((p * rows, 3)) * 1000).astype(dtype)
            root = (p - 1) // 2
            got = run_collective(comm, name, x, root=root)
            want = _builtin(comm, collective, x, root)
            summed = collective in ("allreduce", "reduce_scatter") and dtype != "int32"
            rtol = 1e-5 if dtype == "float32" else 1e-12
            same = (got.shape == want.shape and (np.allclose(got, want, rtol=rtol, atol=rtol * 1e3 * p)
                                                 if summed else np.array_equal(got, want)))
            if not same:
                bad.append((name, dtype))
    return bad


def test_every_algorithm_equals_mpi_on_each_group_size():
    for sizes in SPLITS.get(WORLD.size, [(WORLD.size,)]):
        starts = np.cumsum((0,) + sizes)
        color = int(np.searchsorted(starts, WORLD.rank, side="right") - 1)
        comm = WORLD.Split(color, WORLD.rank)
        try:
            bad = _mismatches(comm) if comm.Get_size() > 1 else []
        finally:
            comm.Free()
        everyone = WORLD.allgather((sizes[color], bad))
        assert not any(b for _, b in everyone), everyone


def test_rounds_are_recorded_with_their_times():
    with collect_rounds() as log:
        x = np.arange(WORLD.size * 4, dtype=np.float64)
        run_collective(WORLD, "ring-allreduce", x)
        run_collective(WORLD, "bruck-alltoall", x)
    assert [r.schedule.name for r in log.records] == ["ring-allreduce", "bruck-alltoall"]
    for rec in log.records:
        assert len(rec.round_seconds) == len(rec.schedule.rounds) and rec.seconds > 0
    ring = log.records[0]
    assert ring.bytes_sent == 2 * (WORLD.size - 1) * x.nbytes // WORLD.size
    assert "reduce-scatter" in log.format()


def _mesh_cases(mesh, plain, collective, axes, x):
    from spmdsim.runtime import collectives as C

    if collective == "allreduce":
        yield C.allreduce(mesh, x, axes), C.allreduce(plain, x, axes)
        inplace = x.copy()
        yield C.allreduce(mesh, inplace, axes, out=inplace), C.allreduce(plain, x, axes)
    elif collective == "allgather":
        for dim in (0, 1):
            yield C.allgather(mesh, x, axes, dim), C.allgather(plain, x, axes, dim)
    elif collective == "reduce_scatter":
        for dim in (0, 1):
            yield C.reduce_scatter(mesh, x, axes, dim), C.reduce_scatter(plain, x, axes, dim)
    elif collective == "alltoall":
        for dims in ((0, 0), (0, 1), (1, 0)):
            yield C.alltoall(mesh, x, axes, *dims), C.alltoall(plain, x, axes, *dims)
    else:
        yield C.bcast(mesh, x.copy(), axes, root=1 % mesh.group_info(axes)[1]), \
            C.bcast(plain, x.copy(), axes, root=1 % plain.group_info(axes)[1])


def test_mesh_algorithms_on_every_axis_group():
    from spmdsim.runtime import Mesh, collect_trace

    dims = {8: (2, 4), 4: (2, 2)}.get(WORLD.size, (WORLD.size, 1))
    layout = Layout(dims, ("dp", "mp"))
    plain = Mesh(layout)
    x = (np.arange(8 * 8, dtype=np.float64).reshape(8, 8) * 1.37 + 100 * WORLD.rank)
    # Three meshes: the i-th takes each collective's i-th algorithm (cycling), so all 12 run.
    for i in range(3):
        choice = {c: algos[i % len(algos)] for c, algos in ALGORITHMS.items()}
        mesh = Mesh(layout, algorithms=choice)
        for axes in ("dp", "mp", ("dp", "mp"), ("mp", "dp")):
            g, me = mesh.group_info(axes)[1:]
            for collective, algorithm in choice.items():
                with collect_trace() as tr:
                    pairs = list(_mesh_cases(mesh, plain, collective, axes, x))
                for got, want in pairs:
                    assert got.shape == want.shape and np.allclose(got, want, rtol=1e-13), \
                        (collective, algorithm, axes)
                ours = [e for e in tr.entries if e.op == f"{collective}[{algorithm}]"]
                assert len(ours) == (len(pairs) if g > 1 else 0), (collective, algorithm, axes, tr.entries)
                s = schedule(f"{algorithm}-{collective.replace('_', '-')}", g, x.size, 8,
                             root=1 % g if collective == "bcast" else 0)
                for e in ours:  # the real bytes of the schedule that ran
                    assert (e.bytes_sent, e.bytes_received) == (s.bytes_sent()[me], s.bytes_received()[me])
        mesh.close()
    plain.close()


def test_a_matmul_reduces_with_the_ring_round_by_round():
    from spmdsim import SeededTensor
    from spmdsim.dialects.strategy import matmul_layouts
    from spmdsim.ops import matmul
    from spmdsim.reference import matmul_region
    from spmdsim.runtime import DTensor, Mesh, collect_trace

    g = WORLD.size
    ml = matmul_layouts(f"((1,{g}),({g},1))", g)
    xl, wl = ml.x, ml.w
    mesh = Mesh(ml.layout, algorithms={"allreduce": "ring"})
    xs, ws = SeededTensor((6, 8 * g), "float64", seed=3), SeededTensor((8 * g, 5), "float64", seed=4)
    x, w = DTensor.from_seeded(mesh, xl, xs), DTensor.from_seeded(mesh, wl, ws)
    with collect_trace() as tr, collect_rounds() as log:
        out = matmul(x, w)
    out.check(matmul_region(xs, ws, False, False), atol=1e-9).raise_if_failed()
    assert tr.counts() == {"allreduce[ring]": 1}
    assert [r.schedule.name for r in log.records] == ["ring-allreduce"]
    assert len(log.records[0].round_seconds) == 2 * (g - 1)
    mesh.close()


def test_unknown_algorithm_fails_on_every_rank_before_any_collective():
    from spmdsim.runtime import Mesh

    with pytest.raises(SpmdsimError, match="'bruck' is not an algorithm for allreduce"):
        Mesh(Layout((WORLD.size,), ("x",)), algorithms={"allreduce": "bruck"})
    WORLD.Barrier()  # every rank got here: none is left in a collective


def test_collective_command_json_and_show(capsys):
    import json

    from spmdsim.cli.main import main

    p = WORLD.size
    assert main(["collective", "ring-allreduce", "--size", "64K", "--json", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    record = WORLD.bcast(json.loads(out) if WORLD.rank == 0 else None)
    assert record["matches_mpi"] is True and len(record["rounds"]) == 2 * (p - 1)
    assert record["bytes_sent_per_rank"] == 2 * (p - 1) * 65536 // p == record["formula_bytes"]
    assert main(["collective", "bruck-alltoall", "--size", "64K", "--dtype", "int32", "--show",
                 "--repeat", "1"]) == 0
    text = capsys.readouterr().out
    if WORLD.rank == 0:
        assert "result: matches MPI's Alltoall" in text and "bruck +1" in text
        assert max(len(line) for line in text.splitlines()) <= 100
