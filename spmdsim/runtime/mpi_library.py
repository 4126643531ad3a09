"""mpi4py's MPI module, or one line saying why it does not load and what to do.

mpi4py installs without an MPI library (its wheels find one when ``mpi4py.MPI`` is imported: MPICH
from pip, the 'mpi' extra, or the system's). On a laptop with none, that import raises
``RuntimeError: cannot load MPI library`` followed by a line per file it tried; the commands and
scripts that need MPI ranks say so in one line instead, with the way out: simulated ranks
(``--ranks N``), which need no MPI library, or an MPI to install. A program that lets the error go
uncaught (``python prog.py`` of a script whose ``spmdsim.world()`` needs MPI) ends with that line
alone, without a traceback (`_one_line_if_uncaught`).
"""
from __future__ import annotations

import os
import sys
from typing import Any

from ..errors import fold_message, SpmdsimError

#: How to get an MPI library mpi4py can load.
INSTALL_MPI = "the 'mpi' extra (pip install mpich), or use your system's MPI"
#: A program's way on without MPI (spmdsim.world() outside a simulation).
SIMULATE_INSTEAD = ("simulate the ranks, which needs no MPI library (`python prog.py --ranks N` with "
                    "spmdsim.script(__file__), or spmdsim.simulate(N, main))")


class MPILibraryError(SpmdsimError, RuntimeError):
    """mpi4py's MPI module does not load (no mpi4py, or no MPI library for it)."""


def load_mpi(without: str = "add --ranks N to run on simulated ranks, which need no MPI library",
             why: str = "") -> Any:
    """``mpi4py.MPI``; if it does not load, MPILibraryError naming the cause and `without`, the way on
    without MPI (or, given `why`, why there is none), then how to install an MPI library."""
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError) as exc:  # no mpi4py; its wheel's 'cannot load MPI library'
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        cause = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
        way = f"{why}; install" if why else f"{without}, or install"
        _one_line_if_uncaught()
        raise MPILibraryError(f"mpi4py's MPI module does not load here ({cause}): {way} "
                              f"{INSTALL_MPI}") from None
    return MPI


def _one_line_if_uncaught() -> None:
    """Make an MPILibraryError that reaches the top of the program's main thread print one line, ``prog.py:
    error: ...``, folded as spmdsim's errors are, not a traceback through spmdsim (exit status 1, as
    Python's); any other uncaught exception goes to the hook that was there (sys.excepthook)."""
    before = sys.excepthook
    if getattr(before, "spmdsim_mpi_library", False):  # installed already
        return

    def hook(kind: Any, value: Any, tb: Any) -> None:
        if not isinstance(value, MPILibraryError):
            before(kind, value, tb)
            return
        prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] not in ("", "-c") else "python"
        text = str(value)
        if prog.endswith(".py"):  # the way on, for this program: python attention.py --ranks N
            text = text.replace("`python prog.py --ranks N`", f"`python {prog} --ranks N`")
        print(fold_message(f"{prog}: error: {text}"), file=sys.stderr)

    hook.spmdsim_mpi_library = True  # type: ignore[attr-defined]
    sys.excepthook = hook
