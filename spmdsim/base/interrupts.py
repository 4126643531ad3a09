"""A Ctrl-C that lands in a callback Python cannot raise from still interrupts the program; standard library only.

Python runs its SIGINT handler in the main thread at the next bytecode boundary, wherever that is. When
the main thread is then running a weak reference's callback (spmdsim's caches drop a mesh's entries so,
runtime.executor) or a ``__del__``, the KeyboardInterrupt cannot propagate: Python reports it as "Exception
ignored in: ..." with a traceback and goes on, as if Ctrl-C had never been pressed. A simulated run then
kept running where it should stop with one line and exit 130, and an MPI rank printed the traceback beside
the job's one line.

`keep_ctrl_c` (once per process, from a program's entry: `spmdsim.runtime.sim.launch.run_on_ranks`, an MPI rank's
`spmdsim.runtime.process.tune_mpi_process`) puts a ``sys.unraisablehook`` in front of the one there: a
KeyboardInterrupt of the main thread is given back to the main thread, and nothing is printed; anything else
goes to the hook before it. Given back by a short-lived thread (``_thread.interrupt_main``: raised at the main
thread's next bytecode boundary, as the signal itself is), not by the hook: an interrupt made pending inside
the hook is raised inside it, where it is lost again. The thread waits until no frame of the main thread's
stack is the hook's (starting the thread waits inside the hook for it to start, and on a loaded machine the
main thread can stay there for milliseconds: a fixed delay lost the interrupt so, one CI run in four under
load). Should it land in another callback, the hook gives it back again. ``import spmdsim`` changes nothing.

`terminations_raise` turns a SIGTERM or SIGHUP (a batch system's time limit, `timeout`, a closed terminal) into
an exception for as long as it is entered, where Python's default would end the process at once and run no
``finally``: `spmdsim launch` then stops the job it started in a session of its own, which no signal sent to
launch reaches.
"""
from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
import time
from typing import Any, Iterator

_KEPT: list = []  # the hook before ours, once installed


def keep_ctrl_c() -> bool:
    """Install the hook (once per process); True when it is in place."""
    if _KEPT:
        return True
    previous = sys.unraisablehook
    _KEPT.append(previous)

    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) \
                and threading.current_thread() is threading.main_thread():
            try:
                threading.Thread(target=_again, args=(hook.__code__,), name="spmdsim Ctrl-C again",
                                 daemon=True).start()
            except RuntimeError:  # no new thread (the interpreter is shutting down): ending anyway
                pass
            return
        previous(unraisable)

    sys.unraisablehook = hook
    return True


_PATIENCE = 10.0  # seconds: a main thread still in the hook by then is interrupted wherever it is


def _again(code: Any) -> None:
    """The Ctrl-C again, once the main thread has left the hook whose code is `code`."""
    main = threading.main_thread().ident
    deadline = time.monotonic() + _PATIENCE
    while time.monotonic() < deadline:
        time.sleep(0.001)
        frame = sys._current_frames().get(main)
        while frame is not None and frame.f_code is not code:
            frame = frame.f_back
        if frame is None:
            break
    _thread.interrupt_main()


class Terminated(BaseException):
    """A SIGTERM or SIGHUP received inside `terminations_raise`; `signum` is which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _terminated(signum: int, frame: Any) -> None:
    """Raise Terminated once: a second SIGTERM (coreutils `timeout` sends one to the process and one to its group)
    landing while the first is handled would raise again inside its handler, a traceback."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is _terminated:
            signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


@contextlib.contextmanager
def terminations_raise() -> Iterator[None]:
    """Within it, SIGTERM and SIGHUP raise `Terminated` in the main thread where their action was the default
    (the process ended at once); a handler the program set, an ignored signal and other threads are left alone."""
    taken = []
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is signal.SIG_DFL:
                signal.signal(sig, _terminated)
                taken.append(sig)
    try:
        yield
    finally:
        for sig in taken:
            signal.signal(sig, signal.SIG_DFL)
