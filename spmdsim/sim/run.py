"""simulate(n, fn): run `fn` once per simulated rank, one thread each, all in this process."""
from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any, Callable, Optional

from ..errors import SpmdsimError
from ..validate import as_int
from . import _local, memory
from .comm import SimComm
from .engine import Aborted, SimulationError, World, ranks_text

__all__ = ["simulate", "world", "RankState", "MAX_RANKS"]

MAX_RANKS = 4096  # one thread each; beyond this the per-thread stacks alone exhaust small machines

_RUNNING = threading.Lock()  # one simulation at a time: the runtime's per-rank switches are process-wide


class RankState:
    """What one simulated rank sees as its own: its world communicator, open traces, call counter."""

    __slots__ = ("rank", "size", "comm", "traces", "seq", "dry_run", "meter", "shared", "self_comm")

    def __init__(self, rank: int, size: int, comm: SimComm, dry_run: bool, shared: dict) -> None:
        self.rank, self.size, self.comm = rank, size, comm
        self.self_comm: Any = None  # MPI.COMM_SELF of this rank, made on first use (sim.comm.self_comm)
        self.shared = shared  # spmdsim.sim.once's results, one table for every rank of the run
        self.traces: list = []  # runtime.trace's open collectors of this rank
        self.seq = 0  # runtime.debug's collective counter of this rank
        self.dry_run = dry_run
        self.meter: Any = None  # spmdsim.sim.dry's byte meter in a dry run
        if dry_run:
            from ..runtime.trace import Trace
            from .dry import Meter

            self.meter = Meter()
            self.traces.append(Trace())  # every collective of the run, for the report


def world() -> Any:
    """This rank's world communicator: a SimComm inside simulate(), else ``MPI.COMM_WORLD``."""
    state = _local.current()
    if state is not None:
        return state.comm
    from mpi4py import MPI

    return MPI.COMM_WORLD


def simulate(n: int, fn: Callable[..., Any], *args: Any, dry_run: bool = False, **kwargs: Any) -> list:
    """Run ``fn(*args, **kwargs)`` on `n` simulated ranks in this process; return their results in rank order.

    Inside `fn`, ``spmdsim.world()`` is the rank's communicator and ``Mesh(layout)``
    uses it. With ``dry_run=True`` arrays carry shapes but no data (spmdsim.sim.dry)
    and the returned list has a ``report`` of each rank's bytes sent, received and
    held. An exception on any rank stops every rank and is raised here, with a
    note naming the rank (all ranks alike: "every simulated rank"); a deadlock
    (a skipped or mismatched collective) raises DeadlockError naming who waits where.
    While ranks run, the loaded BLAS uses one thread (unless a thread variable is set).
    """
    size = as_int(n)
    if size is None or not 1 <= size <= MAX_RANKS:
        raise SpmdsimError(f"simulate: rank count {n!r} must be an integer from 1 to {MAX_RANKS}")
    if not callable(fn):
        raise SpmdsimError(f"simulate: {fn!r} is not callable")
    if not _RUNNING.acquire(blocking=False):
        raise SimulationError("simulate() is already running (a simulated rank cannot start another simulation)")
    try:
        return _run(size, fn, args, kwargs, bool(dry_run))
    finally:
        _RUNNING.release()


class DryRunResults(list):
    """The per-rank results of a dry run, with `report` (spmdsim.sim.dry.DryRunReport)."""

    report: Any = None


