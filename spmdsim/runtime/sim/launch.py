"""Commands and scripts on simulated ranks: ``--ranks N`` for the CLI and the examples.

    spmdsim demo --ranks 8
    python examples/mlp.py --ranks 8

`run_on_ranks(n, fn)` runs `fn()` on n simulated ranks and turns the outcome
into an exit code the way the MPI guard does: the ranks' own codes (the
largest), 2 with one line for an SpmdsimError (or MemoryError) every rank
raised, whatever each one's text or class, else 1 with the failing rank named.
`script(__file__)` lets a script take ``--ranks N``.
"""
from __future__ import annotations

import builtins
import contextlib
import io
import os
import runpy
import sys
import traceback
from typing import Any, Callable, Optional, Sequence

from ...base.interrupts import keep_ctrl_c
from ...base.malloc import keep_freed_buffers_unless_set
from ...base.output import is_output_failure, output_error, quiet_stdout, ready_output
from ...base.ranks import is_ranks_flag
from ...base.sizes import out_of_memory
from ...base.threads import after_rank0_says, launched, launcher_rank, launcher_size
from ...errors import DivergenceError, SpmdsimError, also_failed, exception_text, fold_message
from ...base import context as _local
from ..engines import ways_out
from ..engines.memory import MemoryLimitError
from .thread_limits import ThreadLimitError, threads_problem  # a thread each: the stacks must fit
from .waiting import ranks_text
from .engine import DeadlockError
from .every_rank import every_ranks_line
from .run import MAX_DRY_RANKS, MAX_RANKS, current_rank, exit_status, note_exit, simulate
from .os_exit import OsExit, os_exit_ends_the_rank
from ..mpi_library import MPILibraryError, load_mpi

__all__ = ["run_on_ranks", "script", "ranks_argument", "note_mpiexec_flags", "banner", "ways_out"]


def banner(n: int, dry_run: bool = False) -> str:
    """The first line of a simulated run: says it is one process, not an MPI job."""
    what = "a dry run (shapes only) on" if dry_run else "running on"
    ranks = "1 simulated rank" if n == 1 else f"{n} simulated ranks"
    return f"spmdsim: {what} {ranks} in one process (--ranks {n}), no mpiexec"


#: The refusal of --dry-run without --ranks N, from the CLI, the examples and the training scripts.
DRY_RUN_NEEDS_RANKS = "--dry-run needs --ranks N (a dry run simulates the ranks in this process)"


def ranks_problem(n: Any, dry_run: bool = False) -> Optional[str]:
    """Why `n` cannot be a ``--ranks`` count (one line for "spmdsim: error: "), or None."""
    most = MAX_DRY_RANKS if dry_run else MAX_RANKS
    if type(n) is int and 1 <= n <= most:
        if dry_run:
            return None
        return threads_problem(n)
    more = f" (with --dry-run up to {MAX_DRY_RANKS})" if not dry_run and type(n) is int and n > most else ""
    return f"--ranks {n!r} must be a number of ranks from 1 to {most}{more}, e.g. --ranks 8"


def launched_problem(n: int) -> Optional[str]:
    """Why ``--ranks`` `n` cannot run here, or None: mpiexec started several processes, and each would run all
    `n` ranks (n x launched, the output repeated). The examples ask it before their own checks of `n` ranks, so
    that `mpiexec -n 4 ... --ranks 64` says --ranks is the mistake, not why 64 ranks do not fit the model."""
    launched = launcher_size()
    if launched <= 1:
        return None
    return (f"--ranks {n} simulates the ranks in one process, but mpiexec started {launched}; leave out --ranks "
            f"under mpiexec (mpiexec -n {n} ...), or run without mpiexec")


