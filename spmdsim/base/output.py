"""What spmdsim does when its own output cannot be written: a module below the packages, as spmdsim.base.once_parser
(which uses it) is.

`output_error` is the one line for a failed write (a full disk under ``> file``, an I/O error), which
`note_output_failure` marks where a simulated rank's write failed; `quiet_stdout`
points stdout at /dev/null after such a failure, or after the reader went away (``| head``), so that the
interpreter's last flush does not fail again with a traceback. `ready_output`, where a run starts, gives a
standard stream closed before the start /dev/null in its place (`open_closed_streams`) and has stdout write what
its encoding cannot hold as a backslash escape, as Python's stderr does (`escape_unencodable`).
"""
from __future__ import annotations

import os
import sys


def output_error(exc: OSError) -> str:
    """One line for an OSError while writing: what failed and why (no traceback)."""
    why = exc.strerror or str(exc) or type(exc).__name__
    if exc.filename is not None:
        return f"cannot write {exc.filename!r}: {why}"
    return f"cannot write the output: {why}"


def note_output_failure(exc: OSError) -> None:
    """Note on `exc` that it failed a write to the standard streams (spmdsim.runtime.sim.simulating's line
    buffers), so that a simulated rank's full disk under ``> file`` ends the run in one line
    (spmdsim.runtime.sim.launch), where another OSError of a rank keeps its traceback."""
    exc.spmdsim_output = True  # type: ignore[attr-defined]


def is_output_failure(exc: BaseException) -> bool:
    """Whether `exc` is an OSError that note_output_failure noted."""
    return isinstance(exc, OSError) and getattr(exc, "spmdsim_output", False)


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush does not fail again on a closed pipe or a
    full disk."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout replaced by something without a descriptor
        pass


def ready_output() -> None:
    """The standard streams made fit for a run's output: `open_closed_streams`, then `escape_unencodable`."""
    open_closed_streams()
    escape_unencodable()


def open_closed_streams() -> None:
    """Give a standard stream that was closed when the process started (``spmdsim ... >&-``, a launcher that closes
    them) /dev/null, at its descriptor and as sys.stdout or sys.stderr. Python leaves such a stream None: print
    drops what it is given, but a flush raised AttributeError with a traceback, and the next file opened took its
    descriptor (a grade book, a child's output then written into it). The output is dropped, as print drops it."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        if getattr(sys, name) is not None:
            continue
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, "w", closefd=False))
        except OSError:  # no /dev/null: the stream stays None, as Python left it
            pass


def escape_unencodable() -> None:
    """Have stdout write a character its encoding cannot hold as a backslash escape (``\\xe9``), as Python's stderr
    does, where it would raise UnicodeEncodeError: a user's own text that the output repeats (a student's file
    ``José.py``, a checkpoint directory ``ck é``) under an ASCII stdout (PYTHONIOENCODING=ascii, a C locale without
    UTF-8), or a file name's undecodable bytes. Only a stream whose errors are "strict": an errors handler the user
    chose (PYTHONIOENCODING=ascii:replace) is kept, and a stream without reconfigure (a notebook's) is left as is."""
    stream = sys.stdout
    if getattr(stream, "errors", None) != "strict" or not callable(getattr(stream, "reconfigure", None)):
        return
    try:
        stream.reconfigure(errors="backslashreplace")
    except (OSError, ValueError):  # closed, or a stream that refuses it: its writes fail as they did
        pass
