"""The benchmark harness of scripts/bench.py: a case, its timed contenders, the slowest-rank medians."""
from __future__ import annotations

import statistics
import time
from time import perf_counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from spmdsim.base import buffers
from spmdsim.tools.cli.collective_timing import Waiter

__all__ = ["Case", "Raw", "after_arrival_s", "peak_rss", "placed", "run_case", "size_text", "traced"]


@dataclass
class Case:
    """One benchmark: three callables doing the same work. spmdsim/raw return (comm seconds, the collectives'
    (start, end) spans, when the work was called, when it returned): `traced` and `Raw.timed` make them."""

    name: str
    bytes_per_rank: int
    spmdsim: Callable[[], Optional[tuple]]
    raw: Callable[[], Optional[tuple]]
    numpy: Optional[Callable[[], Any]] = None
    extra: dict = field(default_factory=dict)


from spmdsim.programs.memory import peak_rss  # noqa: E402  (re-exported for the benches)


def traced(fn: Callable[[], Any], sink: list) -> Callable[[], tuple]:
    """Run fn; return (seconds in collectives, their spans, when fn was called, when it returned), keep the
    first call's entries.

    run_case keeps one trace open around the whole case, so no collector is
    opened per call: opening one right before the collective would time the
    harness, not spmdsim (it moved 1 MiB results by 5-11% at 8 ranks on 2 cores).
    """
    from spmdsim.runtime.trace import open_traces

    def call() -> tuple:
        tr = open_traces()[-1]
        start = len(tr)
        t0 = perf_counter()
        fn()
        t1 = perf_counter()
        if not sink:
            sink.extend(tr.entries[start:])
        return tr.seconds(start), tr.spans(start), t0, t1

    return call


class Raw:
    """Raw mpi4py helpers on a communicator with the benchmark's wait mode; times comm.

    Every timed span (a collective, with its packing where spmdsim's trace
    counts packing too) goes through `add`, as (start, end) perf_counter pairs.
    """

    def __init__(self, waiter: Waiter) -> None:
        self.w = waiter
        self.comm_s = 0.0
        self.spans: list[tuple[float, float]] = []

    def add(self, t0: float, t1: float) -> None:
        self.comm_s += t1 - t0
        self.spans.append((t0, t1))

    def __call__(self, blocking: Callable, nonblocking: Callable, *args: Any) -> None:
        t0 = time.perf_counter()
        self.w.call(blocking, nonblocking, *args)
        self.add(t0, time.perf_counter())

    def timed(self, fn: Callable[[], Any]) -> Callable[[], tuple]:
        def call() -> tuple:
            self.comm_s, self.spans = 0.0, []
            t0 = perf_counter()
            fn()
            return self.comm_s, self.spans, t0, perf_counter()
        return call


def _run_reps(comm: Any, waiter: Waiter, case: Case, warmup: int, repeats: int, names: list,
              total: np.ndarray, comm_t: np.ndarray, spans: list, edges: np.ndarray) -> None:
    """The interleaved repeats of run_case: fills total[contender, repeat], comm_t, spans and edges[contender,
    repeat] (this rank's seconds from the work's call to its first collective's start, and from its last
    collective's end to the work's return, the harness's own bookkeeping outside both)."""
    rank = comm.Get_rank()
    for rep in range(-warmup, repeats):
        # spmdsim and raw swap places every repeat; numpy (rank 0 alone) comes last, so
        # neither MPI contender always follows it (ranks wake slowly from a polite wait).
        order = (["spmdsim", "raw"] if rep % 2 == 0 else ["raw", "spmdsim"]) + names[2:]
        for name in order:
            i = names.index(name)
            waiter.barrier(comm)
            if name != "numpy":
                waiter.barrier(comm)  # a second, hot barrier: all ranks start together
            t0 = time.perf_counter()
            inner = None
            if name == "numpy":
                if rank == 0:
                    case.numpy()
            else:
                inner = getattr(case, name)()
            elapsed = time.perf_counter() - t0
            if rep >= 0:
                total[i, rep] = elapsed
                if inner is not None:
                    comm_t[i, rep], spans[i][rep], called, returned = inner
                    if spans[i][rep]:
                        edges[i, rep] = spans[i][rep][0][0] - called, returned - spans[i][rep][-1][1]


