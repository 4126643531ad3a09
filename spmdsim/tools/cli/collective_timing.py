"""Timing raw mpi4py collectives, the ranks polite while they wait: what `spmdsim calibrate` fits the cost
model to, shared with scripts/bench.py (`raw_collective`, `time_interleaved`, `Waiter`). Each timing is the
median over repeats of the slowest rank's time.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...base import buffers
from ...programs.cost import Measurement, normalize_op
from ...runtime.engines import engine_of
from ...runtime.engines.wait import polite_wait, resolve_wait_mode

__all__ = ["Waiter", "raw_collective", "time_interleaved", "measure", "measure_copy"]


class Waiter:
    """Completes requests as the runtime's wait mode does ("busy" blocks, "polite" sleeps)."""

    def __init__(self, comm: Any, mode: str | None = None) -> None:
        self.mode = resolve_wait_mode(mode, comm)
        self._polite = polite_wait

    def call(self, blocking: Callable, nonblocking: Callable, *args: Any) -> None:
        """Raw mpi4py for the benchmarks' peers: `blocking(*args)`, or `nonblocking`'s request waited for."""
        if self.mode == "polite":
            self._polite(nonblocking(*args))
        else:
            blocking(*args)

    @property
    def wait(self) -> Callable[[Any], None] | None:
        """The engines' `wait` argument for this mode (spmdsim.runtime.engines.base)."""
        return self._polite if self.mode == "polite" else None

    def barrier(self, comm: Any) -> None:
        engine_of(comm).barrier(comm, self.wait)


