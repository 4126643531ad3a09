"""simulate(n, fn): run `fn` once per simulated rank, one thread each, all in this process
(or, as a dry run, once as rank 0 of `n` on the dry engine: spmdsim.runtime.sim.dry)."""
from __future__ import annotations

import functools
import inspect
import reprlib
import threading
import time
from typing import Any, Callable, Optional

from ...base import context as _local
from ...base.context import SIMULATE, RankContext
from ..engines import memory
from ...errors import SpmdsimError, exception_text, program_traceback, same_class
from ...base.validate import as_int
from .engine import SimulationError, World
from .waiting import ranks_text
from .simulating import _simulating
from .thread_limits import ThreadLimitError, start_failed, threads_problem, warn_under_launcher
from .stopping import stop_ranks
from .p2p import rewrites, uncompleted, unreceived
from .landing import EAGER_BYTES
from .os_exit import os_exit_ends_the_rank
from . import rank_runs
from .rank_runs import RankRuns
from ..debug import HOOKS, Hooks
from ..engines.trace import Trace

__all__ = ["simulate", "RankContext", "MAX_RANKS", "MAX_DRY_RANKS"]

#: The most ranks `simulate` runs (a dry run up to MAX_DRY_RANKS, 65536).
#: One thread each. Each maps its stack (8 MiB under the usual ulimit -s) as address space, which no cap binds
#: by default, and takes ~17 KB of memory idle (docs/howto/simulate.md, "Limits"); a cap that cannot hold the stacks
#: is refused before any thread starts (spmdsim.runtime.sim.thread_limits).
MAX_RANKS = 4096
MAX_DRY_RANKS = 65536  # a dry run runs one rank for all: the largest mesh the planner is meant for

STOP_S = 1.0  # interrupted (Ctrl-C, SIGTERM): how long the ranks get, all together, to stop at their next wait


def simulate(n: int, fn: Callable[..., Any], *args: Any, dry_run: bool = False, eager_limit: Optional[int] = None,
             **kwargs: Any) -> list:
    """Run ``fn(*args, **kwargs)`` on `n` simulated ranks in this process; return their results in rank order.

    Inside `fn`, ``spmdsim.world()`` is the rank's communicator and ``Mesh(layout)``
    uses it (`fn` is not given its rank: a `fn` that ``fn(*args, **kwargs)`` cannot call is refused before
    any rank starts). An exception on any rank stops every rank and is raised here, with a
    note naming the rank (all ranks alike: "every simulated rank"); a deadlock
    (a skipped or mismatched collective) raises DeadlockError naming who waits where.
    A SystemExit (``sys.exit()``, or ``os._exit()``) ends its rank alone, as it ends an MPI process: ranks
    left waiting for it deadlock ("rank 1 exited (SystemExit(0))"); else, once the ranks
    end, it is raised here, as one process exits (the largest exit status when they differ).
    While ranks run, the loaded BLAS uses one thread (unless a thread variable is set).
    Simulations started from two threads run side by side, each rank with its own traces
    and debug settings: a copy of this process's as simulate() starts (spmdsim.runtime.debug;
    configure() on a simulated rank changes that rank's alone, as on an MPI rank).
    The list's `unreceived` names the messages sent and never received (MPI leaves them undefined), its
    `uncompleted` the program's nonblocking requests (Isend, Irecv, ...) never completed by a Wait or Test, its
    `rewritten` the nonblocking sends whose buffer the program wrote into before the send completed.

    With ``dry_run=True`` (up to MAX_DRY_RANKS) one rank runs for all with shapes but no
    data (spmdsim.runtime.sim.dry): the list holds its result `n` times and has a ``report`` of
    each rank's bytes sent, received and held.

    `eager_limit`: a standard Send of fewer bytes is buffered and completes at once, a larger one waits for its
    receive (default EAGER_BYTES, MPICH's 8 KiB); 0 buffers none, so that a program relying on MPI buffering its
    standard Sends (unsafe, by the MPI standard) deadlocks at any message size. A dry run moves no messages.
    """
    if not isinstance(dry_run, bool):  # a truthy string such as "no" is no flag
        raise SpmdsimError(f"simulate: dry_run {dry_run!r} must be True or False")
    size, most = as_int(n), MAX_DRY_RANKS if dry_run else MAX_RANKS
    if size is None or not 1 <= size <= most:
        raise SpmdsimError(f"simulate: rank count {n!r} must be an integer from 1 to {most}" + (
            f" (a dry run goes to {MAX_DRY_RANKS})" if not dry_run and size else "") + (
            ", given first: simulate(n, fn)" if callable(n) else ""))
    if not callable(fn):
        raise SpmdsimError(f"simulate: fn {reprlib.repr(fn)} is not callable: expected the function (main, not main())")
    _check_call(fn, args, kwargs)
    limit = EAGER_BYTES if eager_limit is None else as_int(eager_limit)
    if limit is None or limit < 0:
        raise SpmdsimError(f"simulate: eager_limit {eager_limit!r} must be a number of bytes, 0 or more")
    if _local.simulated() is not None:
        raise SimulationError("simulate() is already running (a simulated rank cannot start another simulation)")
    if not dry_run:
        problem = threads_problem(size)  # before any rank starts: not part way, with a traceback
        if problem is not None:
            raise ThreadLimitError(f"simulate: {problem}")
    warn_under_launcher(size)
    try:
        with os_exit_ends_the_rank():  # a rank's os._exit(code) ends that rank, as its sys.exit(code)
            return _dry_run(size, fn, args, kwargs) if dry_run else _run(size, fn, args, kwargs, limit)
    except BaseException as exc:
        __tracebackhide__ = True  # noqa: F841 - the caller's frame, then the program's (_programs_frames)
        if getattr(exc, "simulated_ranks", None) is None:  # not the ranks': Ctrl-C in the caller, memory, threads
            if isinstance(exc, KeyboardInterrupt):  # the cell's line, not the waits it came in (IPython's hook)
                exc._render_traceback_ = functools.partial(program_traceback, exc.with_traceback(None))
                raise exc  # (from here on: a bare raise re-raised the waits' traceback on Python 3.10)
            raise
        raise exc.with_traceback(_programs_frames(exc.__traceback__))


