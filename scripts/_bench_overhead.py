"""bench.py's overhead suite: microseconds of Python per call on the hot paths, spmdsim vs raw."""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Optional

import numpy as np

from spmdsim import Layout, SeededTensor
from spmdsim.tools.cli.collective_timing import Waiter

from _bench_harness import peak_rss

__all__ = ["overhead_records", "overhead_table"]


# -- Python overhead of the hot paths ------------------------------------------------------------
def _per_call(fn: Callable[[], Any], loops: int, rounds: int = 5) -> float:
    """Best-of-rounds seconds per call (the least disturbed by other processes)."""
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter() - t0) / loops)
    return best


class _Pieces:
    """What the hot paths run on: a 1-d mesh over "x" of every rank, tiny messages, a cached plan and a K-split
    MatMul's operands, and the raw side's wait."""

    def __init__(self, comm: Any, wait: str) -> None:
        from spmdsim import DTensor, Mesh
        from spmdsim.programs.plan import plan_redistribution

        self.comm, self.world = comm, comm.Get_size()
        world = self.world
        self.layout = layout = Layout((world,), ("x",))
        self.mesh = Mesh(layout, comm, wait=wait)
        self.sub, self.g, _ = self.mesh.group_info(("x",))
        self.tiny = np.ones(world, np.float32)
        self.out = np.empty_like(self.tiny)
        self.src, self.dst = layout("x", None), layout(None, None)
        self.x = DTensor.from_seeded(self.mesh, self.src, SeededTensor((world, 4), seed=1))
        self.plan = plan_redistribution(self.src, self.dst, (world, 4), "float32")
        self.gathered = np.empty((world, 4), np.float32)
        self.X = DTensor.from_seeded(self.mesh, layout(None, "x"), SeededTensor((4, world), seed=2))
        self.W = DTensor.from_seeded(self.mesh, layout("x", None), SeededTensor((world, 4), seed=3))
        self.part, self.res = np.empty((4, 4), np.float32), np.empty((4, 4), np.float32)
        self.waiter = Waiter(comm, wait)


def overhead_records(comm: Any, wait: str, loops: int, profile: bool) -> list[dict]:
    """Per-call cost of spmdsim's hot paths on tiny messages, against the raw call.

    Pieces that do not communicate are timed on each rank alone (best of 5);
    the tiny collectives run `loops` times in a row on all ranks (slowest rank).
    Run with few ranks (2) so that MPI latency, not scheduling, is the floor.
    """
    p = _Pieces(comm, wait)
    records = []
    for name, fn, raw in _local(p):
        t_s = _per_call(fn, loops)
        t_r = _per_call(raw, loops) if raw else None
        records.append(_overhead_rec(comm, name, t_s, t_r, local=True))
    for name, fn, raw in _collective(p):
        times = []
        for f in (fn, raw):
            for _ in range(20):
                f()
            p.waiter.barrier(comm)
            times.append(_per_call(f, loops))
        records.append(_overhead_rec(comm, name, *times))
    _loop(p, loops, profile and comm.Get_rank() == 0)
    return records


def _local(p: _Pieces) -> list:
    """(name, spmdsim piece, the raw equivalent or None) of the pieces that do not communicate."""
    from spmdsim import DTensor, collect_trace
    from spmdsim.nn.ops._common import make_dtensor
    from spmdsim.nn.ops.matmul import plan_matmul
    from spmdsim.programs.plan import plan_redistribution
    from spmdsim.programs.plan import planner as _planner
    from spmdsim.programs.plan.steps import step_label
    from spmdsim.runtime import collectives as C
    from spmdsim.runtime.trace import record

    mesh, src, dst, world, g = p.mesh, p.src, p.dst, p.world, p.g

    def record_in_trace():
        with collect_trace():
            record("allreduce", ("x",), g, 4, 4, 0.0, None)

    def lazy_import():
        from spmdsim.runtime import DTensor as _  # noqa: F401  (as ops do on every call)
    step = p.plan.steps[0]
    keep = SeededTensor((8, 64, 128), "float64", seed=7, low=0.0, high=1.0)  # a GPT residual's mask
    rows = (slice(0, 4), slice(16, 32), slice(0, 128))  # one rank's block of it (dp 2 x tp 4, sequence split)
    return [
        ("mesh.group_info (sub-communicator lookup)", lambda: mesh.group_info(("x",)), None),
        ("mesh.group_info('x') (str axes)", lambda: mesh.group_info("x"), None),
        ("plan_redistribution (cached plan lookup)",
         lambda: plan_redistribution(src, dst, (world, 4), "float32"), None),
        ("TensorLayout hash (cache key)", lambda: hash(src), None),
        ("DTensor(...) construction + validation", lambda: DTensor(mesh, p.x.local, src, (world, 4)), None),
        ("_contig + np.empty_like (buffer prep)",
         lambda: np.empty_like(C._contig(p.tiny)), lambda: np.empty_like(p.tiny)),
        ("trace.record, no trace open", lambda: record("allreduce", ("x",), g, 4, 4, 0.0, None), None),
        ("collect_trace() + record", record_in_trace, None),
        ("dropout keep mask, a (4, 16, 128) block", lambda: keep.at_least(rows, 0.1),
         lambda: np.random.default_rng(7).random((4, 16, 128)) >= 0.1),
        ("function-level 'from ..runtime import DTensor'", lazy_import, None),
        ("plan_matmul (cached on layouts and shapes)", lambda: plan_matmul(p.X, p.W), None),
        ("make_dtensor (result wrapping)", lambda: make_dtensor(mesh, p.part, dst, (4, 4)), None),
        ("step_label (trace label string)", lambda: step_label(step, 1), None),
        ("  of which: planner._plan lru_cache hit", lambda: _planner._plan(src, dst, (world, 4), "float32"), None),
        ("  of which: TensorLayout.check_shape", lambda: src.check_shape((world, 4)), None),
        ("  of which: TensorLayout.local_shape", lambda: src.local_shape((world, 4)), None),
        ("  of which: np.dtype('float32').name", lambda: np.dtype("float32").name, None),
    ]


