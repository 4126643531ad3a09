"""Never hang: an exception on some ranks ends the whole MPI job (docs/explanation/runtime.md, "Never hang").

An SpmdsimError raised on every rank within `GRACE_S` is a clean error (rank 0
prints ``spmdsim: error: ...``, every rank exits 2; 1 for collectives that differ, a DivergenceError: no bad
input); a SystemExit on every rank
passes; anything else prints ``spmdsim: error on rank R: ...`` and aborts the
job. Under spmdsim.simulate exceptions pass: simulate() stops every rank.

Ranks find out whether all of them failed with a nonblocking barrier on a
private duplicate of the communicator (made when the guard is set up, so setting
it up is collective); a barrier on the user's communicator could match the
nonblocking collectives of healthy ranks.

Ctrl-C is handled on a thread of its own (`_watch_ctrl_c`): a rank inside a
blocking MPI call (the busy wait) runs no Python until the call returns, so
it could not take part in the all-ranks agreement from its main thread.

Set up for the first time on a rank, the guard also tunes its process once
(runtime.process: BLAS threads, freed heap kept, the memory watch), since every
program of spmdsim's sets it up before its MPI work.
"""
from __future__ import annotations

import functools
import os
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable, NoReturn

from ..errors import DivergenceError, SpmdsimError, fold_message, mark_guarded
from ..base.context import simulated as _simulated
from ..base.output import ready_output
from ..base.sizes import out_of_memory
from ..base.threads import launched
from .engines import advised, engine_of, world
from .process import (_PRIVATE, FORWARD_S, abort_job, release_segments_once, release_shared_segments,
                      tune_mpi_process)

__all__ = ["abort_on_error", "install_excepthook", "run_guarded", "handle_exception", "release_shared_segments"]

#: Seconds ranks wait for each other to agree that all of them failed (tests lower it).
GRACE_S = 3.0

_CTRL_C = threading.Event()  # set by the Ctrl-C watch when SIGINT reached this process
_WATCHING: list = []  # the Ctrl-C watch's socket pair, once it runs


def _private(comm: Any) -> Any:
    """A duplicate of `comm` kept for the guard's barrier (collective on first use per comm).

    On COMM_WORLD the first time, a second duplicate goes to the Ctrl-C watch (`_watch_ctrl_c`).
    The first time on this rank, its process is tuned (runtime.process: BLAS threads, heap, memory watch).
    """
    entry = _PRIVATE.get(id(comm))
    if entry is None or entry[0] is not comm:
        if not _PRIVATE:
            tune_mpi_process()
        entry = _PRIVATE[id(comm)] = (comm, engine_of(comm).dup(comm))
        from mpi4py import MPI

        if comm is MPI.COMM_WORLD:
            release_segments_once(entry[1])  # on the guard's duplicate: a barrier, then the unlink
        if comm is MPI.COMM_WORLD and comm.Get_size() > 1 and not _WATCHING:
            _watch_ctrl_c(comm, engine_of(comm).dup(comm))  # every rank duplicates; the thread's start may differ
    return entry[1]


