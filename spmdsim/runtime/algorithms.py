"""Run a collective algorithm's schedule (spmdsim.programs.algorithms) with point-to-point messages.

    from spmdsim.runtime.algorithms import collect_rounds, run_collective
    with collect_rounds() as log:
        total = run_collective(comm, "ring-allreduce", x)   # equals comm.Allreduce's result
    print(log.format())                                        # this rank's rounds, with times

Works on any communicator of an engine (MPI's, or spmdsim's simulated
ranks'): its messages are the engine's (``post`` and ``wait_all``,
spmdsim.runtime.engines.base); `compare_with_mpi` times the engine's own collective
beside it. Each round posts every receive, then every send, then waits:
no order of arrival can deadlock. A rank adds a received piece to its own
as ``own + received`` (docs/explanation/algorithms.md gives each algorithm's summation order).
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Callable

import numpy as np

from ..programs.algorithms import Schedule, parse_name
from ..programs.algorithms import build as build_schedule
from ..programs.algorithms.moving import pairwise_peers
from ..programs.algorithms.table import format_rounds
from ..errors import OperatorError, ShapeError
from ..base.precision import is_low
from ..base.validate import as_int
from .arguments import _check_dtype
from .engines import engine_of
from .engines.wait import polite_wait, resolve_wait_mode

__all__ = ["RunRecord", "RoundLog", "collect_rounds", "run_schedule", "run_collective", "result_shape", "emulate",
           "alltoallv_pairwise", "compare_with_mpi"]

_TAG = 7700  # tags _TAG + round number % _TAGS: inside MPI's guaranteed 32767
_TAGS = 20000


@dataclass(frozen=True)
class RunRecord:
    """One rank's run of one schedule: seconds per round (this rank's clock)."""

    schedule: Schedule
    rank: int
    round_seconds: tuple[float, ...]
    label: str | None = None

    @property
    def seconds(self) -> float:
        return sum(self.round_seconds)

    @property
    def bytes_sent(self) -> int:
        return self.schedule.bytes_sent()[self.rank]

    @property
    def bytes_received(self) -> int:
        return self.schedule.bytes_received()[self.rank]


class RoundLog:
    """The schedules run inside one ``collect_rounds()`` block on this rank, in order."""

    def __init__(self) -> None:
        self.records: list[RunRecord] = []

    def format(self, width: int = 100) -> str:
        """Every recorded run as a rounds table (this rank's times)."""
        parts = []
        for rec in self.records:
            head = f"{rec.schedule.name} on {rec.schedule.group_size} ranks" + (
                f" [{rec.label}]" if rec.label else "") + f", rank {rec.rank}'s times"
            parts.append(head + "\n" + format_rounds(rec.schedule, rec.round_seconds, width))
        return "\n\n".join(parts)


# Open logs per thread: simulated ranks (spmdsim.runtime.sim) are threads, each with its own.
_LOCAL = threading.local()


def _open_logs() -> list[RoundLog]:
    logs = getattr(_LOCAL, "logs", None)
    if logs is None:
        logs = _LOCAL.logs = []
    return logs


class _Collector:
    def __enter__(self) -> RoundLog:
        self.log = RoundLog()
        _open_logs().append(self.log)
        return self.log

    def __exit__(self, *exc: object) -> None:
        _open_logs().remove(self.log)


def collect_rounds() -> _Collector:
    """Record every schedule this rank runs inside the ``with`` block (a RoundLog)."""
    return _Collector()


def _bounds(schedule: Schedule) -> list[int]:
    out = [0]
    for n in schedule.slot_counts:
        out.append(out[-1] + n)
    return out


def _span(bounds: list[int], slots: tuple[int, ...]) -> tuple[int, int] | None:
    """(start, stop) when `slots` are consecutive in order (one contiguous range), else None."""
    if any(b != a + 1 for a, b in zip(slots, slots[1:])):
        return None
    return bounds[slots[0]], bounds[slots[-1] + 1]


def _gather(work: np.ndarray, bounds: list[int], slots: tuple[int, ...]) -> np.ndarray:
    span = _span(bounds, slots)
    if span is not None:
        return work[span[0]:span[1]]
    return np.concatenate([work[bounds[s]:bounds[s + 1]] for s in slots])


def _scatter(work: np.ndarray, bounds: list[int], slots: tuple[int, ...], data: np.ndarray,
             combine: Any) -> None:
    """`data` into `slots` of `work`: combined with what is there (a ufunc), or copied (None)."""
    at = 0
    for s in slots:
        piece = work[bounds[s]:bounds[s + 1]]
        n = piece.size
        if combine is not None:
            combine(piece, data[at:at + n], out=piece)
        else:
            piece[...] = data[at:at + n]
        at += n


def run_schedule(comm: Any, schedule: Schedule, send: np.ndarray | None, out: np.ndarray,
                 wait: Callable[[Any], None] | None = None, label: str | None = None,
                 combine: Any = np.add) -> RunRecord:
    """Run `schedule` as this rank (comm's rank): flat `send` in, flat `out` filled.

    Args:
        send: this rank's input, 1-D contiguous (None for a bcast receiver); may be `out` itself.
        out: the 1-D contiguous output buffer.
        wait: completes one request (the mesh's polite wait); default Waitall / Wait.
        combine: the ufunc a reducing transfer applies (np.add; np.maximum for a max).
    """
    me, engine = comm.Get_rank(), engine_of(comm)
    bounds = _bounds(schedule)
    total = bounds[-1]
    mine = schedule.output_slots[me]
    # Work in `out` itself when the output is the whole work buffer in order.
    direct = mine == tuple(range(len(schedule.slot_counts))) and out.size == total and send is not out
    work = out if direct else np.empty(total, out.dtype)
    if schedule.input_slots[me]:
        _scatter(work, bounds, schedule.input_slots[me], send, None)
    seconds = []
    for number, rnd in enumerate(schedule.rounds):
        t0 = perf_counter()
        tag = _TAG + number % _TAGS
        sends = [t for t in rnd.transfers if t.src == me]
        reading = {s for t in sends for s in t.piece}
        receives, landed = [], []
        for t in rnd.transfers:
            if t.dst != me:
                continue
            span = _span(bounds, t.landing)
            if not t.reduce and span is not None and not reading.intersection(t.landing):
                receives.append((work[span[0]:span[1]], t.src, tag))  # straight into place
            else:
                buf = np.empty(_size(bounds, t.landing), work.dtype)
                receives.append((buf, t.src, tag))
                landed.append((t, buf))
        posted = [(_gather(work, bounds, t.piece), t.dst, tag) for t in sends]
        engine.wait_all(engine.post(comm, receives, posted), wait)  # every receive posted, then every send
        for t, buf in landed:
            _scatter(work, bounds, t.landing, buf, combine if t.reduce else None)
        seconds.append(perf_counter() - t0)
    if not direct:
        out[...] = _gather(work, bounds, mine)
    record = RunRecord(schedule, me, tuple(seconds), label)
    for log in _open_logs():
        log.records.append(record)
    return record


def _size(bounds: list[int], slots: tuple[int, ...]) -> int:
    return sum(bounds[s + 1] - bounds[s] for s in slots)


def result_shape(collective: str, shape: tuple[int, ...], p: int) -> tuple[int, ...]:
    """The result's shape for an input of `shape`: blocks are along dim 0 (as MPI's buffers)."""
    count = math.prod(shape)
    if collective == "allgather":
        return (shape[0] * p,) + shape[1:] if shape else (p,)
    if collective == "reduce_scatter":
        if shape and shape[0] % p == 0:
            return (shape[0] // p,) + shape[1:]
        return (count // p,)
    return shape


def run_collective(comm: Any, name: str, local: Any, root: int = 0, out: np.ndarray | None = None,
                   wait: Callable[[Any], None] | None = None, label: str | None = None) -> np.ndarray:
    """Algorithm `name` ("ring-allreduce", ...) over `comm` on this rank's array; returns the result.

    Blocks lie along dim 0, as in MPI's buffer collectives: allgather
    concatenates the members' arrays, reduce_scatter keeps this rank's
    1/p of the summed array, alltoall sends the j-th 1/p to rank j. Bcast
    returns the root's array on every rank (`local` gives shape and dtype).
    """
    collective, algorithm = parse_name(name)
    x = np.ascontiguousarray(local)
    if not is_low(x.dtype):  # bfloat16 is summed here in numpy and moved as its 16-bit words
        # What the mesh's collectives take (runtime.arguments): else text would be summed into garbage with
        # numpy's string add, bool sums would be ORs, a datetime or object array would fail inside numpy or the
        # engine.
        _check_dtype(collective, x.dtype)
    p = comm.Get_size()
    _same_input(comm, name, collective, x, root)
    if collective in ("reduce_scatter", "alltoall") and x.size % p:
        raise ShapeError(f"{name}: {x.size} elements per rank do not divide into {p} blocks")
    schedule = build_schedule(collective, algorithm, p, int(x.size), x.dtype.itemsize, root)
    shape = result_shape(collective, x.shape, p)
    if out is None:
        out = np.empty(shape, x.dtype)
    elif out.shape != shape or out.dtype != x.dtype or not out.flags.c_contiguous:
        raise ShapeError(f"{name}: out {(out.shape, out.dtype.name)!r} must be a C-contiguous array of "
                         f"{(shape, x.dtype.name)!r}")
    send = x.reshape(-1) if schedule.input_slots[comm.Get_rank()] else None
    run_schedule(comm, schedule, send, out.reshape(-1), wait, label)
    return out


def _same_input(comm: Any, name: str, collective: str, x: np.ndarray, root: Any) -> None:
    """Every rank's element count and dtype, compared before the algorithm's first message (their least and
    largest, two small reductions: O(p) on p simulated ranks; gathered only when they differ, to name the
    ranks): ranks whose arrays differ each build another schedule (a bcast receiver with more elements
    than the root would keep the rest uninitialised; one with fewer would be truncated or deadlock). The same
    error on every rank."""
    mine = (int(x.size), x.dtype.name)
    engine = engine_of(comm)
    if engine.all_reduce_object(comm, mine, "min") == engine.all_reduce_object(comm, mine, "max"):
        return
    inputs = engine.all_gather_object(comm, mine)
    if collective == "bcast" and as_int(root) is not None and 0 <= as_int(root) < len(inputs):
        want, whose = inputs[as_int(root)], f"the root's (rank {root})"
    else:
        want, whose = inputs[0], "rank 0's"
    differ = [r for r, got in enumerate(inputs) if got != want]
    shown = ", ".join(f"rank {r}: {inputs[r][0]} of {inputs[r][1]}" for r in differ[:4])
    more = f" and {len(differ) - 4} more" if len(differ) > 4 else ""
    raise ShapeError(f"{name}: every rank's array must have {whose} size and dtype, {want[0]} elements of "
                     f"{want[1]}; {shown}{more}")


def emulate(mesh: Any, op: str, algorithm: str, comm: Any, send: Any, recv: Any,
            *extra: Any, label: str | None = None) -> tuple[str, int, int]:
    """Run `algorithm` in place of MPI's `op` on the buffers the collective would pass to MPI.

    Called by runtime.collectives for a mesh made with ``algorithms=``; the
    arguments are those of mpi4py's call (``Allreduce(send, recv, SUM)``,
    ``Bcast(buf, root)``; a send buffer that is not an array is MPI.IN_PLACE).
    Returns the trace name ("allreduce[ring]") and this rank's bytes sent and received. An Alltoallv
    (``Alltoallv(send, scounts, sdispls, recv, rcounts, rdispls)``) runs from this rank's own counts
    (`alltoallv_pairwise`).
    """
    wait = polite_wait if mesh.polite else None
    if op == "alltoallv":
        sent, received = alltoallv_pairwise(comm, send, recv, *extra, wait=wait)
        return f"{op}[{algorithm}]", sent, received
    me = comm.Get_rank()
    root = 0
    if op == "bcast":
        send, recv, root = send, send, recv
    if not isinstance(send, np.ndarray):  # MPI.IN_PLACE: the input is in the receive buffer
        send = recv
    schedule = build_schedule(op, algorithm, comm.Get_size(), int(send.size), send.dtype.itemsize, root)
    flat_in = send.reshape(-1) if schedule.input_slots[me] else None
    combine = np.add
    if op == "allreduce" and extra:  # Allreduce(send, recv, op): MPI's op or a simulated rank's name
        combine = _combine(extra[0])
    run_schedule(comm, schedule, flat_in, recv.reshape(-1), wait, label, combine)
    return f"{op}[{algorithm}]", schedule.bytes_sent()[me], schedule.bytes_received()[me]


def alltoallv_pairwise(comm: Any, send: np.ndarray, scounts: Any, sdispls: Any, recv: np.ndarray, rcounts: Any,
                       rdispls: Any, wait: Callable[[Any], None] | None = None) -> tuple[int, int]:
    """MPI's Alltoallv as the pairwise exchange (spmdsim.programs.algorithms.moving.pairwise_peers): in round s this
    rank sends its block for one peer and receives another's, straight between the buffers; its own block
    is copied. Counts and displacements in elements, as mpi4py's; each rank's counts are its own (member
    j's scounts[i] is member i's rcounts[j]), so a round whose message is empty posts none, on both sides.
    Returns (bytes sent, bytes received), its own block left out."""
    me, p = comm.Get_rank(), comm.Get_size()
    out, src = recv.reshape(-1), send.reshape(-1)
    out[rdispls[me]:rdispls[me] + rcounts[me]] = src[sdispls[me]:sdispls[me] + scounts[me]]
    engine = engine_of(comm)
    for number, (dest, source) in enumerate(pairwise_peers(p, me)):
        tag = _TAG + number % _TAGS
        receives = [(out[rdispls[source]:rdispls[source] + rcounts[source]], source, tag)] if rcounts[source] else []
        sends = [(src[sdispls[dest]:sdispls[dest] + scounts[dest]], dest, tag)] if scounts[dest] else []
        engine.wait_all(engine.post(comm, receives, sends), wait)
    size = send.dtype.itemsize
    return (sum(scounts) - scounts[me]) * size, (sum(rcounts) - rcounts[me]) * size


def _combine(op: Any) -> Any:
    """The numpy ufunc of an Allreduce's op ("sum", "max" or "min", as engines take it)."""
    for name, ufunc in (("sum", np.add), ("max", np.maximum), ("min", np.minimum)):
        if isinstance(op, str) and op.lower() == name:
            return ufunc
    raise OperatorError(f"allreduce op {op!r} has no emulated algorithm; expected sum, max or min")


def _builtin(comm: Any, collective: str, send: np.ndarray, out: np.ndarray, root: int, polite: bool) -> None:
    """The engine's own collective (MPI's, or the simulated ranks') on the same buffers."""
    wait = polite_wait if polite else None
    engine = engine_of(comm)
    if collective == "bcast":
        out[...] = send
        engine.broadcast(comm, out, root, wait)
    elif collective in ("allreduce", "reduce_scatter"):
        (engine.all_reduce if collective == "allreduce" else engine.reduce_scatter)(comm, send, out, "sum", wait)
    else:
        (engine.all_gather if collective == "allgather" else engine.all_to_all)(comm, send, out, wait)


def compare_with_mpi(comm: Any, schedule: Schedule, dtype: Any, repeat: int = 3,
                     wait_mode: str | None = None) -> dict[str, Any]:
    """Run `schedule` and MPI's own collective on the same input `repeat` times (collective).

    Inputs: values in [-1, 1) (integers in [-50, 50) for integer dtypes), per rank.
    On simulated ranks "MPI's" collective is theirs (spmdsim.runtime.sim). Returns (the
    same on every rank): ``matches_mpi`` (bitwise for data movement and
    integers; float sums within p*p*eps, the bound for summing p values of
    magnitude < 1 in another order), ``max_abs_difference``, the median over the
    runs of the slowest rank's seconds (``seconds_emulated``, ``seconds_mpi``,
    ``round_seconds`` per round) and the ``wait_mode`` used.
    """
    engine = engine_of(comm)
    simulated = engine.simulated
    dtype = np.dtype(dtype)
    me, p = comm.Get_rank(), schedule.group_size
    # Simulated ranks are threads of one process: nothing to be polite to.
    mode = "busy" if simulated else resolve_wait_mode(wait_mode, comm)
    polite = mode == "polite"
    rng = np.random.default_rng(1000 + me)
    count = schedule.input_count(schedule.root if schedule.collective == "bcast" else me)
    if dtype.kind in "iu":
        x = rng.integers(-50, 50, count).astype(dtype)
    else:
        x = (rng.random(count) * 2 - 1).astype(dtype)
    ours = np.empty(schedule.output_count(me), dtype)
    theirs = np.empty_like(ours)
    send = x if schedule.input_slots[me] else None
    runs = []
    for _ in range(repeat):
        engine.barrier(comm, None)
        record = run_schedule(comm, schedule, send, ours, polite_wait if polite else None)
        engine.barrier(comm, None)
        t0 = perf_counter()
        _builtin(comm, schedule.collective, x, theirs, schedule.root, polite)
        runs.append((record.seconds, perf_counter() - t0) + record.round_seconds)
    slowest = np.empty((repeat, 2 + len(schedule.rounds)))
    engine.all_reduce(comm, np.array(runs, dtype=np.float64), slowest, "max", None)
    summed = schedule.collective in ("allreduce", "reduce_scatter") and dtype.kind in "fc"
    diff = float(np.max(np.abs(ours.astype(np.float64) - theirs), initial=0.0))
    same = (diff <= p * p * float(np.finfo(dtype).eps)) if summed else bool(np.array_equal(ours, theirs))
    median = np.median(slowest, axis=0)
    return {
        "matches_mpi": bool(engine.all_reduce_object(comm, int(same), "min")),
        "max_abs_difference": engine.all_reduce_object(comm, diff, "max"),
        "seconds_emulated": float(median[0]),
        "seconds_mpi": float(median[1]),
        "round_seconds": [float(s) for s in median[2:]],
        "wait_mode": mode,
        "rounded": summed,  # a float sum: compared within its rounding (another order), else exactly
        "simulated": simulated,
    }