def _collective(p: _Pieces) -> list:
    """(name, spmdsim call, the raw call) of the tiny collectives."""
    from mpi4py import MPI
    from spmdsim.nn.ops import matmul
    from spmdsim.runtime import collectives as C
    from spmdsim.runtime.executor import redistribute

    mesh, sub, w, SUM, tiny, x = p.mesh, p.sub, p.waiter.call, MPI.SUM, p.tiny, p.x

    def raw_matmul():
        np.matmul(p.X.local, p.W.local, out=p.part)
        w(sub.Allreduce, sub.Iallreduce, p.part, p.res, SUM)

    return [
        ("allreduce 4 floats", lambda: C.allreduce(mesh, tiny, ("x",)),
         lambda: w(sub.Allreduce, sub.Iallreduce, tiny, p.out, SUM)),
        ("allgather 1 float", lambda: C.allgather(mesh, tiny[:1], ("x",), 0),
         lambda: w(sub.Allgather, sub.Iallgather, tiny[:1], p.out)),
        ("redistribute S(0)->B (plan cached)", lambda: redistribute(x, p.dst),
         lambda: w(sub.Allgather, sub.Iallgather, x.local, p.gathered)),
        ("redistribute with a given plan", lambda: redistribute(x, p.dst, p.plan),
         lambda: w(sub.Allgather, sub.Iallgather, x.local, p.gathered)),
        ("matmul 4x4 K-split", lambda: matmul(p.X, p.W), raw_matmul),
    ]


def _loop(p: _Pieces, loops: int, profile: bool) -> None:
    """`loops` rounds of redistribute + matmul + allreduce on every rank; with `profile` (rank 0's), under
    cProfile, its table printed."""
    from spmdsim.nn.ops import matmul
    from spmdsim.runtime import collectives as C
    from spmdsim.runtime.executor import redistribute

    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
    for _ in range(loops):
        redistribute(p.x, p.dst)
        matmul(p.X, p.W)
        C.allreduce(p.mesh, p.tiny, ("x",))
    if profile:
        prof.disable()
        print(f"cProfile of {loops} x (redistribute + matmul + allreduce), rank 0:")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(18)


def _overhead_rec(comm: Any, name: str, t_s: float, t_r: Optional[float],
                  local: bool = False) -> dict:
    """A record; local pieces take the least disturbed rank, collectives the slowest."""
    from mpi4py import MPI

    op = MPI.MIN if local else MPI.MAX
    t_s = comm.allreduce(t_s, op=op)
    t_r = None if t_r is None else comm.allreduce(t_r, op=op)
    return {"name": name, "bytes_per_rank": 0, "spmdsim_s": t_s, "raw_s": t_r, "numpy_s": None,
            "ratio_vs_raw": None if not t_r else t_s / t_r, "peak_rss_bytes":
            comm.allreduce(peak_rss(), op=MPI.MAX),
            "overhead_us": None if t_r is None else (t_s - t_r) * 1e6, "suite": "overhead"}


def overhead_table(records: list[dict]) -> str:
    lines = [f"{'hot path (per call)':<46}{'spmdsim us':>11}{'raw us':>9}"
             f"{'extra us':>10}{'ratio':>7}", "-" * 83]
    for r in records:
        raw = "-" if r["raw_s"] is None else f"{r['raw_s'] * 1e6:.2f}"
        extra = "-" if r["overhead_us"] is None else f"{r['overhead_us']:.2f}"
        ratio = "-" if r["ratio_vs_raw"] is None else f"{r['ratio_vs_raw']:.2f}"
        lines.append(f"{r['name']:<46}{r['spmdsim_s'] * 1e6:>11.2f}{raw:>9}{extra:>10}{ratio:>7}")
    return "\n".join(lines)
