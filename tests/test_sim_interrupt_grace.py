"""Ctrl-C in the caller of a run on simulated ranks: simulate() raises KeyboardInterrupt only after every rank
stopped at its next wait (or STOP_S passed), not while a rank still runs on in the background."""
from __future__ import annotations

import contextlib
import signal
import threading
import time

import pytest

from spmdsim import world as spmdsim_world
from spmdsim.runtime.sim import simulate


@contextlib.contextmanager
def signalled_after(seconds: float):
    """A real SIGINT to the main thread after `seconds`, so that it lands inside the lock a join waits on (as a
    terminal's Ctrl-C does), with Python's own SIGINT handler meanwhile (a background job ignores SIGINT)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(seconds, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, before)


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

    with signalled_after(0.3), pytest.raises(KeyboardInterrupt):
        simulate(2, rank)
    assert (sorted(left), ran_on) == ([0, 1], [])  # both stopped at the Barrier before simulate raised
