"""Bodies of the collective-algorithm tests, written against a communicator.

tests/mpi/test_algorithms.py runs them on MPI ranks, tests/test_algorithms_sim.py
on simulated ranks (spmdsim.simulate): the same checks on both engines. Each
returns what went wrong on this rank (empty when all is well).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from spmdsim import Layout
from spmdsim.programs.algorithms import ALGORITHMS, NAMES, parse_name, schedule
from spmdsim.runtime.algorithms import collect_rounds, result_shape, run_collective

DTYPES = ("float64", "int32", "float32")


def builtin(comm: Any, collective: str, x: np.ndarray, root: int) -> np.ndarray:
    """The library's own collective on the same input (blocks along dim 0)."""
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


def mismatches(comm: Any, rows: int = 12) -> list:
    """(name, dtype) where an algorithm's result differs from the library's collective on `comm`."""
    p, me = comm.Get_size(), comm.Get_rank()
    rng = np.random.default_rng(100 + me)
    bad = []
    for name in NAMES:
        collective, _ = parse_name(name)
        for dtype in DTYPES:
            x = (rng.standard_normal((p * rows, 3)) * 1000).astype(dtype)
            root = (p - 1) // 2
            got = run_collective(comm, name, x, root=root)
            want = builtin(comm, collective, x, root)
            summed = collective in ("allreduce", "reduce_scatter") and dtype != "int32"
            rtol = 1e-5 if dtype == "float32" else 1e-12
            same = (got.shape == want.shape and (np.allclose(got, want, rtol=rtol, atol=rtol * 1e3 * p)
                                                 if summed else np.array_equal(got, want)))
            if not same:
                bad.append((name, dtype))
    return bad


def _mesh_cases(mesh: Any, plain: Any, collective: str, axes: Any, x: np.ndarray):
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
        root = 1 % mesh.group_info(axes)[1]
        yield C.bcast(mesh, x.copy(), axes, root=root), C.bcast(plain, x.copy(), axes, root=root)


def mesh_mismatches(comm: Any, dims: tuple[int, int]) -> list:
    """Every algorithm through ``Mesh(..., algorithms=)`` on every axis group of a (dp, mp) mesh.

    Compared with the same mesh's library path, every tensor dim; the trace
    must name the algorithm and carry the schedule's bytes for this rank.
    """
    from spmdsim.runtime import Mesh, collect_trace

    layout = Layout(dims, ("dp", "mp"))
    plain = Mesh(layout, comm)
    x = (np.arange(8 * 8, dtype=np.float64).reshape(8, 8) * 1.37 + 100 * comm.Get_rank())
    bad = []
    # Three meshes: the i-th takes each collective's i-th algorithm (cycling), so all 12 run.
    for i in range(3):
        choice = {c: algos[i % len(algos)] for c, algos in ALGORITHMS.items()}
        mesh = Mesh(layout, comm, algorithms=choice)
        for axes in ("dp", "mp", ("dp", "mp"), ("mp", "dp")):
            g, me = mesh.group_info(axes)[1:]
            for collective, algorithm in choice.items():
                with collect_trace() as tr:
                    pairs = list(_mesh_cases(mesh, plain, collective, axes, x))
                where = (collective, algorithm, axes)
                bad += [where + ("result",) for got, want in pairs
                        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-13)]
                ours = [e for e in tr.entries if e.op == f"{collective}[{algorithm}]"]
                if len(ours) != (len(pairs) if g > 1 else 0):
                    bad.append(where + ("trace", [e.op for e in tr.entries]))
                s = schedule(f"{algorithm}-{collective.replace('_', '-')}", g, x.size, 8,
                             root=1 % g if collective == "bcast" else 0)
                bad += [where + ("bytes",) for e in ours
                        if (e.bytes_sent, e.bytes_received) != (s.bytes_sent()[me], s.bytes_received()[me])]
        mesh.close()
    plain.close()
    return bad