def run_on_ranks(n: int, fn: Callable[[], Any], dry_run: bool = False, as_json: bool = False,
                 dry_codes: tuple = ()) -> int:
    """Run `fn()` on `n` simulated ranks; return the exit code (see the module docstring).

    A dry run prints its report (a table, or JSON) instead of the program's output, and exits 0 unless the
    ranks' code is one of `dry_codes`, those that do not depend on values (the demo's 3: every scenario skipped).
    A count that cannot be is refused in one line before anything else (exit 2).
    """
    problem = ranks_problem(n, dry_run)
    if not problem:
        problem = launched_problem(n)  # --ranks under mpiexec: every process refuses; one says so
        if problem and launcher_rank() != 0:
            return after_rank0_says(2)
    if problem:
        print(fold_message(f"spmdsim: error: {problem}"), file=sys.stderr)
        return 2

    keep_ctrl_c()  # a Ctrl-C that lands in a weakref callback still stops the run (spmdsim.base.interrupts)
    ready_output()  # a closed stdout drops the output; a path printed never raises on an ASCII stdout
    try:  # With --json, stdout is the JSON document alone: the banner goes to stderr.
        print(banner(n, dry_run), file=sys.stderr if as_json else sys.stdout, flush=True)
    except BrokenPipeError:  # a reader gone before it (`| true`) ends the run as one gone later (`| head -1`)
        quiet_stdout()
        return 141
    except OSError as exc:  # a full disk under `> file`: as a rank's failed write ends the run
        quiet_stdout()
        print(f"spmdsim: error: {output_error(exc)}", file=sys.stderr)
        return 1
    exits: dict = {}  # rank -> its exit status, where not 0
    try:
        if dry_run:
            with contextlib.redirect_stdout(io.StringIO()):  # values of a dry run are not results
                codes = simulate(n, _exit_code, fn, exits, dry_run=True)
            print(codes.report.to_json() if as_json else codes.report.table())
            code = max(codes)  # a check on shapes alone fails (no values): passed on only when in dry_codes
            return code if code in dry_codes else 0
        keep_freed_buffers_unless_set()  # the program's process, as an MPI rank's (tune_mpi_process)
        with os_exit_ends_the_rank():  # a rank's os._exit ends it alone, named where others wait for it
            codes = simulate(n, _exit_code, fn, exits)
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly, as a shell tool does on SIGPIPE
        quiet_stdout()
        return 141
    except KeyboardInterrupt as exc:  # simulate() stopped every rank at its next wait
        if getattr(exc, "simulated_ranks", None):  # raised by a rank's program, not Ctrl-C: named, as mpirun does
            print(f"spmdsim: error on {_where(exc)}: KeyboardInterrupt\n{_traceback(exc)}", file=sys.stderr, end="")
            return 130
        print("spmdsim: interrupted (Ctrl-C): the simulated ranks were stopped", file=sys.stderr)
        return 130
    except (MemoryLimitError, ThreadLimitError) as exc:  # not one rank's error: the whole simulation's
        print(fold_message(f"spmdsim: error: {exc}"), file=sys.stderr)
        return 1
    except (SpmdsimError, MemoryError) as exc:  # MemoryError: numpy's own (the estimate was off or short)
        if isinstance(exc, (DeadlockError, DivergenceError)):  # no bad input, on every rank too: as mpirun says it
            print(fold_message(f"spmdsim: error: {exc}"), file=sys.stderr)  # (as the MPI guard folds it)
            return max([1, *exits.values()])  # 1, or the largest code a rank exited with (mpiexec's)
        every = every_ranks_line(exc, n)
        if every is not None:  # as the MPI guard: every rank's hook exits 2, rank 0 says why
            print(fold_message(f"spmdsim: error: {every}"), file=sys.stderr)
            return 2
        said = exc if isinstance(exc, SpmdsimError) else out_of_memory(exc)
        print(fold_message(f"spmdsim: error on {_where(exc)}: {said}") + f"\n{_also(exc)}", file=sys.stderr, end="")
        return 1
    except Exception as exc:  # noqa: BLE001 - reported as the MPI guard reports it
        if is_output_failure(exc):  # a full disk under `> file` (--json prints in one write): as main says it
            quiet_stdout()
            print(f"spmdsim: error: {output_error(exc)}", file=sys.stderr)
            return 1
        print(fold_message(f"spmdsim: error on {_where(exc)}: {type(exc).__name__}: {exception_text(exc)}") +
              f"\n{_traceback(exc)}{_also(exc)}",
              file=sys.stderr, end="")
        return 1
    return max(codes)


