"""Start a program as an interactive shell does, for the tests that send it Ctrl-C.

A child inherits its parent's signal mask and ignored signals through exec. A test process whose main
thread has SIGINT blocked or ignored (a CI runner that starts the suite in the background of a
non-interactive shell ignores it; something in a long-lived test worker can block it) would start a
program that never sees the Ctrl-C the test sends, and the test would wait out its timeout.
"""
from __future__ import annotations

import signal


def as_a_shell_starts_it() -> None:
    """Popen's preexec_fn: SIGINT unblocked and at its default in the child before exec. No import here: the
    child of a process with threads runs only what it already has."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sigint_state(pid: int) -> str:
    """The process's SigBlk and SigIgn lines (SIGINT is bit 1 of each), for a failure's message."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return " ".join(line.strip() for line in status if line.startswith(("SigBlk", "SigIgn")))
    except OSError:
        return "(no /proc status)"