def _watch_ctrl_c(comm: Any, signals: Any) -> None:
    """Start the thread that ends the job on Ctrl-C, wherever the main thread is.

    Python's C-level handler writes the signal's number to the wakeup fd at once,
    even while the main thread waits inside MPI; the thread reads it and runs the
    all-ranks agreement (`_interrupted`) on `signals`, its own duplicate of
    COMM_WORLD. Not started (the main thread handles Ctrl-C as before) off the
    main thread, when MPI gives no MPI_THREAD_MULTIPLE, when SIGINT has a handler
    of the program's own, or when another library holds the wakeup fd (asyncio).
    """
    from mpi4py import MPI

    if (threading.current_thread() is not threading.main_thread()
            or MPI.Query_thread() < MPI.THREAD_MULTIPLE
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    if previous != -1:  # another library's: given back, and Ctrl-C stays with the main thread
        signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()
        return
    _WATCHING.append((reader, writer))
    threading.Thread(target=_ctrl_c_watch, args=(reader, comm, signals), name="spmdsim Ctrl-C watch",
                     daemon=True).start()


def _ctrl_c_watch(reader: socket.socket, comm: Any, signals: Any) -> None:
    from mpi4py import MPI

    while True:
        data = reader.recv(64)
        if not data or MPI.Is_finalized():  # the program has ended its MPI: Python handles the rest
            return
        if signal.SIGINT in data:
            _CTRL_C.set()
            _interrupted(comm, signals)


def _world(comm: Any) -> Any:
    if comm is not None:
        return comm
    return world()


def _all_failed(private: Any, grace: float) -> bool:
    """True when every rank of `private` reaches this barrier within `grace` seconds."""
    if private.Get_size() == 1:
        return True
    request = engine_of(private).ibarrier(private)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if request.Test():
            return True
        time.sleep(0.005)
    return False


def handle_exception(exc: BaseException, comm: Any = None, private: Any = None) -> int:
    """Report `exc`; return the exit code of a clean all-ranks SpmdsimError (2; 1 for a DivergenceError, which is
    no bad input), else Abort (Ctrl-C too)."""
    comm = _world(comm)
    rank = comm.Get_rank()
    if isinstance(exc, KeyboardInterrupt):
        if _WATCHING and _CTRL_C.wait(0.5):  # a real Ctrl-C: the watch's thread ends the job
            time.sleep(2 * GRACE_S + FORWARD_S + 5.0)
            abort_job(comm, f"spmdsim: rank {rank} was interrupted (Ctrl-C) and its job did not end\n")
        _interrupted(comm, private)
    if isinstance(exc, MemoryError) and not isinstance(exc, SpmdsimError):
        # Out of memory despite the estimate (spmdsim.programs.memory): one line, no traceback.
        exc = SpmdsimError(out_of_memory(exc))
    if isinstance(exc, SpmdsimError):
        exc = advised(exc, comm.Get_size())
        if private is None:
            private = _private(comm)
        if _all_failed(private, GRACE_S):
            if rank == 0:
                print(fold_message(f"spmdsim: error: {exc}"), file=sys.stderr, flush=True)
            return 1 if isinstance(exc, DivergenceError) else 2
        text = fold_message(f"spmdsim: error on rank {rank}: {exc}") + "\n"
    else:
        detail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        text = fold_message(f"spmdsim: error on rank {rank}: {type(exc).__name__}: {exc}") + f"\n{detail}"
    abort_job(comm, text)


def _interrupted(comm: Any, private: Any) -> NoReturn:
    """Ctrl-C (mpiexec forwards SIGINT to every rank): when every rank lands here within GRACE_S,
    rank 0 says so in one line and the job exits 130; a rank interrupted alone aborts the job.

    No MPI_Finalize (a collective may be half done), so the shared memory segments are unlinked first.
    """
    if private is None:
        private = _private(comm)
    if _all_failed(private, GRACE_S):
        if comm.Get_rank() == 0:
            print("spmdsim: interrupted (Ctrl-C): every rank stopped", file=sys.stderr, flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # Nobody leaves before rank 0 has said so; then rank 0's MPI_Abort ends the job
        # with 130 (an exit of one rank would have mpiexec kill the rest with signal 9,
        # and an Abort on every rank prints a line each). The others wait to be ended.
        _all_failed(private, GRACE_S)
        release_shared_segments()
        if comm.Get_size() == 1 and not launched():
            # One plain process (no launcher): nothing half done with anyone, nobody to end; MPI_Abort
            # would only add MPICH's "Abort(130) on node 0 ..." line to the one above.
            _finalize_and_exit(130)
        time.sleep(FORWARD_S if comm.Get_rank() == 0 else GRACE_S)
        engine_of(comm).abort(comm, 130)
        os._exit(130)  # MPICH's Abort can return before mpiexec ends the job: this rank stops here
    abort_job(comm, f"spmdsim: rank {comm.Get_rank()} was interrupted (Ctrl-C) while other ranks go on\n")


class _GuardExit(SystemExit):
    """The clean exit a guard raises after an all-ranks error; outer guards let it pass."""


def _exit_alone(exc: SystemExit, comm: Any, private: Any) -> None:
    """A SystemExit passes when every rank exits; on some ranks only it aborts the job."""
    if not _all_failed(private, GRACE_S):
        abort_job(comm, f"spmdsim: error on rank {comm.Get_rank()}: exit with code {exc.code!r} "
                        "(SystemExit) while other ranks go on\n")


class abort_on_error:
    """Context manager and decorator: ``with abort_on_error(comm): ...`` (enter it on every rank).

    A clean all-ranks SpmdsimError becomes ``SystemExit(2)`` (1: a DivergenceError); a SystemExit on
    every rank passes; anything else aborts the job.
    """

    def __init__(self, comm: Any = None) -> None:
        self._comm = comm
        self._private: Any = None

    def __enter__(self) -> "abort_on_error":
        if _simulated() is not None:
            return self  # simulate() ends every rank and reports the error
        self._comm = _world(self._comm)
        self._private = _private(self._comm)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None and self._private is None:  # a simulated rank's: the guard's, as `spmdsim mpirun` reads it
            mark_guarded(exc)
        if exc is None or isinstance(exc, (_GuardExit, GeneratorExit)) or self._private is None:
            return False
        if isinstance(exc, SystemExit):
            _exit_alone(exc, self._comm, self._private)
            return False
        code = handle_exception(exc, self._comm, self._private)
        if code:
            raise _GuardExit(code) from None
        return False  # not reached: handle_exception aborts

    def __call__(self, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with abort_on_error(self._comm):
                return fn(*args, **kwargs)

        return wrapper


def install_excepthook(comm: Any = None) -> None:
    """Make an uncaught exception end the whole job (call once, on every rank; nothing under simulate).

    Under simulate (which ends every rank) the rank's context notes it: `spmdsim mpirun` then reports the
    program's SpmdsimError as this hook ends an mpiexec job with it."""
    context = _simulated()
    if context is not None:
        context.guarded = True
        return
    ready_output()  # a closed stdout drops the output; a path printed never raises on an ASCII stdout
    comm = _world(comm)
    private = _private(comm)

    def hook(exc_type: Any, exc: BaseException, tb: Any) -> None:
        code = handle_exception(exc, comm, private)  # Ctrl-C included: one line, exit 130
        if code:
            _finalize_and_exit(code)

    sys.excepthook = hook


def _finalize_and_exit(code: int) -> NoReturn:
    """End this rank with `code` after MPI_Finalize, from inside sys.excepthook.

    C exit(), not os._exit: without MPICH's exit-time cleanup mpiexec reports the rank as killed (signal 9).
    """
    from mpi4py import MPI

    sys.stdout.flush()
    sys.stderr.flush()
    if not MPI.Is_finalized():
        MPI.Finalize()
    try:
        import ctypes

        ctypes.CDLL(None).exit(code)
    finally:
        os._exit(code)


def run_guarded(fn: Callable[[], Any], comm: Any = None) -> int:
    """Run fn() on every rank and return its exit code (int, None = 0); the CLI's MPI commands use it.

    A clean all-ranks SpmdsimError returns 2 (1: a DivergenceError); any other failure aborts the job
    (under spmdsim.simulate exceptions pass to simulate()).
    """
    if _simulated() is not None:
        try:
            return int(fn() or 0)
        except BaseException as exc:  # noqa: BLE001 - passed on to simulate(), noted as the guard's
            mark_guarded(exc)
            raise
    comm = _world(comm)
    private = _private(comm)
    try:
        return int(fn() or 0)
    except _GuardExit:
        raise
    except SystemExit as exc:
        _exit_alone(exc, comm, private)
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure must end the job
        return handle_exception(exc, comm, private) or 1  # (1: not reached, it aborts)