def run_case(comm: Any, waiter: Waiter, case: Case, warmup: int, repeats: int) -> dict:
    """Interleaved timing of one case; slowest rank per repeat, median over repeats."""
    names = ["spmdsim", "raw"] + (["numpy"] if case.numpy is not None else [])
    repeats += repeats % 2  # an even count: each MPI contender goes first equally often
    total = np.zeros((3, repeats))
    comm_t = np.zeros((2, repeats))
    from spmdsim import collect_trace

    spans: list = [[[] for _ in range(repeats)] for _ in range(2)]
    edges = np.full((2, repeats, 2), np.nan)
    with collect_trace():  # read by traced(); raw and numpy record nothing
        _run_reps(comm, waiter, case, warmup, repeats, names, total, comm_t, spans, edges)
    from mpi4py import MPI

    both = np.concatenate([total, comm_t])
    slowest = np.empty_like(both)
    comm.Allreduce(both, slowest, MPI.MAX)
    med = [statistics.median(row) for row in slowest]
    rss = comm.allreduce(peak_rss(), op=MPI.MAX)
    rec = {
        "name": case.name,
        "bytes_per_rank": int(case.bytes_per_rank),
        "spmdsim_s": med[0],
        "raw_s": med[1],
        "numpy_s": med[2] if case.numpy is not None else None,
        "ratio_vs_raw": med[0] / med[1] if med[1] > 0 else None,
        "peak_rss_bytes": int(rss),
        "spmdsim_comm_s": med[3],
        "raw_comm_s": med[4],
        "comm_ratio_vs_raw": med[3] / med[4] if med[4] > 0 else None,
    }
    every = np.empty((comm.Get_size(),) + edges.shape)
    comm.Allgather(edges, every)
    for who, contender in ((0, "spmdsim"), (1, "raw")):
        rec[f"{contender}_comm_after_arrival_s"] = after_arrival_s(comm, spans[who])
        # The per-call split: each rank's Python before its first collective and after its last, the median
        # over ranks and repeats (the transfer between is `comm`); None where a contender ran no collective.
        for end, part in ((0, "before"), (1, "after")):
            values = every[:, who, :, end]
            values = values[~np.isnan(values)]
            rec[f"{contender}_{part}_s"] = float(np.median(values)) if values.size else None
    rec.update(case.extra)
    return rec


def after_arrival_s(comm: Any, spans: list) -> Optional[float]:
    """Median over repeats of the time collectives took after their last rank arrived.

    `spans[rep]` holds this rank's (start, end) per collective call of one
    repeat. A call cannot finish before its last member starts it, so
    ``end - max over ranks of start`` is its time without the wait for late
    ranks (load imbalance, scheduling); summed over the calls, the slowest
    rank per repeat, median. None when the ranks made different numbers of
    calls (the spans would not line up). perf_counter is CLOCK_MONOTONIC,
    one clock for every rank on a machine.
    """
    from mpi4py import MPI

    counts = {len(s) for s in spans}
    k = counts.pop() if len(counts) == 1 else -1
    if comm.allreduce(k, op=MPI.MIN) != comm.allreduce(k, op=MPI.MAX) or k <= 0:
        return None
    pairs = np.asarray(spans, dtype=np.float64)  # (repeats, k, 2)
    starts = np.ascontiguousarray(pairs[:, :, 0])
    last = np.empty_like(starts)
    comm.Allreduce(starts, last, MPI.MAX)
    mine = np.clip(pairs[:, :, 1] - last, 0.0, None).sum(axis=1)
    slowest = np.empty_like(mine)
    comm.Allreduce(mine, slowest, MPI.MAX)
    return float(np.median(slowest))


def placed(shape: Any, fill: Optional[float] = None) -> np.ndarray:
    """A float32 buffer for the raw code, placed in the page as spmdsim places its own.

    Both sides then start from the same placement (spmdsim.base.buffers): a ratio
    measures spmdsim's work, not which side the heap happened to favour.
    """
    return buffers.empty(shape, np.float32) if fill is None else buffers.full(shape, fill, np.float32)


def size_text(n: float) -> str:
    for unit, scale in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}B"
