"""An unmodified mpi4py program on N simulated ranks in this process: ``spmdsim mpirun -n 8 python script.py``.

    spmdsim mpirun -n 8 python script.py ARGS...
    spmdsim mpirun -n 8 python folder_or_zip ARGS...            (its __main__.py, as python runs it)
    spmdsim mpirun -n 4 python -m package.module ARGS...
    spmdsim mpirun -n 4 python -m mpi4py script.py ARGS...     (mpi4py's runner: the same)
    spmdsim mpirun -n 4 python -c "from mpi4py import MPI; ..."
    python -m spmdsim.emulator.mpirun -n 8 script.py ARGS...

Every rank runs the script in its own thread with its own globals
(``__name__ == "__main__"``); inside it ``from mpi4py import MPI; MPI.COMM_WORLD``
is that rank's simulated world (spmdsim.emulator.mpi4py_world). As under mpiexec,
each rank has its own copy of the program's own modules (those in the script's
folder: spmdsim.emulator.rank_modules) and its own `random` and `numpy.random`
module-level generators (spmdsim.emulator.rank_random), and stdin goes to rank 0;
other modules are loaded once and shared by the ranks. The exit code is the largest of the ranks' exit
statuses, each ``sys.exit`` code as the OS reports a process's (its low 8 bits: ``sys.exit(-1)`` is 255:
spmdsim.runtime.sim.run.exit_status). Where MPI would hang or abort, one report (docs/howto/simulate.md): a
deadlock in one line naming each waiting rank's call and program line; an
exception on a rank stops every rank and is printed with the rank that raised
it and its traceback from the program on (exit 1; an SpmdsimError of a program under spmdsim's guard: the
guard's one line, exit 2 where every rank raised it, as under mpiexec); messages never received,
requests never completed (no Wait or Test) and send buffers written before their
send completed are warnings.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import os
import shlex
import signal
import sys
import threading
import time
from typing import Any, Iterator, Optional, Sequence

from .rank_modules import own_main, own_modules
from ..runtime.sim.run import current_rank, exit_status, note_exit, simulate
from .rank_random import adopt, own_generators
from ..base import context as _local
from ..runtime.sim.os_exit import OsExit, os_exit_ends_the_rank
from ..runtime.sim.simulating import whole_lines
from ..errors import fold_message, mark_guarded, SpmdsimError
from .mpi4py_world import swapped
from ..runtime.mpi_library import MPILibraryError, load_mpi
from ..base.malloc import keep_freed_buffers_unless_set
from ..base.output import quiet_stdout
from ..base.typed_numbers import byte_count
from .mpirun_report import FailureNotice, _NotRunnable, _report, failed_before, interrupted, program_hook
from .mpirun_target import _refused, _target
from .rank_program import run_program
from .rank_streams import StdinOfRankZero

__all__ = ["main", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # -n is required, but checked by `run`, which can say where it went: after the program it is the program's
    parser.usage = "%(prog)s [-h] -n N [--eager-limit BYTES] [--oversubscribe] ..."
    parser.add_argument("-n", "-np", "--np", dest="ranks", type=int, metavar="N",
                        help="number of simulated ranks (before the program: what follows it is its own)")
    parser.add_argument("--eager-limit", type=byte_count, metavar="BYTES",
                        help="standard Sends under BYTES bytes are buffered, the others wait for their receive "
                             "(a count or a size such as 8K or 1M; default 8K, 8192, as MPICH's); 0: none is, so a "
                             "program relying on MPI buffering its Sends (unsafe) deadlocks")
    parser.add_argument("--oversubscribe", action="store_true",
                        help="accepted as Open MPI's mpirun takes it: simulated ranks share this process's cores "
                             "anyway")
    parser.add_argument(*LAUNCH_ONLY, dest="launch_only", nargs=1, action=_LaunchOnly, help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="[python [-u]] script.py ARGS... or [python] -m module ARGS...")


#: mpiexec's options that place ranks on hosts and cores (MPICH's and Open MPI's), which simulated ranks have no
#: use for: refused in one line saying so (argparse reads `-host` as `-h ost`: "ignored explicit argument 'ost'").
LAUNCH_ONLY = ("-host", "--host", "-hosts", "-hostfile", "--hostfile", "--machinefile", "-ppn", "-bind-to",
               "--bind-to", "--map-by")  # (no -m...: `-m module` is the program's form)


class _LaunchOnly(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> None:
        # (quoted as a shell would take it: `-host ""` said "-host  says", the value unseen)
        parser.error(f"{option_string} {shlex.quote(values[0])} says where mpiexec starts its ranks; simulated ranks "
                     "all run in this process: leave it out (spmdsim mpirun takes -n N, --eager-limit and "
                     "--oversubscribe)")


def _rank(kind: str, what: str, exits: dict, failures: list, notice: FailureNotice, ends: tuple) -> int:
    """`run_program` (spmdsim.emulator.rank_program), noting a non-zero exit code (in `exits`, and for deadlock
    reports: 'rank 1 exited (sys.exit(3))'); return the rank's exit status as the OS reports a process's: the
    code's low 8 bits (sys.exit(-1) is 255 under mpiexec, where the largest of a negative code and the others' 0
    would be 0). `ends`: (a count of the ranks whose program ended, the number of ranks), for
    `_threads_still_run`. A program the rank spawns (spmdsim.emulator.spawn) runs so too, on ranks of its own."""
    adopt()  # a process of its own: its own random and numpy.random generators
    state = _local.current()
    state.launcher = _local.MPIRUN  # how its world started: its errors' ways to more ranks say mpirun's
    state.programs = functools.partial(_rank, exits=exits, failures=failures, notice=notice, ends=ends)
    try:
        code = run_program(kind, what)
    except OsExit as exc:  # os._exit(code): the rank ends at once (no finally of its own runs further up)
        code, call = exc.code, "os._exit"
    except Exception as exc:  # noted for a Ctrl-C or SIGTERM that stops the others before the run reports it
        failures.append((current_rank(), exc))
        if _local.current().guarded:  # the program installed spmdsim's excepthook: its report is the hook's
            mark_guarded(exc)
        if not isinstance(exc, SpmdsimError) and getattr(exc, "abort_code", None) is None:  # the program's own
            notice.failed()  # (a deadlock's, a mismatch's or an Abort's report comes at once anyway)
            program_hook(exc, notice.hook)
        raise
    else:
        call = "sys.exit"
    _threads_still_run(*ends)
    if code:
        note_exit(code, call)  # as the program wrote it: sys.exit(-1)
    status = exit_status(code)
    if status:
        exits[current_rank()] = status
    return status


#: How long after every rank's program ended threads the ranks started may still run before the run says it
#: waits for them.
STILL_RUNNING_S = 2.0


def _threads_still_run(ended: Iterator[int], n: int) -> None:
    """As a rank's program ends: the last of the `n` says in one line when threads the ranks started (no
    daemons) still run STILL_RUNNING_S later. The run waits for them, as Python's exit waits for them under
    mpiexec (`mpiexec -n 2 python prog.py` hangs on one that computes forever, before MPI_Finalize), where it
    waited without a word: one that ends after an hour is no hang, so the run does not end them. Those waiting
    in MPI are not counted: where all of them do, the ranks' ends report their deadlock. With ranks spawned, the
    last is the one that makes the count every rank of the run (spmdsim.runtime.sim.rank_runs)."""
    runs = _local.current().comm._group.world.runs
    if next(ended) != (n if runs is None else runs.ranks) or not _computing():
        return
    deadline = time.monotonic() + STILL_RUNNING_S
    while time.monotonic() < deadline and _computing():  # (timed joins: this rank computes meanwhile)
        _computing()[0].join(min(0.05, max(0.0, deadline - time.monotonic())))
    left = len(_computing())
    if left:
        print(fold_message(f"spmdsim mpirun: every rank's program ended, and {left} thread{'s' if left > 1 else ''} "
                           f"the ranks started (no daemon{'s' if left > 1 else ''}) still run{'' if left > 1 else 's'}"
                           ": the run waits for them, as Python's exit does under mpiexec (Ctrl-C stops them)"),
              file=sys.stderr)


class _Terminated(BaseException):
    """SIGTERM (what `timeout` sends) while the simulated ranks run."""


@contextlib.contextmanager
def _terminated_as_exit() -> Iterator[None]:
    """SIGTERM ends the run as an exception in the main thread, so the process exits normally.

    The emulator imports mpi4py.MPI, which initializes MPICH (its datatypes are the real ones):
    Python's default SIGTERM ends the process at once, without MPI_Finalize, and MPICH's
    /dev/shm/mpich_shm_* segment stayed behind; a normal exit finalizes and removes it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise _Terminated()

    before = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _stopped(code: int) -> int:
    """`code`, once SIGTERM or Ctrl-C stopped the ranks; where a thread a rank started still runs (no daemon:
    Python's exit waits for it), the process ends now, its output flushed, as the signal ends an MPI process
    with its threads (a terminated run went on until `timeout -k` killed it)."""
    main = threading.main_thread()
    if any(t is not main and t.is_alive() and not t.daemon for t in threading.enumerate()):
        _exit_now(code)
    return code


