"""Threads a simulated rank starts run as that rank, as the threads of an MPI process are the process's.

mpi4py initializes MPI with MPI_THREAD_MULTIPLE, which MPICH provides: any thread
of a process may call MPI (mpi4py's demos nxtval-threads and threads/sendrecv.py:
a counter thread serving Recv/Ssend while its rank computes). While `threads_of_ranks()`
is active (spmdsim.emulator.mpi4py_world.swapped), a ``threading.Thread`` started on a
simulated rank runs in that rank's context (its MPI.COMM_WORLD, modules, random
generators) and is counted by the rank's World as a live thread until it ends
(spmdsim.runtime.sim.rank_threads), so a rank waiting for its own thread is no deadlock
and a deadlock is still every live thread waiting; its ``join()`` is a wait the
report names, and the rank's end waits for it unless it is a daemon, as Python's
exit does. A profile function of the rank's marked ``rank_wide`` (the grader's watch of a rank's MPI
calls, spmdsim.tools.lab.calls) runs in its threads too, so a call made in a thread is seen; any other (a
program's own cProfile) stays with the thread that set it, as Python's threads do. Threads started
elsewhere are untouched.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Iterator, Optional

from ..base import context as _local
from ._nesting import Nesting
from ..runtime.sim.thread_engine import THREADS
from ..errors import RuntimeMismatchError
from ..runtime.sim.engine import Aborted
from ..runtime.sim.os_exit import is_rank_thread
from ..runtime.sim.rank_runs import RankThread

__all__ = ["threads_of_ranks", "is_rank_thread"]

_NESTING = Nesting()
_REAL: dict = {}  # "init", "start", "join": threading.Thread's own, while swapped


def _world_of(state: Any) -> Any:
    if state is None or state.engine is not THREADS:  # no rank, or a dry run's
        return None
    return state.comm._group.world


def _init(thread: threading.Thread, *args: Any, daemon: Optional[bool] = None, **kwargs: Any) -> None:
    """Thread.__init__: a thread a rank starts is no daemon unless asked (the rank's own thread is one, so
    that a simulation never holds the process open; its threads take the flag of an MPI process's main
    thread, which is none)."""
    if daemon is None and _world_of(_local.simulated()) is not None and is_rank_thread():
        daemon = False
    _REAL["init"](thread, *args, daemon=daemon, **kwargs)


def _start(thread: threading.Thread) -> None:
    state = _local.simulated()
    world = _world_of(state)
    if world is None or isinstance(thread, RankThread):  # (a rank that a Spawn starts is a rank of its own)
        return _REAL["start"](thread)
    key = world.add_thread(state.rank, thread.daemon)  # live before it starts: its rank may wait at once
    run, profile = thread.run, sys.getprofile()
    if not getattr(profile, "rank_wide", False):
        profile = None

    def run_as_rank() -> None:
        _local.enter(state)
        world.enter_thread(key)
        if profile is not None:
            sys.setprofile(profile)
        try:
            run()
        except (Aborted, RuntimeMismatchError):
            pass  # the simulation stopped (a deadlock, a failed rank): the ranks' own threads report it
        except BaseException as exc:
            if not getattr(exc, "spmdsim_ends_run", False):
                raise  # Python prints it (threading.excepthook) and the rank goes on, as in an MPI process
            world.fail(state.rank, exc)  # a call not simulated: the run ends, reported as the rank's error
        finally:
            if profile is not None:
                sys.setprofile(None)
            _local.leave()
            world.end_thread(key)

    thread.run = run_as_rank
    thread._spmdsim_key = (world, key)
    try:
        _REAL["start"](thread)
    except BaseException:
        world.end_thread(key)
        raise


def _join(thread: threading.Thread, timeout: Optional[float] = None) -> None:
    found = getattr(thread, "_spmdsim_key", None)
    if found is not None and timeout is None and found[0] is _world_of(_local.simulated()):
        found[0].join(found[1])  # a wait the deadlock detector sees
    return _REAL["join"](thread, timeout)


@contextlib.contextmanager
def threads_of_ranks() -> Iterator[None]:
    """Within this block, threads started on simulated ranks are those ranks' (see above); nests."""
    def install() -> None:
        _REAL.update(init=threading.Thread.__init__, start=threading.Thread.start, join=threading.Thread.join)
        threading.Thread.__init__, threading.Thread.start, threading.Thread.join = _init, _start, _join

    def restore() -> None:
        threading.Thread.__init__ = _REAL["init"]
        threading.Thread.start, threading.Thread.join = _REAL["start"], _REAL["join"]
        _REAL.clear()

    with _NESTING(install, restore):
        yield
