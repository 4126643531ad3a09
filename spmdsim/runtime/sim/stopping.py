"""Ranks stopped by their caller: Ctrl-C (an interrupted notebook cell) or memory nearly out stops every rank at its
next wait; one that reaches none in time (a loop of its own, Python's or numpy's) is stopped between two of its
bytecodes, by Aborted raised in its thread. It ran on in the background, behind the KeyboardInterrupt: a notebook's
kernel computed on for every interrupted cell, slower each time, until restarted."""
from __future__ import annotations

import ctypes
import threading
import time
from typing import Sequence

from .engine import Aborted

__all__ = ["stop_ranks"]

#: How long stop_ranks gives a rank to end once Aborted is raised in it, before the next rank's turn.
EACH_S = 0.1
#: How long stop_ranks spends in all stopping the ranks left: those still in a long call of C are left then.
LEFT_AFTER_S = 2.0


def stop_ranks(threads: Sequence[threading.Thread], ended: Sequence[threading.Event], seconds: float) -> None:
    """Give the ranks' `threads` `seconds` in all to end (each sets its `ended` Event); stop those left."""
    deadline = time.monotonic() + seconds
    try:
        for t, end in zip(threads, ended):
            if t.ident is not None and end.wait(max(0.0, deadline - time.monotonic())):
                t.join(max(0.0, deadline - time.monotonic()))
    except RuntimeError:  # interrupted (SIGTERM, Ctrl-C), or a thread that could not start
        pass
    finally:
        _stop_left(threads, ended)


def _stop_left(threads: Sequence[threading.Thread], ended: Sequence[threading.Event]) -> None:
    """Raise Aborted in each rank's thread still running, one at a time: Python 3.11 signals one pending
    asynchronous exception for the whole process, so that of two raised at once one could wait for good."""
    deadline = time.monotonic() + LEFT_AFTER_S
    while time.monotonic() < deadline:
        left = [(t, end) for t, end in zip(threads, ended) if t.ident is not None and not end.is_set()]
        if not left:
            return
        for t, end in left:
            _raise_in(t)
            end.wait(max(0.0, min(EACH_S, deadline - time.monotonic())))


def _raise_in(thread: threading.Thread) -> None:
    """Raise Aborted in `thread` at its next bytecode (CPython's asynchronous exception; elsewhere nothing)."""
    set_async = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)
    if set_async is not None and thread.ident is not None:
        set_async(ctypes.c_ulong(thread.ident), ctypes.py_object(Aborted))