def _also(exc: BaseException) -> str:
    """A line for each simulated rank that failed otherwise than `exc`, the error reported (the first four, then
    how many more), as mpiexec shows every rank's error: '' where none did."""
    return "".join(f"{line}\n" for line in also_failed(exc, "spmdsim", "simulated rank"))


def _exit_code(fn: Callable[[], Any], exits: dict) -> int:
    """`fn()`'s exit status; a sys.exit or os._exit ends this rank alone, as its MPI process, noted in `exits` and
    for deadlock reports ('rank 1 exited (sys.exit(3))', as spmdsim mpirun says it)."""
    call = ""
    try:
        code = fn()
    except SystemExit as exc:
        code, call = exc.code, "sys.exit"
    except OsExit as exc:
        code, call = exc.code, "os._exit"
    if not (code is None or isinstance(code, int)):
        print(code, file=sys.stderr)
    status = exit_status(code)  # sys.exit(-1) on one rank is 255, as under mpiexec, not lost to the others' 0
    if call:
        note_exit(code if code is None or isinstance(code, int) else status, call)
    if status:
        exits[current_rank()] = status
    return status


#: Where the frames of the simulation itself lie: a traceback starts after them, at the program's first. runpy's
#: are "<frozen runpy>" from Python 3.11, its file's before.
_SIMULATION_FRAMES = (os.path.dirname(os.path.abspath(__file__)) + os.sep, "<frozen runpy>", runpy.__file__)


def _traceback(exc: BaseException) -> str:
    """`exc`'s traceback from the program's first frame on: the simulation's (run_on_ranks, simulate, the
    rank's thread, runpy) left out, as a traceback under mpiexec starts at the script; all of it when every
    frame is the simulation's."""
    lines = traceback.TracebackException.from_exception(exc)
    frames = list(lines.stack)
    first = next((i for i, f in enumerate(frames) if not f.filename.startswith(_SIMULATION_FRAMES)), 0)
    lines.stack = traceback.StackSummary.from_list(frames[first:])
    text = "".join(lines.format())
    if not hasattr(lines, "__notes__"):  # Python 3.10's own writes no notes (3.11's does, and under pytest the
        text += "".join(f"{note}\n" for note in getattr(exc, "__notes__", ()))  # exceptiongroup backport's)
    return text


def _where(exc: BaseException) -> str:
    ranks = getattr(exc, "simulated_ranks", ())
    return f"simulated {ranks_text(ranks)}" if ranks else "a simulated rank"


def ranks_argument(parser: Any) -> None:
    """Add ``--ranks N`` (and ``--dry-run``) to an argparse parser."""
    parser.add_argument("--ranks", type=int, metavar="N", default=None,
                        help="run on N simulated ranks in this process (no mpiexec); "
                             "see docs/howto/simulate.md")
    note_mpiexec_flags(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="with --ranks: shapes only, no data; print each rank's bytes sent, "
                             "received and peak bytes held")


def note_mpiexec_flags(parser: Any) -> None:
    """Have a parser of a command that takes --ranks say, of mpiexec's `-n 4` given to it, whose flag that is
    (OnceParser's `elsewhere`), where argparse alone says only "unrecognized arguments: -n 4"."""
    said = "mpiexec's (mpiexec -n N spmdsim ...); here --ranks N simulates N ranks in this process"
    parser.elsewhere = {**getattr(parser, "elsewhere", {}), **{flag: said for flag in ("-n", "-np", "--np")}}


def one_rank_hint(ranks: int) -> str:
    """The line a script written for `ranks` ranks prints on stderr when it runs as one plain process."""
    return (f"spmdsim: 1 rank, no mpiexec: this example is written for {ranks}; add --ranks {ranks} or use "
            f"mpiexec -n {ranks}")