#: The files of a simulation's own frames above a rank's program (`_programs_frames` leaves them out).
_OWN_FILES = (__file__, rank_runs.__file__)


def _programs_frames(tb: Any) -> Any:
    """A rank's traceback from the program's first frame (all of it where every frame is this module's or the rank
    threads' of rank_runs): a notebook shows the cell, then the program (simulate's raise hidden by its
    __tracebackhide__, as IPython and pytest do)."""
    first = tb
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next
    return tb or first


def _check_call(fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    """Refuse `fn` where ``fn(*args, **kwargs)`` cannot bind, before any rank starts: a new user's ``fn(rank)``
    (as multiprocessing passes it) would be a TypeError on every rank. A callable that tells no signature is
    called."""
    try:
        signature = inspect.signature(fn, follow_wrapped=False)  # a wrapper's own: it may give fn what it needs
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        name = getattr(fn, "__name__", None) or type(fn).__name__
        given = ", ".join([*map(reprlib.repr, args), *(f"{k}={reprlib.repr(v)}" for k, v in kwargs.items())])
        raise SpmdsimError(f"simulate: {name}() cannot be called as {name}({given}): {exc}; simulate(n, fn, *args, "
                           "**kwargs) calls fn(*args, **kwargs) on every rank, and spmdsim.world().Get_rank() is its "
                           "rank") from None


class Results(list):
    """The per-rank results of a simulation, with `unreceived`: the point-to-point messages sent and never received,
    and receives never matched, when the ranks ended (spmdsim.runtime.sim.p2p.unreceived); `uncompleted`: the
    program's nonblocking requests never completed nor freed (spmdsim.runtime.sim.p2p.uncompleted); `rewritten`: its
    nonblocking sends whose buffer it wrote into before the send completed (spmdsim.runtime.sim.landing.rewritten).
    Each lists by world rank, then in the order that rank posted them (the same every run)."""

    unreceived: tuple = ()
    uncompleted: tuple = ()
    rewritten: tuple = ()


class DryRunResults(list):
    """The per-rank results of a dry run, with `report` (spmdsim.runtime.sim.dry_report.DryRunReport), made when first
    read (a caller that reads only the results, spmdsim.tools.estimate's ledger, does not sum every rank's trace)."""

    _report: Any = None
    _make: Any = None  # what makes the report, until it is read

    @property
    def report(self) -> Any:
        if self._make is not None:
            self._report, self._make = self._make(), None
        return self._report

    @report.setter
    def report(self, value: Any) -> None:
        self._report, self._make = value, None


def _run(size: int, fn: Callable[..., Any], args: tuple, kwargs: dict, eager_limit: int) -> list:
    engine = World(size, eager_limit)
    settings = Hooks(HOOKS)  # the process's debug settings now: each rank starts from a copy
    engine.watched = _may_watch(settings)
    runs = RankRuns(engine, settings, {})
    runs.add(engine.root, [(fn, args, kwargs)] * size)
    _run_threads(engine, runs, size)
    _raise_failure(engine, size)
    exited = {r: e for r, e in runs.exited.items() if r < size}  # (a spawned rank's exit: not the run's)
    if exited:
        raise _exit_of(exited, size)
    done = Results(runs.results.get(r) for r in range(size))
    done.unreceived = unreceived(engine)
    done.uncompleted = uncompleted(engine)
    done.rewritten = rewrites(engine)
    return done


def _run_threads(engine: World, runs: RankRuns, size: int) -> None:
    """Start the world's ranks' threads (`runs`) and wait for their Events, and for those of the ranks spawned
    meanwhile (a Thread.join Ctrl-C interrupts marks a live thread ended on Python 3.11), watching memory and the
    run slots' line (World.overdraw); Ctrl-C or memory nearly out stops the ranks and is raised."""
    threads, ended = runs.threads, runs.ended  # (spawned ranks' are appended as they start)
    with _simulating(engine.slots):
        try:
            for started, t in enumerate(threads[:size]):
                try:
                    t.start()
                except RuntimeError as exc:
                    signalled = exc.__context__
                    if signalled is not None and not isinstance(signalled, Exception):
                        # a signal's exception (Ctrl-C, mpirun's SIGTERM) raised inside start() left its lock
                        # half released ("release unlocked lock"): the signal is what happened
                        raise signalled from None
                    if "can't start" not in str(exc):
                        raise
                    raise start_failed(started, size, exc) from None  # a limit threads_problem could not see
            looked = time.monotonic()
            waited = 0
            while waited < len(threads):
                t, end = threads[waited], ended[waited]
                while t.is_alive() and not engine.given_up():  # and every POLL_S: is memory nearly out?
                    if end.wait(memory.POLL_S):
                        t.join()  # (its last lines, after the Event)
                    if time.monotonic() - looked >= memory.POLL_S:
                        looked = time.monotonic()
                        engine.overdraw(looked)  # a line for run slots that stood still gets slots anyway
                        why = memory.problem(len(threads))
                        if why is not None:
                            raise memory.MemoryLimitError(why)
                waited += 1
        except BaseException as exc:  # Ctrl-C in the caller, or memory: stop the ranks at their next wait
            engine.fail(-1, exc)
            # Short of memory, a rank inside numpy may not reach its next wait before the machine runs out: half
            # a second for them all; then those left are stopped (spmdsim.runtime.sim.stopping).
            stop_ranks(list(threads), list(ended), 0.5 if isinstance(exc, memory.MemoryLimitError) else STOP_S)
            raise


def _may_watch(settings: Any) -> bool:
    """Whether the ranks, starting from `settings`, may have the watchdog on (World.watched): read from a copy,
    so that each rank still reads the environment itself; a bad value (True) is then every rank's error."""
    try:
        return Hooks(settings).watchdog_seconds() is not None
    except SpmdsimError:
        return True


def _dry_run(size: int, fn: Callable[..., Any], args: tuple, kwargs: dict) -> list:
    """`fn` once, as rank 0 of `size` on the dry engine, in a thread of its own (once per representative when
    the ranks differ: spmdsim.runtime.sim.dry.differ), each rank given its representative's result; the report."""
    from . import dry, dry_meter, dry_report  # (numpy: a simulation of programs without it does not load it)

    def one(rank: int, stands_for: Any) -> tuple:
        context = RankContext(rank, size, dry.DryComm(size, rank), dry.DRY, dry_run=True,
                              hooks=Hooks(HOOKS), launcher=SIMULATE)
        context.meter = dry_meter.Meter()
        context.meter.stands_for = stands_for
        context.traces.append(Trace())  # every collective of the run, for the report
        outcome: list = []
        ended = threading.Event()  # waited on, not the thread: an interrupted join marks a live thread ended

        def body() -> None:
            import numpy as np

            _local.enter(context)
            try:
                # The blocks a dry run computes (the small ones) read values nothing set: messages never move.
                # Their floating-point warnings (NaN from whatever the memory held) say nothing: not shown.
                with np.errstate(all="ignore"):
                    outcome.append((True, fn(*args, **kwargs)))
            except BaseException as exc:  # noqa: BLE001 - raised in the caller
                outcome.append((False, exc))
            finally:
                _local.leave()
                ended.set()

        thread = threading.Thread(target=body, name="spmdsim dry run", daemon=True)
        with _simulating(1):
            thread.start()
            try:
                while not ended.wait(memory.POLL_S):  # timed: a Ctrl-C made pending (not signalled) is seen too
                    pass
            except BaseException:  # Ctrl-C in the caller: the dry run stops at its next step, as ranks at a wait
                context.meter.stopped = True
                stop_ranks([thread], [ended], STOP_S)
                raise
        return context, outcome[0]

    context, (ok, value) = one(0, None)
    contexts = {0: context}
    values = {0: value}
    stands_for = context.meter.stands_for  # the program said its ranks differ (spmdsim.runtime.sim.dry.differ)
    if ok and stands_for is not None:
        for rank in sorted(set(stands_for.tolist()) - {0}):  # one more run per representative
            contexts[rank], (ok, value) = one(rank, stands_for)
            values[rank] = value
            if not ok:
                break
    if not ok:
        ran = "rank 0 runs" if len(contexts) == 1 else f"{len(contexts)} representatives run"
        raise _noted(value, tuple(range(size)), f"raised in the dry run ({ran} for all {size} simulated ranks)")
    # Each rank's result is its representative's (rank 0's for all when the ranks do not differ).
    results = DryRunResults([values[0]] * size if stands_for is None else
                            [values[r] for r in stands_for.tolist()])
    results._make = lambda: dry_report.report(contexts, size, stands_for)
    return results


def _raise_failure(engine: World, size: int) -> None:
    """Raise the lowest failing rank's own exception, noting which rank(s) raised it, and with
    ``simulated_failures``: (rank, type, text) of every failing rank, in rank order (spmdsim.runtime.sim.launch: an
    spmdsim error on every rank is exit 2 whatever each says; the types, not the exceptions, whose
    tracebacks would keep every rank's buffers)."""
    failed = {r: e for r, e in engine.failed.items() if r >= 0}
    if not failed:
        return
    first = min(failed)
    exc = failed[first]
    alike = [r for r, e in failed.items()
             if same_class(type(e), type(exc)) and exception_text(e) == exception_text(exc)]
    where = ("every simulated rank" if len(alike) == size and engine.runs.ranks == size
             else f"simulated {ranks_text(alike)} of {_counted(engine, size)}")
    noted = _noted(exc, tuple(sorted(alike)), f"raised on {where}")
    try:
        noted.simulated_failures = tuple((r, type(e), exception_text(e)) for r, e in sorted(failed.items()))
    except AttributeError:  # an exception type with __slots__
        pass
    raise noted


def _counted(engine: World, size: int) -> str:
    """'4', or with ranks spawned, '7 (4 started, 3 spawned: ranks 4-6)'."""
    more = engine.runs.ranks - size
    return f"{size}" if not more else (f"{size + more} ({size} started, {more} spawned: "
                                       f"{ranks_text(range(size, size + more))})")


def exit_status(code: Any) -> int:
    """The exit status ``sys.exit(code)`` gives a process, as the OS reports it: an int's low 8 bits
    (``sys.exit(-1)`` is 255 under mpiexec), 0 for None, 1 for anything else (Python prints it). Simulated
    ranks report theirs so (spmdsim.runtime.sim.launch, spmdsim mpirun): a negative code taken as it is lost to the
    others' 0 in the largest of them."""
    if code is None or isinstance(code, int):
        return int(code or 0) & 0xFF
    return 1


def _exit_of(exited: dict, size: int) -> SystemExit:
    """The SystemExit simulate() raises once the ranks end, no failure among them: as mpiexec's status, the
    largest of the ranks' (the lowest rank's of those), noting which ranks exited so."""
    first = min(exited, key=lambda r: (-exit_status(exited[r].code), r))
    exc = exited[first]
    alike = sorted(r for r, e in exited.items() if e.code == exc.code)
    where = ("every simulated rank" if len(alike) == size
             else f"simulated {ranks_text(alike)} of {size}")
    return _noted(exc, tuple(alike), f"raised on {where}")


def _noted(exc: BaseException, ranks: tuple, note: str) -> BaseException:
    """`exc` itself, with the ranks that raised it (``simulated_ranks``, for spmdsim.runtime.sim.launch's exit codes)
    and `note` added to its notes, for the caller to raise."""
    try:
        exc.simulated_ranks = ranks  # type: ignore[attr-defined]
    except AttributeError:  # an exception type with __slots__
        pass
    _add_note(exc, note)
    return exc


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``; before Python 3.11, which has no add_note, the same ``__notes__`` list (its
    traceback does not print it). The exception itself is raised on either way: its type, message and
    ``simulated_ranks`` are the rank's on every Python (a wrapper would turn a rank's ValueError into
    another type, and its error's exit code into the one of an error on some ranks)."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
        return
    try:
        exc.__notes__ = [*getattr(exc, "__notes__", ()), note]  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # an exception type with __slots__
        pass


def current_rank() -> Optional[int]:
    """The simulated rank running this code, or None outside simulate()."""
    state = _local.simulated()
    return None if state is None else state.rank


def note_exit(code: int, call: str = "sys.exit") -> None:
    """Note that this simulated rank's program exits with `code` by `call` (spmdsim mpirun's sys.exit or
    os._exit): a deadlock report then says 'rank 1 exited (sys.exit(3))' instead of 'rank 1 finished'."""
    state = _local.simulated()
    if state is not None and code and not state.dry_run:  # (a dry run reports no deadlock)
        world = state.comm._group.world
        with world.lock:
            world.exits[state.rank] = f"{call}({code})"