def _run(size: int, fn: Callable[..., Any], args: tuple, kwargs: dict, dry_run: bool) -> list:
    engine = World(size, dry_run)
    results: list = DryRunResults([None] * size) if dry_run else [None] * size
    states: list = [None] * size
    shared: dict = {}

    def body(rank: int) -> None:
        state = states[rank] = RankState(rank, size, SimComm(engine.root, rank, "MPI_COMM_WORLD"), dry_run, shared)
        _local.enter(state)
        try:
            engine.start(rank)  # a run slot: at most engine.slots ranks compute at once
            results[rank] = fn(*args, **kwargs)
        except Aborted:
            pass  # stopped because another rank failed; that rank's error is the one reported
        except BaseException as exc:  # noqa: BLE001 - reported in the caller
            engine.fail(rank, exc)
        finally:
            _local.leave()
            engine.finish(rank)

    threads = [threading.Thread(target=body, args=(r,), name=f"spmdsim rank {r}", daemon=True)
               for r in range(size)]
    from .dry import RUNNING

    RUNNING[0] += dry_run
    with _per_rank_runtime(engine.slots):
        try:
            for t in threads:
                t.start()
            looked = time.monotonic()
            for t in threads:
                while t.is_alive():  # and every POLL_S: is the machine nearly out of memory?
                    t.join(memory.POLL_S)
                    if time.monotonic() - looked >= memory.POLL_S:
                        looked = time.monotonic()
                        why = memory.problem(size)
                        if why is not None:
                            raise memory.MemoryLimitError(why)
        except BaseException as exc:  # Ctrl-C in the caller, or memory: stop the ranks at their next wait
            engine.fail(-1, exc)
            # Short of memory, a rank inside numpy may not reach its next wait before the
            # machine runs out: give them all half a second together, then leave (daemon threads).
            deadline = time.monotonic() + (0.5 if isinstance(exc, memory.MemoryLimitError) else 1e9)
            for t in threads:
                t.join(max(0.0, min(1.0, deadline - time.monotonic())))
            raise
        finally:
            RUNNING[0] -= dry_run
    _raise_failure(engine, size)
    if dry_run:
        from .dry import report

        results.report = report(states)
    return results


def _raise_failure(engine: World, size: int) -> None:
    """Raise the lowest failing rank's own exception, noting which rank(s) raised it."""
    failed = {r: e for r, e in engine.failed.items() if r >= 0}
    if not failed:
        return
    first = min(failed)
    exc = failed[first]
    alike = [r for r, e in failed.items() if type(e) is type(exc) and str(e) == str(exc)]
    where = ("every simulated rank" if len(alike) == size
             else f"simulated {ranks_text(alike)} of {size}")
    note = f"raised on {where}"
    try:
        exc.simulated_ranks = tuple(sorted(alike))  # for spmdsim.sim.launch's exit codes
    except AttributeError:  # an exception type with __slots__
        pass
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        raise exc
    raise SimulationError(f"{type(exc).__name__}: {exc} ({note})") from exc


class _per_rank_runtime:
    """Switch the runtime's process-wide state (call counter, traces, buffers, BLAS threads) to per rank, and back."""

    def __init__(self, slots: int) -> None:
        self._slots = slots

    def __enter__(self) -> None:
        from .. import _threads, buffers
        from ..runtime import debug, trace

        # Ranks computing at once each call BLAS: one thread each, as an MPI rank on its share of the
        # cores (a multithreaded OpenBLAS runs one caller's call at a time; the MindSpore tutorial
        # network's training at 8 ranks on 2 cores took 1.2-1.4x as long with two). A thread count
        # the user set is kept.
        self._blas = contextlib.ExitStack()
        if self._slots > 1 and not _threads.threads_set_by_user():
            self._blas.enter_context(_threads.blas_threads(1))
        self._huge = buffers._HUGE
        buffers._HUGE = False  # no cross-process copies to speed up; the pool is not thread-safe
        debug.per_rank(True)
        trace.per_rank(True)
        self._streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Lines(sys.stdout), _Lines(sys.stderr)

    def __exit__(self, *exc: object) -> None:
        from .. import buffers
        from ..runtime import debug, trace

        sys.stdout.flush_all()
        sys.stderr.flush_all()
        sys.stdout, sys.stderr = self._streams
        trace.per_rank(False)
        debug.per_rank(False)
        buffers._HUGE = self._huge
        self._blas.close()


class _Lines:
    """A stream that writes whole lines only, so that ranks printing at once do not mix their words."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._pending: dict[int, str] = {}  # thread id -> text after its last newline

    def write(self, text: str) -> int:
        me = threading.get_ident()
        with self._lock:
            pending = self._pending.pop(me, "") + text
            cut = pending.rfind("\n") + 1
            if cut:
                self._stream.write(pending[:cut])
            if pending[cut:]:
                self._pending[me] = pending[cut:]
        return len(text)

    def flush(self) -> None:
        with self._lock:
            self._stream.flush()

    def flush_all(self) -> None:
        with self._lock:
            for text in self._pending.values():
                self._stream.write(text)
            self._pending.clear()
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def current_rank() -> Optional[int]:
    """The simulated rank running this code, or None outside simulate()."""
    state = _local.current()
    return None if state is None else state.rank
