"""How `spmdsim mpirun` reports simulated ranks that ended badly, as mpiexec reports a failed job
(spmdsim.emulator.mpirun runs them): a deadlock or mismatched collectives in one line, MPI_Abort's code,
the failing rank's traceback from the program down without the emulator's frames where the emulator refused
a call (as mpiexec shows no frames inside the MPI library)."""
from __future__ import annotations

import os
import pickle
import sys
import threading
from typing import Optional

from ..base.sizes import out_of_memory
from ..base.threads import after_rank0_says, launcher_rank, launcher_size
from ..errors import (also_failed, exception_text, fold_message, guarded, RankCountError, RuntimeMismatchError,
                      SpmdsimError)
from ..runtime.engines.memory import DRY_RUN_HINT, MemoryLimitError
from ..runtime.sim.every_rank import every_ranks_line
from ..runtime.sim.thread_limits import ThreadLimitError
from ..runtime.sim.waiting import ranks_text

__all__ = ["REAL_COMM_ONLY", "REAL_COMM_HINT", "program_hook", "under_mpiexec"]


class _NotRunnable(ValueError):
    """A program Python itself refuses once it has started (`python -m no_such_mod`, a folder without
    __main__.py): one line in Python's words, and Python's exit status, 1 (not the launcher's 2)."""


def _report(exc: BaseException, exits: dict, n: int) -> int:
    """Print how the `n` simulated ranks ended (as mpiexec reports a failed job); return the exit code.

    A deadlock or mismatched collectives (where MPI hangs): one line naming the ranks, calls and
    program lines, exit 1 or the largest code a rank exited with. MPI_Abort: one line, its code.
    An SpmdsimError of a program that ran under spmdsim's guard (its excepthook, run_guarded): what the guard
    prints under mpiexec (`_guarded_line`). Any other exception: the failing rank's traceback from the
    program down, exit 1; where it is MPI's error (MPI.Exception), an object receive's (UnpicklingError),
    spmdsim's, or a wrong argument the emulator refused (TypeError, ValueError raised in spmdsim.runtime.sim:
    a str to Send), without the emulator's frames below the program's, as mpiexec shows no frames inside the
    MPI library.
    """
    import traceback  # here: the start of every run (the common case, no error) does not load it

    ranks = getattr(exc, "simulated_ranks", ())
    where = f"simulated {ranks_text(ranks)}" if ranks else "a simulated rank"
    if isinstance(exc, _NotRunnable):  # python -m no_such_mod: Python's one line, its exit status
        print(f"spmdsim mpirun: error: {exc}", file=sys.stderr)
        return 1
    said = _guarded_line(exc, n)
    if said is not None:
        print(fold_message(said[0]), file=sys.stderr)
        for line in _others(exc) if said[1] != 2 else ():
            print(fold_message(line), file=sys.stderr)
        return said[1]
    if isinstance(exc, RuntimeMismatchError):  # a deadlock, collectives that differ, a Mesh of another size
        text = f"spmdsim mpirun: error: {exc}"  # a Mesh's ways to its ranks (mpirun's own): folded to 100 columns
        print(fold_message(text) if isinstance(exc, RankCountError) else text, file=sys.stderr)
        return max([1, *exits.values()])
    code = getattr(exc, "abort_code", None)
    if code is not None:  # comm.Abort(code): MPI ends the job with that code
        print(fold_message(f"spmdsim mpirun: {exc}"), file=sys.stderr)
        return int(code)
    if isinstance(exc, ThreadLimitError):  # the ranks' threads do not fit the process's limits: one line
        text = str(exc).removeprefix("simulate: ").replace(", or a dry run (one thread)", "")
        text = text.replace("fewer ranks", "fewer ranks (-n)", 1)  # (mpirun has no dry run)
        print(fold_message(f"spmdsim mpirun: error: {text}"), file=sys.stderr)
        return 1
    if isinstance(exc, MemoryLimitError):  # the guard stopped every rank: one line, a hint mpirun can take
        text, tail = str(exc), "run fewer ranks or smaller shapes" + DRY_RUN_HINT
        if text.endswith(tail):
            text = text[: -len(tail)] + "run fewer ranks (-n) or a smaller problem (mpirun has no dry run)"
        print(f"spmdsim mpirun: error: {text}", file=sys.stderr)
        return 1
    mpi = sys.modules.get("mpi4py.MPI")
    ours = isinstance(exc, (SpmdsimError, pickle.UnpicklingError, pickle.PicklingError)) or (
        mpi is not None and isinstance(exc, mpi.Exception))
    # (a rank's object that does not pickle: TypeError, or AttributeError for a local function; stdin: EOFError)
    ours = ours or (isinstance(exc, (TypeError, ValueError, OverflowError, AttributeError, EOFError))
                    and _raised_by_emulator(exc))
    ours = ours or getattr(exc, "spmdsim_ends_run", False)  # a call not simulated: refused where the program made it
    name = _class_name(type(exc))
    lines = traceback.TracebackException.from_exception(exc)
    lines.stack = traceback.StackSummary.from_list(_program_frames(exc, ours))
    detail = "".join(lines.format())
    as_mpi4py = getattr(type(exc), "mpi4py_name", None)
    if as_mpi4py:  # a buffer mpi4py refuses: its class's name (BufferError), in the traceback's last line too
        shown = f"\n{type(exc).__module__}.{type(exc).__qualname__}: "
        cut = detail.rfind(shown)
        if cut >= 0:
            detail = f"{detail[:cut]}\n{as_mpi4py}: {detail[cut + len(shown):]}"
        name = as_mpi4py
    shown = "" if getattr(exc, "spmdsim_hooked", False) else detail  # (the program's sys.excepthook showed it)
    text = exception_text(exc)  # (a program's class whose __str__ raises)
    head = f"{name}: {text}" if text else name  # (`raise KeyboardInterrupt`: its name alone, as Python says it)
    print(f"spmdsim mpirun: error on {where}: {head}\n{shown}", file=sys.stderr, end="")
    if isinstance(exc, TypeError) and text.startswith(REAL_COMM_ONLY):
        print(fold_message(REAL_COMM_HINT), file=sys.stderr)
    for line in _others(exc):
        print(fold_message(line), file=sys.stderr)
    return 1


