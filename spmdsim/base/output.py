"""What spmdsim does when its own output cannot be written: a module below the packages, as spmdsim.base.once_parser
(which uses it) is.

`output_error` is the one line for a failed write (a full disk under ``> file``, an I/O error), which
`note_output_failure` marks where a simulated rank's write failed; `quiet_stdout`
points stdout at /dev/null after such a failure, or after the reader went away (``| head``), so that the
interpreter's last flush does not fail again with a traceback.
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
