"""Start a program as an interactive shell does, for the tests that send it Ctrl-C.

A child inherits its parent's signal mask and ignored signals through exec. A test process whose main
thread has SIGINT blocked or ignored (a CI runner that starts the suite in the background of a
non-interactive shell ignores it; something in a long-lived test worker can block it) would start a
program that never sees the Ctrl-C the test sends, and the test would wait out its timeout.
"""
from __future__ import annotations

import signal
import subprocess


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


def interrupt(proc: subprocess.Popen, wait_s: float = 60.0) -> tuple[str, str, str]:
    """Ctrl-C to `proc` (started with ``python -X faulthandler``, pipes as text): its (stdout, stderr) once it
    exits, and its SIGINT state read just before the signal. Without an exit within `wait_s`, SIGABRT makes
    faulthandler print every thread's stack, and the AssertionError carries them and the state."""
    state = sigint_state(proc.pid)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=wait_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        err = proc.communicate(timeout=30)[1]
        raise AssertionError(f"no exit {wait_s:g} s after SIGINT ({state}); the threads:\n{err[-6000:]}") from None
    return out, err, state