def _guarded_line(exc: BaseException, n: int) -> Optional[tuple]:
    """(line, exit code) for an SpmdsimError (or numpy's MemoryError) the program raised under spmdsim's guard,
    as the guard ends an mpiexec job with it: raised on every rank, 'spmdsim: error: ...' and 2; on some,
    that rank's line and 1 (no traceback either way). None for any other: the simulation's own errors (a
    deadlock, mismatched collectives, limits), the emulator's refusals, a program without the guard."""
    if not guarded(exc) or not isinstance(exc, (SpmdsimError, MemoryError)):
        return None
    if (isinstance(exc, (ThreadLimitError, MemoryLimitError)) or _raised_by_emulator(exc)
            or getattr(exc, "abort_code", None) is not None or getattr(exc, "spmdsim_ends_run", False)
            or (isinstance(exc, RuntimeMismatchError) and not isinstance(exc, RankCountError))):
        return None
    every = every_ranks_line(exc, n)
    if every is not None:
        return f"spmdsim: error: {every}", 2
    ranks = getattr(exc, "simulated_ranks", ())
    where = f"simulated {ranks_text(ranks)}" if ranks else "a simulated rank"
    text = str(exc) if isinstance(exc, SpmdsimError) else out_of_memory(exc)
    return f"spmdsim: error on {where}: {text}", 1


def program_hook(exc: BaseException, before: object) -> None:
    """On the rank whose program raised `exc`: call the sys.excepthook the program set (one other than `before`,
    the hook when the run started), as python calls it with an uncaught exception (under mpiexec in the failing
    rank's process), its traceback from the program's first frame; where the hook itself raises, python's two
    reports. The run's report then leaves the traceback out."""
    if sys.excepthook is before:
        return
    import traceback

    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(_PACKAGE):
        tb = tb.tb_next
    try:
        sys.excepthook(type(exc), exc, tb or exc.__traceback__)
    except Exception as failed:  # noqa: BLE001 - as python reports a failing hook (its frames from the hook's)
        print("Error in sys.excepthook:", file=sys.stderr)
        traceback.print_exception(type(failed), failed, failed.__traceback__.tb_next, chain=False)
        print("\nOriginal exception was:", file=sys.stderr)
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
    try:
        exc.spmdsim_hooked = True  # type: ignore[attr-defined]
    except AttributeError:  # (a class without a __dict__: its traceback is shown again)
        pass


def _class_name(kind: type) -> str:
    """A failed rank's exception class as a program names it: MPI.Exception for MPI's errors (mpi4py's
    class, whatever its module), else the class's own name."""
    mpi = sys.modules.get("mpi4py.MPI")
    return "MPI.Exception" if mpi is not None and issubclass(kind, mpi.Exception) else kind.__name__


def _others(exc: BaseException) -> list:
    """A line for each rank that failed otherwise than the one reported (mpiexec prints every rank's
    traceback; only the lowest failing rank's is shown here, whatever rank failed first)."""
    return also_failed(exc, "spmdsim mpirun", "rank", _class_name)


#: How mpi4py's C code refuses a simulated communicator where it takes a real one only (its own type check).
REAL_COMM_ONLY = "Argument 'comm' has incorrect type (expected mpi4py.MPI.Comm, got "
#: What mpirun adds to that refusal: the calls are those of this process's MPI datatype library (a simulated
#: rank's MPI.INT is MPI's own), whose three packing calls that name a communicator are the usual cause.
REAL_COMM_HINT = ("spmdsim mpirun: this mpi4py call takes a real MPI communicator, and a simulated rank's are "
                  "spmdsim's: MPI's own Datatype.Pack, Unpack and Pack_size are such calls; "
                  "Pack_external('external32', ...), Unpack_external and Pack_external_size take no communicator "
                  "and run on simulated ranks (or run the program under mpiexec)")


