"""os._exit(code) on a simulated rank ends that rank, not the process (simulate(), --ranks N, spmdsim mpirun).

An MPI process that calls os._exit ends alone, and the ranks waiting for it are its launcher's to end; on
simulated ranks, threads of one process, it ended the process and every rank without a word (exit 1, no line
after the banner). Within `os_exit_ends_the_rank` a rank's own thread raises `OsExit` instead, which the run
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
    ends that MPI process, where it ended this process and every rank without a word; in any other thread
    (one a rank started too) it is Python's, and ends the process. Nested (spmdsim mpirun, --ranks N and the
    lab's grader enter it around simulate(), which enters it too) the outer one's stays: one OsExit for all,
    each caller reporting it its own way (the grader as its verdict 'exit')."""
    real = os._exit
    if real is not _PYTHONS:
        yield
        return

    def _exit(code: int) -> None:
        if _local.simulated() is None or not is_rank_thread():
            real(code)
        raise OsExit(int(code))

    os._exit = _exit
    try:
        yield
    finally:
        os._exit = real


def exit_text(exc: BaseException) -> str:
    """How a rank exited, for a deadlock report: 'SystemExit(0)', 'os._exit(1)'
    (spmdsim.runtime.sim.report.whereabouts)."""
    if isinstance(exc, OsExit):
        return f"os._exit({exc.code})"
    code = getattr(exc, "code", None)
    return "SystemExit" if code is None else f"SystemExit({code!r})"
