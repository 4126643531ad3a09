"""What spmdsim does when its own output cannot be written: a module below the packages, as spmdsim.base.once_parser
(which uses it) is.

`output_error` is the one line for a failed write (a full disk under ``> file``, an I/O error); `quiet_stdout`
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


def quiet_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush does not fail again on a closed pipe or a
    full disk."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # stdout replaced by something without a descriptor
        pass
