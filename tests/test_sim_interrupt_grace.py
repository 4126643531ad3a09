"""Ctrl-C in the caller of a run on simulated ranks: simulate() raises KeyboardInterrupt only after every rank
stopped at its next wait (or STOP_S passed), not while a rank still runs on in the background."""
from __future__ import annotations

import signal
import threading
import time

import pytest

from spmdsim import world as spmdsim_world
from spmdsim.runtime.sim import simulate
from test_sim_rank_sleep import interrupted_after


def _sigint_to_main() -> None:
    """A real SIGINT to the main thread, so that it lands inside the lock a join waits on (as a terminal's
    Ctrl-C does)."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def test_ctrl_c_waits_for_a_computing_rank_to_reach_its_next_wait():
    # Rank 0 computes on when Ctrl-C comes, in Python, for less than STOP_S; the others wait in a Barrier. The
    # caller waited for rank 0 with Thread.join, which on Python 3.11, interrupted, marks a live thread ended:
    # simulate() raised at once while rank 0 ran on, past its Barrier's stop, in the background.
    left, ran_on = [], []

    def rank():
        me = spmdsim_world().Get_rank()
        try:
            if me == 0:
                end = time.monotonic() + 0.8
                while time.monotonic() < end:
                    pass
            spmdsim_world().Barrier()
            ran_on.append(me)
        finally:
            left.append(me)

    with interrupted_after(0.3, _sigint_to_main), pytest.raises(KeyboardInterrupt):
        simulate(2, rank)
    assert (sorted(left), ran_on) == ([0, 1], [])  # both stopped at the Barrier before simulate raised


@pytest.mark.parametrize("dry_run", [False, True])
def test_ctrl_c_stops_a_rank_that_loops_on_its_own(dry_run):
    # A notebook cell interrupted while a rank computed in a loop with no wait in it: simulate() raised, and the
    # rank ran on in a thread of the kernel, for good (each such cell added one more), slowing every later cell.
    stopped = threading.Event()

    def rank():
        try:
            while True:
                pass
        finally:
            stopped.set()

    with interrupted_after(0.3), pytest.raises(KeyboardInterrupt):
        simulate(2, rank, dry_run=dry_run)
    assert stopped.wait(30)
    for thread in threading.enumerate():
        if thread.name.startswith("spmdsim"):
            thread.join(30)
    assert [t.name for t in threading.enumerate() if t.name.startswith("spmdsim")] == []