def matmul_on_a_ring(comm: Any) -> tuple[dict, list, int]:
    """A MatMul with K split over every rank, its mesh running Allreduce as a ring.

    Returns (trace counts, names of the schedules run, rounds of the first);
    raises when the result differs from the numpy reference.
    """
    from spmdsim import SeededTensor
    from spmdsim.layouts.dialects.strategy import matmul_layouts
    from spmdsim.nn.ops import matmul
    from spmdsim.references.forward import matmul_region
    from spmdsim.runtime import DTensor, Mesh, collect_trace

    g = comm.Get_size()
    ml = matmul_layouts(f"((1,{g}),({g},1))", g)
    mesh = Mesh(ml.layout, comm, algorithms={"allreduce": "ring"})
    xs, ws = SeededTensor((6, 8 * g), "float64", seed=3), SeededTensor((8 * g, 5), "float64", seed=4)
    x, w = DTensor.from_seeded(mesh, ml.x, xs), DTensor.from_seeded(mesh, ml.w, ws)
    with collect_trace() as tr, collect_rounds() as log:
        out = matmul(x, w)
    out.check(matmul_region(xs, ws, False, False), atol=1e-9).raise_if_failed()
    mesh.close()
    return tr.counts(), [r.schedule.name for r in log.records], len(log.records[0].round_seconds)


def allreduce_max_mismatches(comm: Any) -> list:
    """``collectives.allreduce(..., op="max")`` on every axis group, plain and through each
    emulated Allreduce algorithm, against numpy's maximum over the group; in place too.
    """
    from spmdsim.runtime import Mesh
    from spmdsim.runtime import collectives as C

    p, me = comm.Get_size(), comm.Get_rank()
    layout = Layout((2, p // 2), ("dp", "mp"))
    # Every rank's values, so each rank can work out any group's maximum itself.
    every = [np.random.default_rng(500 + r).standard_normal((5, 7)) for r in range(p)]
    bad = []
    meshes = [Mesh(layout, comm)] + [Mesh(layout, comm, algorithms={"allreduce": a})
                                     for a in ALGORITHMS["allreduce"]]
    for mesh in meshes:
        for axes in ("dp", "mp", ("dp", "mp")):
            names = (axes,) if isinstance(axes, str) else axes
            others = [i for i, a in enumerate(layout.alias_name) if a not in names]
            group = [r for r in range(p)
                     if all(layout.coords(r)[i] == layout.coords(me)[i] for i in others)]
            want = np.max([every[r] for r in group], axis=0)
            got = C.allreduce(mesh, every[me], axes, op="max")
            mine = every[me].copy()
            kept = C.allreduce(mesh, mine, axes, out=mine, op="max")
            where = (sorted(mesh.algorithms or {}), axes)
            if not np.array_equal(got, want):
                bad.append(where + ("result",))
            if kept is not mine or not np.array_equal(mine, want):
                bad.append(where + ("in place",))
        mesh.close()
    return bad


def alltoallv_mismatches(comm: Any) -> list:
    """The pairwise Alltoallv (``Mesh(..., algorithms={"alltoallv": "pairwise"})``) against the same mesh's
    library Alltoallv (runtime.exchange.group_alltoallv) on every axis group of a (dp, mp) mesh, bit for bit,
    with uneven counts, empty messages among them; the trace names the algorithm and counts the bytes that
    left the rank (its own rows stay)."""
    from spmdsim.runtime import Mesh, collect_trace
    from spmdsim.runtime.exchange import group_alltoallv

    p, me = comm.Get_size(), comm.Get_rank()
    layout = Layout((2, p // 2) if p % 2 == 0 else (1, p), ("dp", "mp"))
    plain, mesh = Mesh(layout, comm), Mesh(layout, comm, algorithms={"alltoallv": "pairwise"})
    counts = np.random.default_rng(7).integers(0, 4, (p, p))  # rows world rank i sends world rank j
    counts[::2, 1::2] = 0  # some pairs exchange nothing
    bad = []
    for axes in ("dp", "mp", ("dp", "mp"), ("mp", "dp")):
        group = mesh.group_ranks(axes)
        send_rows = [int(counts[me, r]) for r in group]
        recv_rows = [int(counts[r, me]) for r in group]
        x = np.random.default_rng(900 + me).standard_normal((sum(send_rows), 3))
        with collect_trace() as tr:
            got = group_alltoallv(mesh, x, send_rows, recv_rows, axes, "v")
        want = group_alltoallv(plain, x, send_rows, recv_rows, axes, "v")
        mine = group.index(me)
        if got.shape != want.shape or got.tobytes() != want.tobytes():
            bad.append((axes, "result"))
        sent = (sum(send_rows) - send_rows[mine]) * 24
        received = (sum(recv_rows) - recv_rows[mine]) * 24
        if len(group) > 1 and [(e.op, e.bytes_sent, e.bytes_received) for e in tr.entries] != \
                [("alltoallv[pairwise]", sent, received)]:
            bad.append((axes, "trace", [(e.op, e.bytes_sent, e.bytes_received) for e in tr.entries]))
    mesh.close()
    plain.close()
    return bad