def script(path: str, argv: Optional[Sequence[str]] = None, *, ranks: Optional[int] = None) -> None:
    """With ``--ranks N`` in argv (``--ranks=N``, or a prefix: ``--rank N``), run `path` on N simulated ranks and exit.

    ``--dry-run`` beside it makes that a dry run (spmdsim.runtime.sim.dry). Inside the
    simulation, and without the flag, it returns at once and the script goes on
    (under mpiexec, on its MPI rank, with `install_excepthook()`: an error ends the
    job in one line). `ranks`: the ranks the script is written for (its docstring's ``mpiexec -n N``); run as one
    process (no --ranks, no launcher or ``mpiexec -n 1``) it says on stderr how to get them (`one_rank_hint`), and
    goes on: a 1-rank run otherwise shows no communication without a word. On a simulated rank it notes that the
    program is guarded (as under mpiexec, where it installs the guard): `spmdsim mpirun` reports its SpmdsimError so.
    """
    context = _local.simulated()
    if context is not None:
        context.guarded = True
        return
    args = list(sys.argv[1:] if argv is None else argv)
    n = _take_ranks(args, path)
    if n is None:
        if "--dry-run" in args:  # a dry run asked for and a real run given would be a silent surprise
            if launcher_rank() == 0:  # under mpiexec every rank refuses; one says so
                print(fold_message(f"spmdsim: error: {DRY_RUN_NEEDS_RANKS}"), file=sys.stderr)
            _end(after_rank0_says(2))
        if argv is None and _from_a_cell():  # a kernel's argv is its own (-f kernel.json): say why nothing runs
            print(fold_message(f"spmdsim: script({path!r}) runs nothing: no --ranks N in this session's arguments; "
                               f"give them: spmdsim.script({path!r}, ['--ranks', '8'])"), file=sys.stderr)
            return
        _guard_mpi_ranks()
        if ranks is not None and ranks > 1:
            try:  # no MPI library: the script's spmdsim.world() ends it with that line alone (ways on included)
                load_mpi()
            except MPILibraryError:
                return
            if launcher_size() <= 1:
                print(one_rank_hint(ranks), file=sys.stderr, flush=True)
        return
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):  # not a FileNotFoundError per rank
        print(fold_message(f"spmdsim: error: script: {path!r} is no file: expected the path of the program to run "
                           f"on {n} simulated ranks"), file=sys.stderr)
        _end(2)
    dry_run = "--dry-run" in args
    sys.argv[1:] = [a for a in args if a != "--dry-run"]

    def rank() -> Any:
        runpy.run_path(path, run_name="__main__")

    _end(run_on_ranks(n, rank, dry_run=dry_run))


def _end(code: int) -> None:
    """`script`'s end with exit status `code`, its output and any error line printed: sys.exit(code) in a plain
    run (and in IPython, whose %run shows a SystemExit as before: silent on 0); under ``python -i``'s script
    RanksEnded; at an interactive prompt (the REPL, python -i's), where any SystemExit ends the session,
    PromptRanksEnded: the caller's statement ends, the session goes on. Both are shown as nothing. It returns
    only in a notebook's or ipython's cell after a run that ended 0: the cell goes on."""
    prompt = hasattr(sys, "ps1") and not getattr(builtins, "__IPYTHON__", False)
    if _from_a_cell():  # IPython showed 'SystemExit: 0' and 'To exit: use 'exit', 'quit', or Ctrl-D.'
        if code == 0:
            return  # the cell goes on, as after any call that ran well
        raise PromptRanksEnded(code)  # the cell fails: its lines after this are the ranks' alone
    if not (sys.flags.interactive or prompt):
        sys.exit(code)
    if not getattr(sys.excepthook, "spmdsim_ranks_ended", False):
        sys.excepthook = _ranks_ended_hook(sys.excepthook)
    raise PromptRanksEnded(code) if prompt else RanksEnded(code)