#: After a failed run was reported, how long the threads its ranks started get to end (one that calls MPI ends
#: there) before the process exits without them.
LEFT_RUNNING_S = 1.0


def _failed(code: int) -> int:
    """`code`, once a failed run (an Abort, an exception, a deadlock) was reported; where threads the ranks
    started (no daemons: Python's exit waits for them) still run LEFT_RUNNING_S later, computing without a call
    to MPI, the process exits now with `code`, saying how many it left, as MPI_Abort ends every process with its
    threads (Python's exit waits for them: the report printed, the process would never exit; under mpiexec a
    rank that raised waits for them forever)."""
    deadline = time.monotonic() + LEFT_RUNNING_S
    for thread in _rank_started():
        thread.join(max(0.0, deadline - time.monotonic()))
    left = len(_rank_started())
    if left:
        print(fold_message(f"spmdsim mpirun: {left} thread{'s' if left > 1 else ''} the ranks started still ran "
                           f"{LEFT_RUNNING_S:g} s after the run failed: the process exits without waiting for "
                           f"{'them' if left > 1 else 'it'}"), file=sys.stderr)
        _exit_now(code)
    return code


def _ranks(n: int, args: tuple, eager_limit: Optional[int]) -> Any:
    """simulate() of `_rank` with `args` (kind, what, exits, ...) on `n` ranks, called while mpi4py.MPI is the ranks'
    (swapped); or, where a failed run leaves threads running (a rank's own, computing outside MPI when the run
    ended: World.given_up; one a rank started, no daemon), its exit code, the run reported here, their prints whole
    lines: once mpi4py.MPI is this process's again, such a thread goes on with the real MPI (mpi4py.futures' pool,
    left waiting on a rank, spawned real processes). One still running after `_failed` ends the process now."""
    with whole_lines(n):  # simulate's own, held while a failed run is reported: the ranks left print on
        try:
            return simulate(n, _rank, *args, eager_limit=eager_limit)
        except (_Terminated, BrokenPipeError, KeyboardInterrupt):
            raise
        except BaseException as exc:  # noqa: BLE001 - reported as mpiexec reports a failed rank
            if not _left_running():
                raise
            code = _failed(_report(exc, args[2], n))
            if _left_running():
                _exit_now(code)
            return code