def raw_collective(comm: Any, op: str, nbytes: int, waiter: Waiter,
                   dtype: str = "float32") -> Callable[[], None]:
    """A zero-argument call doing `op` as the communicator's engine does it (mpi4py's plain call,
    under MPI) on buffers made once.

    `nbytes` is the collective's per-rank buffer n (spmdsim.programs.cost): gathered
    output, unreduced input, or the whole send buffer. The buffers are placed
    as spmdsim places its own (spmdsim.base.buffers), so the fit prices what
    spmdsim's calls move.
    """
    op = normalize_op(op)
    g = comm.Get_size()
    item = np.dtype(dtype).itemsize
    count = max(g, nbytes // item // g * g)  # divisible by g, at least one element each
    full, part = buffers.full(count, 1, dtype), buffers.full(count // g, 1, dtype)
    engine, w = engine_of(comm), waiter.wait
    if op == "allgather":
        return lambda: engine.all_gather(comm, part, full, w)
    if op == "allreduce":
        out = buffers.empty(count, dtype)
        return lambda: engine.all_reduce(comm, full, out, "sum", w)
    if op == "reduce_scatter":
        return lambda: engine.reduce_scatter(comm, full, part, "sum", w)
    if op == "alltoall":
        out = buffers.empty(count, dtype)
        return lambda: engine.all_to_all(comm, full, out, w)
    if op == "alltoallv":
        # As spmdsim's alltoallv: the own block is not sent.
        me, block = comm.Get_rank(), count // g
        counts = [0 if r == me else block for r in range(g)]
        displs = list(np.cumsum([0] + counts[:-1]))
        send, recv = buffers.full(block * (g - 1), 1, dtype), buffers.empty(block * (g - 1), dtype)
        return lambda: engine.all_to_allv(comm, send, counts, displs, recv, counts, displs, w)
    if op == "bcast":
        return lambda: engine.broadcast(comm, full, 0, w)
    raise AssertionError(op)  # normalize_op admits only OPS


def time_interleaved(comm: Any, calls: Mapping[str, Callable[[], Any]], waiter: Waiter, *,
                     warmup: int = 2, repeats: int = 7,
                     only_rank0: Sequence[str] = ()) -> dict[str, list[float]]:
    """Time each call `repeats` times, interleaved, after `warmup` rounds.

    Every repeat starts after a barrier; the result per name is the list of
    the slowest rank's seconds per repeat. Names in `only_rank0` run on
    rank 0 alone while the others wait (single-process references).
    """
    names = list(calls)
    local = np.zeros((len(names), repeats))
    rank = comm.Get_rank()
    for rep in range(-warmup, repeats):
        # Rotate the order so that no contender always runs first after a barrier.
        order = names[rep % len(names):] + names[:rep % len(names)] if names else names
        for name in order:
            solo = name in only_rank0
            waiter.barrier(comm)
            waiter.barrier(comm)  # a second, hot barrier: all ranks start together
            t0 = time.perf_counter()
            if not solo or rank == 0:
                calls[name]()
            elapsed = time.perf_counter() - t0
            if rep >= 0:
                local[names.index(name), rep] = elapsed
    slowest = np.empty_like(local)
    engine_of(comm).all_reduce(comm, local, slowest, "max", None)
    return {name: slowest[i].tolist() for i, name in enumerate(names)}


def measure(comm: Any, ops: Sequence[str], group_sizes: Sequence[int], sizes: Sequence[int],
            waiter: Waiter, *, warmup: int = 2, repeats: int = 7,
            progress: Callable[[str], None] | None = None) -> list[Measurement]:
    """Median slowest-rank time of each raw collective, per group size and buffer size."""
    out = []
    rank = comm.Get_rank()
    for g in group_sizes:
        sub = engine_of(comm).split(comm, rank // g, rank)
        try:
            for n in sizes:
                calls = {op: raw_collective(sub, op, n, waiter) for op in ops}
                times = time_interleaved(comm, calls, waiter, warmup=warmup, repeats=repeats)
                for op in ops:
                    out.append(Measurement(op, g, _real_bytes(n, g), statistics.median(times[op])))
                if progress:
                    progress(f"calibrate: g={g} n={n} done")
        finally:
            engine_of(comm).free(sub)
    return out


def measure_copy(comm: Any, sizes: Sequence[int], waiter: Waiter, *, warmup: int = 2,
                 repeats: int = 7) -> float:
    """Seconds per byte of the packing copy collectives do, as it costs inside a collective step.

    The copy is the one spmdsim makes to send blocks along a non-leading dim:
    a (rows, g, rest) view transposed into a contiguous buffer. It is timed as
    the difference between that copy followed by an Alltoall of the packed
    buffer and the same Alltoall alone (interleaved): a rank packing while its
    peers already wait in the collective is slower than one copying alone
    (1.5-3x at 8 ranks on 2 cores). The copy alone is the floor. Median over
    the sizes >= 1 MiB (all sizes if none are) of the slowest rank.
    """
    g = comm.Get_size()
    rates = []
    big = [n for n in sizes if n >= 1 << 20] or list(sizes)
    for n in big:
        count = _real_bytes(n, g * 64) // 4
        # Placed (and from 1 MiB on huge pages) as spmdsim's own buffers are:
        # a fresh heap array copies up to 3x slower than a huge-page one.
        src = buffers.full((64, g, count // (64 * g)), 1, np.float32)
        dst = buffers.empty((g, 64, count // (64 * g)), np.float32)
        recv = buffers.empty(dst.shape, np.float32)
        view = src.swapaxes(0, 1)

        def packed() -> None:
            np.copyto(dst, view)
            waiter.call(comm.Alltoall, comm.Ialltoall, dst, recv)
        calls = {"copy": lambda: np.copyto(dst, view), "packed": packed,
                 "plain": lambda: waiter.call(comm.Alltoall, comm.Ialltoall, dst, recv)}
        times = {k: statistics.median(v) for k, v in
                 time_interleaved(comm, calls, waiter, warmup=warmup, repeats=repeats).items()}
        rates.append(max(times["copy"], times["packed"] - times["plain"]) / src.nbytes)
    return statistics.median(rates)


def _real_bytes(nbytes: int, g: int, item: int = 4) -> int:
    """The n raw_collective really used (rounded to g whole elements)."""
    return max(g, nbytes // item // g * g) * item
