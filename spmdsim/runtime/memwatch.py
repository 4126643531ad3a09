"""Under an MPI launcher: end the job before the machine runs out of memory, with one line.

Linux kills the process that holds the most when memory runs out (SIGKILL:
no message; mpiexec then reports a rank "KILLED BY SIGNAL: 9"), often after
minutes of swapping. Each rank started by a launcher runs one daemon thread,
from the guard's first setup on (runtime.process), that reads every `POLL_S` seconds what this process
holds and what the machine (or its cgroup) has left (spmdsim.runtime.engines.memory's
readings, as simulated ranks do). When less than 8% is left (at least 256
MiB) and this rank times the ranks on its node hold 1 GiB or more, it says
so on stderr and calls MPI_Abort: the whole job ends with exit 1. A single
allocation larger than what is left still meets the kernel first.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from .engines import memory

__all__ = ["POLL_S", "problem", "start"]

POLL_S = 0.5
_STARTED: list = []


def problem(rank: int, local_ranks: int) -> Optional[str]:
    """Why rank `rank` (one of `local_ranks` on this node) must end the job now, or None."""
    mine = memory.held()
    if mine is not None and mine * local_ranks < memory.MIN_HELD:
        # Below the line whatever the machine has left, so the machine's figures are read only above
        # it: this process's alone take ~11 us of the GIL per look here, all of them ~60 us.
        return None
    got = memory.short(local_ranks)
    if got is None:
        return None
    held, left, total = got
    gib = memory.gib
    return (f"rank {rank} ended the job before this machine ran out of memory: it holds {gib(held)}, "
            f"{local_ranks} ranks run on this node and {gib(left)} of its {gib(total)} are left; run fewer "
            "ranks or smaller shapes, or a dry run (--ranks N --dry-run: shapes only, each rank's bytes)")


def start(local_ranks: int, end_job: Callable[[Any, str], Any]) -> bool:
    """Start this process's watch (once), which ends the job by `end_job(world, text)`
    (runtime.process's); False when it already runs."""
    if _STARTED:
        return False
    _STARTED.append(True)
    threading.Thread(target=_watch, args=(local_ranks, end_job), name="spmdsim memory watch", daemon=True).start()
    return True


def _watch(local_ranks: int, end_job: Callable[[Any, str], Any]) -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    while True:
        time.sleep(POLL_S)
        if MPI.Is_finalized():  # the program ended while this thread slept
            return
        why = problem(rank, local_ranks)
        if why is not None:
            end_job(world, f"spmdsim: error: {why}\n")
