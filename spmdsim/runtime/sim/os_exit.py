"""os._exit(code) on a simulated rank ends that rank, not the process (simulate(), --ranks N, spmdsim mpirun).

An MPI process that calls os._exit ends alone, and the ranks waiting for it are its launcher's to end; on
simulated ranks, threads of one process, Python's would end the process and every rank without a word (exit 1,
no line after the banner). Within `os_exit_ends_the_rank` a rank's own thread raises `OsExit` instead, which the run
takes as that rank's exit (those that wait for it then deadlock, naming it: 'rank 1 exited (os._exit(1))').
"""
from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

from ...base import context as _local

__all__ = ["OsExit", "exit_text", "is_rank_thread", "os_exit_ends_the_rank"]

_PYTHONS = os._exit  # os._exit as this module found it: the real one, no caller's


def is_rank_thread() -> bool:
    """Whether the calling thread is a simulated rank's own (not one a rank started: spmdsim.emulator.rank_threads
    marks those)."""
    return getattr(threading.current_thread(), "_spmdsim_key", None) is None


class OsExit(BaseException):
    """os._exit(code) called on a simulated rank (`os_exit_ends_the_rank`): that rank ends, not the process."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def os_exit_ends_the_rank() -> Iterator[None]:
    """While the ranks run, os._exit(code) in a simulated rank's own thread ends that rank with `code`, as it
    ends that MPI process, where Python's would end this process and every rank without a word; in any other thread
    (one a rank started too) it is Python's, and ends the process. Nested (spmdsim mpirun, --ranks N and the
    lab's grader enter it around simulate(), which enters it too) the outer one's stays: one OsExit for all,
    each caller reporting it its own way (the grader as its verdict 'exit'). Counted: simulations in several
    threads of one process share the swap, made by the first to enter and undone by the last to leave (undone by
    the first to leave, it let a later rank's os._exit end the process). An os._exit not Python's, set by another
    before any of them, stays as it is."""
    with _LOCK:
        counted = _ENTERED[0] > 0 or os._exit is _PYTHONS  # (else another's swap: left alone)
        if counted:
            if not _ENTERED[0]:
                os._exit = _ends_the_rank
            _ENTERED[0] += 1
    try:
        yield
    finally:
        if counted:
            with _LOCK:
                _ENTERED[0] -= 1
                if not _ENTERED[0]:
                    os._exit = _PYTHONS


def _ends_the_rank(code: int) -> None:
    """os._exit while `os_exit_ends_the_rank` holds: OsExit in a simulated rank's own thread, else Python's."""
    if _local.simulated() is None or not is_rank_thread():
        _PYTHONS(code)
    raise OsExit(int(code))


_LOCK = threading.Lock()
_ENTERED = [0]  # the `os_exit_ends_the_rank` blocks open now, in any thread: the swap stays while one is


def exit_text(exc: BaseException) -> str:
    """How a rank exited, for a deadlock report: 'SystemExit(0)', 'os._exit(1)'
    (spmdsim.runtime.sim.report.whereabouts)."""
    if isinstance(exc, OsExit):
        return f"os._exit({exc.code})"
    code = getattr(exc, "code", None)
    return "SystemExit" if code is None else f"SystemExit({code!r})"