def _left_running() -> bool:
    """Whether a simulated rank's own thread (spmdsim.runtime.sim.run names it "spmdsim rank N") or a thread a
    rank started that is no daemon (`_rank_started`) still runs."""
    return bool(_rank_started()) or any(t.is_alive() and t.name.startswith("spmdsim rank ")
                                        for t in threading.enumerate())


def _rank_started() -> list:
    """The live threads the simulated ranks started that are no daemons (spmdsim.emulator.rank_threads)."""
    return [t for t in threading.enumerate()
            if t.is_alive() and not t.daemon and getattr(t, "_spmdsim_key", None) is not None]


def _computing() -> list:
    """`_rank_started()` less those waiting in an MPI call (a deadlock among them is reported at once)."""
    return [t for t in _rank_started() if t._spmdsim_key[1] not in t._spmdsim_key[0].waiting]


def _exit_now(code: int) -> None:
    """End the process with `code` now, its output flushed, whatever threads still run."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def _cannot_start() -> int:
    """0 when the ranks can start, else the exit code, the reason printed in one line: no MPI library to take
    mpi4py's constants from (1), or a bad SPMDSIM_CHECK or SPMDSIM_WATCHDOG (2: every rank would raise it, and
    the run printed their traceback where `spmdsim demo` says it in one line)."""
    from ..runtime.debug import HOOKS, Hooks  # (not loaded at start-up: a plain program's run needs none of it)

    try:  # the ranks send nothing through the library, but their MPI module is mpi4py's, swapped
        load_mpi(why="spmdsim mpirun's ranks take MPI's constants, datatypes and exceptions from it")
    except MPILibraryError as exc:
        print(fold_message(f"spmdsim mpirun: error: {exc}"), file=sys.stderr)
        return 1
    settings = Hooks(HOOKS)  # a copy: read here only to refuse a bad value, as each rank reads it again
    try:
        settings.check_enabled()
        settings.watchdog_seconds()
    except SpmdsimError as exc:
        print(fold_message(f"spmdsim mpirun: error: {exc}"), file=sys.stderr)
        return 2
    return 0


def run(n: int, command: Sequence[str], eager_limit: Optional[int] = None) -> int:
    """Run `command` (see _target) on `n` simulated ranks, standard Sends of `eager_limit` bytes or more waiting
    for their receive (None: simulate's default, 8 KiB); return the exit code."""
    refused = _refused(n, command, eager_limit)
    if refused:
        return refused
    try:
        kind, what, argv = _target(command)
    except ValueError as exc:
        print(fold_message(f"spmdsim mpirun: error: {exc}"), file=sys.stderr)
        return 1 if isinstance(exc, _NotRunnable) else 2
    refused = _cannot_start()
    if refused:
        return refused
    if kind in ("path", "main"):  # once, here: a rank's os.chdir before a later rank starts moved a relative one
        what = os.path.abspath(what)
    saved_argv, saved_path, saved_stdin, saved_hook = sys.argv[:], sys.path[:], sys.stdin, sys.excepthook
    # A program's `mpi4py.rc.errors = ...` (mpi4py's init-fini demos) dies with its process under mpiexec:
    # here the ranks share this process's mpi4py.rc, so the run's settings are undone after it.
    import mpi4py

    rc = mpi4py.rc
    saved_rc = dict(vars(rc))
    sys.argv[:] = argv
    sys.stdin = StdinOfRankZero(saved_stdin)
    sys.path.insert(0, os.path.dirname(os.path.abspath(what)) if kind == "path" else
                    os.path.abspath(what) if kind == "main" else "" if kind == "code" else os.getcwd())
    exits: dict = {}
    failures: list = []  # (rank, exception) as each rank's program raised it (`_rank`)
    notice = FailureNotice(failures)
    # Freed buffers stay in the ranks' heaps, as under a --ranks run: a message's copies (a nonblocking send's
    # check of its buffer, a deferred receive's held bytes) otherwise fault their pages in again every message
    keep_freed_buffers_unless_set()
    try:
        with swapped(), own_generators(), own_modules(sys.path[0] or os.getcwd()), \
                own_main(), _terminated_as_exit(), os_exit_ends_the_rank():
            codes = _ranks(n, (kind, what, exits, failures, notice, (itertools.count(1), n)), eager_limit)
            if type(codes) is int:  # a failed run, reported
                return codes
    except _Terminated:
        print("spmdsim mpirun: terminated (SIGTERM): the simulated ranks were stopped", file=sys.stderr)
        failed_before(failures)
        return _stopped(143)
    except BrokenPipeError:  # stdout closed early (`| head`): stop quietly, as a shell tool does on SIGPIPE
        quiet_stdout()
        return 141
    except KeyboardInterrupt as exc:  # Ctrl-C (said, then stopped), or a rank's program raised it: its report
        code = interrupted(exc, exits, n, failures)
        return _failed(code) if code else _stopped(130)
    except BaseException as exc:  # noqa: BLE001 - reported as mpiexec reports a failed rank
        return _failed(_report(exc, exits, n))
    finally:
        notice.close()
        sys.argv[:], sys.path[:], sys.stdin, sys.excepthook = saved_argv, saved_path, saved_stdin, saved_hook
        vars(rc).clear()
        vars(rc).update(saved_rc)
    # MPI leaves unreceived messages undefined (MPICH drops small ones silently), requires requests completed or
    # freed (MPICH: "Builtin communicator 44000000 has pending 1 references"), no write to a pending send's buffer
    for lines in (codes.unreceived, codes.uncompleted, codes.rewritten):
        if lines:
            more = f"; and {len(lines) - 3} more" if len(lines) > 3 else ""
            print(f"spmdsim mpirun: warning: when the ranks ended, {'; '.join(lines[:3])}{more}", file=sys.stderr)
    return max(codes)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spmdsim.emulator.mpirun", description=__doc__.splitlines()[0])
    add_arguments(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) > 2 and argv[0] in ("-n", "-np", "--np") and argv[2] == "-m":
        argv.insert(2, "python")  # argparse takes a leading -m for an option of its own
    args = parser.parse_args(argv)
    return run(args.ranks, args.command, args.eager_limit)


if __name__ == "__main__":
    sys.exit(main())
