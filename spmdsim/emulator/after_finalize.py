"""A simulated rank's MPI call after its MPI.Finalize ends the run, as MPICH ends the job ("Attempting to use an
MPI routine (internal_Barrier) before initializing or after finalizing MPICH", exit code 1): one line naming
the call, where the program made it and where the rank finalized. So does a second MPI.Finalize; MPI.Is_finalized
and MPI.Is_initialized keep answering.

No call pays for the check until a rank finalizes: the first MPI.Finalize in the process wraps the public
methods, properties and class methods of the emulator's communicators, windows, requests, groups and messages
(`checked_after_finalize` adds a class), and a wrapped call asks whether its rank finalized. Only the program's
own calls are checked: spmdsim's (a Send's Isend, the end of a rank) run on.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Any, Callable, NoReturn

from ..base import context as _local
from ..runtime.sim.engine import SimulationError
from ..runtime.sim.report import _program_line
from ..runtime.sim.requests import Request
from .comm import SimCartComm, SimComm, SimDistGraphComm, SimGraphComm, SimTopoComm
from .group import SimGroup
from .job_end import end_every_rank
from .message import SimMessage
from .nonblocking import CollectiveRequest
from .partitioned import Partitioned
from .persistent import Prequest

__all__ = ["checked_after_finalize", "finalize", "used_after_finalize", "CHECK_CODE"]

_SPMDSIM = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # spmdsim's own code
_LOCK = threading.Lock()
_CLASSES: list = [SimComm, SimTopoComm, SimCartComm, SimGraphComm, SimDistGraphComm, Request, CollectiveRequest,
                  Prequest, Partitioned, SimGroup, SimMessage]  # and SimWin, once spmdsim.emulator.window is loaded
_WRAPPED: list = []  # [True] once a rank finalized


def checked_after_finalize(cls: type) -> None:
    """Check `cls`'s calls too (see the module docstring)."""
    with _LOCK:
        _CLASSES.append(cls)
        if _WRAPPED:
            _wrap(cls)


def finalize(frame: Any) -> None:
    """The running rank's program called MPI.Finalize in `frame`: its next MPI call ends the run."""
    _local.current().finalized = _program_line(frame) or "its program"
    if not _WRAPPED:
        with _LOCK:
            if not _WRAPPED:
                for cls in _CLASSES:
                    _wrap(cls)
                _WRAPPED.append(True)


def used_after_finalize(call: str, frame: Any) -> NoReturn:
    """End every rank: the running rank's program made MPI's `call` in `frame` after its MPI.Finalize."""
    state = _local.current()
    line = _program_line(frame)
    error = SimulationError(f"simulated rank {state.rank} called {call}{' (' + line + ')' if line else ''} after "
                            f"its MPI.Finalize ({state.finalized}): MPICH ends the job there; every rank was stopped")
    error.abort_code = 1
    end_every_rank(error)


def _checked(fn: Callable, call: str) -> Callable:
    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if _local.current().finalized:
            frame = sys._getframe(1)
            if not frame.f_code.co_filename.startswith(_SPMDSIM):
                used_after_finalize(call, frame)
        return fn(*args, **kwargs)

    checked.after_finalize = True
    return checked


#: The code of every checked call's wrapper (its frame stands between a program's call and the method).
CHECK_CODE = _checked(len, "").__code__


def _wrap(cls: type) -> None:
    """Check the public calls `cls` has from spmdsim's modules, each where `cls` finds it."""
    for owner in cls.__mro__:
        if not owner.__module__.startswith("spmdsim."):
            continue
        for name, value in list(vars(owner).items()):
            if name.startswith("_") or next(o for o in cls.__mro__ if name in vars(o)) is not owner:
                continue
            if isinstance(value, property):
                if value.fget is not None and not getattr(value.fget, "after_finalize", False):
                    fget = _checked(value.fget, f"the {name} property")
                    setattr(cls, name, property(fget, value.fset, value.fdel, value.__doc__))
            elif isinstance(value, (classmethod, staticmethod)):
                if not getattr(value.__func__, "after_finalize", False):
                    setattr(cls, name, type(value)(_checked(value.__func__, name)))
            elif hasattr(value, "__code__") and not getattr(value, "after_finalize", False):
                setattr(cls, name, _checked(value, name))
