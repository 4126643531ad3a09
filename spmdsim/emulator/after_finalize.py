"""A simulated rank's MPI call after its own MPI.Finalize ends the run, as MPICH ends the job ("Attempting to use
an MPI routine (internal_Barrier) before initializing or after finalizing MPICH", exit code 1): one line naming
the call, the program's line and where the rank finalized. A second MPI.Finalize ends it too. What MPICH answers
after MPI_Finalize answers: MPI.Is_initialized, MPI.Is_finalized, MPI.Get_version, MPI.Get_library_version,
MPI.Get_error_string and MPI.Get_error_class; reading MPI.COMM_WORLD, copying or comparing a communicator and
printing make no MPI call.

The rank's Finalize calls `refuse_from_now`, which sets a profile hook on the rank's own thread (after the one the
thread had, the lab's call watcher's, which it calls first). The thread ends with the rank, and the hook with it:
nothing is changed for another rank or a later run, and no call pays anything before its rank finalizes. The
hook knows an MPI call by its code: the public methods and properties of the emulator's communicators, windows,
files, requests, groups and messages, and the rank's own module functions (MPI.Finalize, MPI.Query_thread, ...). Only
a call from outside spmdsim is the program's: spmdsim's own (a Send's Isend, the end of the rank) run on.
mpi4py's own functions (MPI.Wtime, MPI.Get_processor_name, MPI.DOUBLE.Get_size) are compiled code, which a
profile hook does not see: they answer, where MPICH ends the job.
"""
from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

from ..base import context as _local
from ..runtime.sim.engine import SimulationError
from ..runtime.sim.report import _program_line
from ..runtime.sim.requests import Request
from .comm import SimComm
from .comm_errors import GUARD_CODE
from .group import SimGroup
from .job_end import end_every_rank
from .message import SimMessage

__all__ = ["refuse_from_now"]

_SPMDSIM = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # spmdsim's own code
_HANDLE_CONVERSIONS = frozenset(("toint", "fromint", "py2f", "f2py"))
#: The emulator's modules a program loads when it first opens a window or a file, and the class each holds.
_LAZY = (("window", "SimWin"), ("file", "SimFile"))
_FOUND: dict = {}  # which of _LAZY are loaded -> _calls' answer (the classes are fixed)


def refuse_from_now(frame: Any, own: dict) -> None:
    """The running rank's program called MPI.Finalize in `frame`: from now on its MPI call (one of the emulator's
    methods, or a code in `own`: code -> the name a program calls it by) ends the run (see the module
    docstring)."""
    state = _local.simulated()
    package = __name__.rpartition(".")[0]
    lazy = tuple(getattr(sys.modules.get(f"{package}.{module}"), name, None) for module, name in _LAZY)
    found = _FOUND.get(tuple(c is not None for c in lazy))
    if found is None:
        found = _FOUND[tuple(c is not None for c in lazy)] = _calls([c for c in lazy if c is not None])
    calls = {**found, **own}
    where = _program_line(frame) or "its program"
    before = sys.getprofile()

    def hook(frame: Any, event: str, arg: Any) -> None:
        if before is not None:
            before(frame, event, arg)
        if event != "call":
            return
        call = calls.get(frame.f_code)
        if call is None:
            return
        back = frame.f_back
        if back is not None and back.f_code is GUARD_CODE:  # a method guarded once an errhandler was set
            back = back.f_back
        if back is not None and not back.f_code.co_filename.startswith(_SPMDSIM):
            _used_after_finalize(state, call, back, where)

    sys.setprofile(hook)


def _used_after_finalize(state: Any, call: str, frame: Any, where: str) -> NoReturn:
    """End every rank: rank `state`'s program made MPI's `call` in `frame` after its MPI.Finalize at `where`."""
    line = _program_line(frame)
    error = SimulationError(f"simulated rank {state.rank} called {call}{' (' + line + ')' if line else ''} after "
                            f"its MPI.Finalize ({where}): MPICH ends the job there; every rank was stopped")
    error.abort_code = 1
    error.after_finalize = call  # (the lab's words: spmdsim.tools.lab.failure)
    end_every_rank(error)


def _calls(lazy: list) -> dict:
    """code -> the name a program calls it by, of the public methods and properties of the emulator's
    communicators, requests, groups, messages and the `lazy` classes loaded (windows, files), and their
    subclasses; not the handle conversions (toint, fromint), which MPICH answers after MPI_Finalize."""
    classes = [SimComm, Request, SimGroup, SimMessage] + lazy
    calls: dict = {}
    seen: set = set()
    while classes:
        cls = classes.pop()
        if cls in seen:
            continue
        seen.add(cls)
        classes.extend(cls.__subclasses__())
        for owner in cls.__mro__:
            if not owner.__module__.startswith("spmdsim."):
                continue
            for name, value in vars(owner).items():
                kind = "property" if isinstance(value, property) else ""
                if kind:
                    value = value.fget
                elif isinstance(value, (classmethod, staticmethod)):
                    value = value.__func__
                value = getattr(value, "__wrapped__", value)  # (guarded once an errhandler was set)
                code = getattr(value, "__code__", None)
                if code is None or name.startswith("_") or name in _HANDLE_CONVERSIONS:
                    continue
                if code.co_name.isidentifier() and not code.co_name.startswith("_"):  # rank = property(Get_rank)
                    calls.setdefault(code, code.co_name)
                else:  # nnodes = property(lambda self: ...)
                    calls.setdefault(code, f"the {name} property" if kind else name)
    return calls