def _raised_by_emulator(exc: BaseException) -> bool:
    """Whether `exc` was raised in the emulator's code or the thread engine's under it (its innermost frame,
    in spmdsim.emulator or spmdsim.runtime.sim), called from the program."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    here = os.path.dirname(os.path.abspath(__file__))
    ours = (here + os.sep, os.path.join(os.path.dirname(here), "runtime", "sim") + os.sep)
    return bool(frames) and frames[-1].filename.startswith(ours)


def _program_frames(exc: BaseException, trim_emulator: bool) -> list:
    """The frames of `exc`'s traceback from the program's first on (the launcher's are dropped);
    with `trim_emulator`, also without spmdsim's frames below the program's last."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    mine = [i for i, f in enumerate(frames) if not f.filename.startswith(package)]
    if not mine:  # the program never ran: its own SyntaxError (its file, line and caret) as Python prints it
        return [] if isinstance(exc, SyntaxError) else list(frames)
    kept = frames[mine[0]:mine[-1] + 1] if trim_emulator else frames[mine[0]:]
    # An import of the program's own module runs it through importlib and the rank's loader (rank_modules):
    # as Python leaves importlib's frames out of an import's traceback, both are left out
    loader = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_modules.py")
    return [f for f in kept if not f.filename.startswith("<frozen importlib") and f.filename != loader]


def interrupted(exc: KeyboardInterrupt, exits: dict, n: int, failures: list) -> int:
    """A KeyboardInterrupt that ended the run: one a rank's program raised (no one pressed Ctrl-C) is its error,
    reported as any other, with Python's exit status for it, 130, as under ``mpiexec ... python -m mpi4py``
    (return 130); Ctrl-C is said in one line, with the ranks that had failed before it (return 0: the caller
    stops the ranks)."""
    if getattr(exc, "simulated_ranks", ()):
        _report(exc, exits, n)
        return 130
    print("spmdsim mpirun: interrupted (Ctrl-C): the simulated ranks were stopped", file=sys.stderr)
    failed_before(failures)
    return 0


def failed_before(failures: list) -> None:
    """A line for each rank whose program had raised when a signal stopped the run (the others, computing
    outside MPI, had not met the failure yet: its report, made when they do, never came), with its line."""
    for rank, exc in sorted(failures, key=lambda pair: pair[0])[:8]:
        text = _first_line(exc)
        print(fold_message(f"spmdsim mpirun: rank {rank} had failed{_where(exc)}: {_class_name(type(exc))}"
                           + (f": {text}" if text else "")), file=sys.stderr)


def _where(exc: BaseException) -> str:
    """" at prog.py:4": the program's innermost line in `exc`'s traceback (spmdsim's frames left out)."""
    import traceback  # (a failed run's report only)

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_PACKAGE)]
    return f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""


def _first_line(exc: BaseException) -> str:
    text = exception_text(exc)
    return text.splitlines()[0] if text.strip() else ""


#: spmdsim's own folder: its frames are left out of where a rank failed.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


class FailureNotice:
    """Says a rank's failure at once when the run does not end soon after it (`SOON` seconds): the other ranks
    stop at their next MPI call, and one computing outside MPI for minutes kept the failure unsaid all that
    while (mpiexec prints the failing process's traceback as it fails). A run that ends within SOON says
    nothing more than its report."""

    SOON = 2.0

    def __init__(self, failures: list) -> None:
        self.failures, self.timer, self.lock = failures, None, threading.Lock()
        self.hook = sys.excepthook  # the run's start's: a hook other than it is the program's (`program_hook`)

    def failed(self) -> None:
        """A rank's program raised (its exception is in `failures`): time the notice, once."""
        with self.lock:
            if self.timer is None:
                self.timer = threading.Timer(self.SOON, self._say)
                self.timer.daemon = True
                self.timer.start()

    def _say(self) -> None:
        rank, exc = self.failures[0]
        print(fold_message(f"spmdsim mpirun: rank {rank} failed{_where(exc)}: {_class_name(type(exc))}: "
                           f"{_first_line(exc)}; the other ranks stop at their next MPI call"), file=sys.__stderr__)

    def close(self) -> None:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()


def under_mpiexec() -> int:
    """0 when this process runs alone, else 2 (rank 0 saying why in one line): mpiexec started it among several,
    each of which would run every simulated rank (`mpiexec -n 2 spmdsim mpirun -n 4 ...`: the output twice)."""
    launched = launcher_size()
    if launched <= 1:
        return 0
    if launcher_rank() == 0:
        print(fold_message(f"spmdsim mpirun: error: mpiexec started {launched} processes, and each would run every "
                           "simulated rank; run spmdsim mpirun without mpiexec, or the program under mpiexec alone "
                           f"(mpiexec -n {launched} python prog.py)"), file=sys.stderr)
    return after_rank0_says(2)