def _from_a_cell() -> bool:
    """Whether `script(path)` runs in IPython called from outside the file `path`: a notebook's or the ipython
    shell's cell (``spmdsim.script("prog.py", ["--ranks", "8"])``), not the file itself under ``%run``."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not script.__code__:
        frame = frame.f_back
    if not getattr(builtins, "__IPYTHON__", False) or frame is None or frame.f_back is None:
        return False
    path = frame.f_locals.get("path")
    return os.path.realpath(frame.f_back.f_code.co_filename) != os.path.realpath(str(path))


class RanksEnded(SystemExit):
    """`script`'s exit once the ranks ran (the rest of the file is the ranks' alone) or it refused. Under ``python -i``
    Python shows an uncaught SystemExit as a traceback and opens its prompt: this one is shown as nothing
    (`_ranks_ended_hook`), the ranks' output and any error line already printed."""


class PromptRanksEnded(BaseException):
    """`script`'s end at an interactive prompt, as RanksEnded's under ``python -i`` (the rest of the statement or
    the exec'd file is the ranks' alone), but no SystemExit: the REPL would end the session. `code`: the ranks'."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code

    def _render_traceback_(self) -> list[str]:
        return []  # IPython's hook: the ranks' output and any error line are above


def _ranks_ended_hook(previous: Callable) -> Callable:
    def hook(exc_type: Any, exc: BaseException, tb: Any) -> None:
        if not isinstance(exc, (RanksEnded, PromptRanksEnded)):
            previous(exc_type, exc, tb)

    hook.spmdsim_ranks_ended = True  # type: ignore[attr-defined]
    return hook


def _guard_mpi_ranks() -> None:
    """Under a launcher, an uncaught error ends the job in one line (install_excepthook), not a traceback per rank;
    in one plain process an uncaught SpmdsimError does too (`_one_line_hook`), other errors keep their traceback."""
    if not launched():
        if not getattr(sys.excepthook, "spmdsim_one_line", False):
            sys.excepthook = _one_line_hook(sys.excepthook)
        return
    try:
        from ..guard import install_excepthook
        install_excepthook()
    except ImportError:  # no mpi4py: nothing to end but this process
        pass


def _one_line_hook(previous: Callable) -> Callable:
    """An excepthook for one plain process: an SpmdsimError (bad input, the wrong rank count: the README's
    `python my_matmul.py` without --ranks) ends it as under --ranks or mpiexec, one line and exit 2; anything
    else goes to `previous` (Python's traceback). In an interactive session (``python -i``, the REPL, where an
    example run with ``exec`` called script) the line is printed and the session goes on: an error is no exit."""

    def hook(exc_type: Any, exc: BaseException, tb: Any) -> None:
        if not isinstance(exc, SpmdsimError):
            previous(exc_type, exc, tb)
            return
        sys.stdout.flush()
        print(fold_message(f"spmdsim: error: {exc}"), file=sys.stderr, flush=True)
        if not (sys.flags.interactive or hasattr(sys, "ps1")):
            sys.exit(2)

    hook.spmdsim_one_line = True  # type: ignore[attr-defined]
    return hook


def _take_ranks(args: list, path: str) -> Optional[int]:
    """The --ranks count `args` give (taken out of them), None where none; one line and exit 2 for a bad count or
    two counts that differ (`--ranks 8 --ranks 4`, as the examples' parsers refuse a flag given twice)."""
    counts = []
    while True:
        i = next((i for i, arg in enumerate(args) if is_ranks_flag(arg)), None)  # a prefix counts, as argparse's
        if i is None:
            break
        arg = args[i]
        value = arg.partition("=")[2] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
        del args[i:i + (1 if "=" in arg else 2)]
        try:  # read as argparse's type=int reads the training examples' --ranks: -1 is -1, not '-1'
            counts.append(int(value))
        except ValueError:  # not a number ('x', '1.5'): quoted as typed
            counts.append(value)
    if not counts:
        return None
    problem = next((f"--ranks given twice, {counts[0]!r} then {c!r}; expected it once" for c in counts[1:]
                    if c != counts[0]), None) or ranks_problem(counts[0], "--dry-run" in args)
    if problem:
        print(fold_message(f"spmdsim: error: {problem}"), file=sys.stderr)
        _end(2)
    return counts[0]
