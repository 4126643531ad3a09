"""mpi4py.util.pkl5 on simulated ranks: its Comm, Intracomm, Request and Message over simulated communicators.

pkl5 is pure Python over mpi4py's MPI module: its classes derive from MPI.Comm and
its functions call ``MPI.Comm.Send``, ``MPI.Comm.Mprobe``, ``MPI.Message.Recv``,
``MPI.Request.Waitall`` ... at call time. While `swapped_pkl5()` is active
(spmdsim.emulator.mpi4py_world.swapped), each simulated rank that reads a name of
``mpi4py.util.pkl5`` gets its own copy of the module, run once in that rank's thread,
so its classes derive from the simulated MPI.Comm (SimComm) and its calls reach the
simulated communicator, and what a rank sets on the module (``pkl5.pickle = ...``)
is its own, as in an MPI process. Two private helpers of mpi4py that pkl5 takes from
MPI's C layer have simulated twins here: ``_comm_lock`` (a lock per communicator and
purpose) and ``_commctx_intra`` (a duplicate of the communicator, made once, and a
new tag per collective call, as every rank calls them in the same order), with ``_commctx_inter``, its twin
for intercommunicators. Every
other thread sees pkl5 as it is.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import types
import weakref
from typing import Any, Iterator

from ..base import context as _local
from ._nesting import Nesting
from .comm import SimComm
from .intercomm import SimIntercomm
from ..runtime.sim.thread_engine import THREADS

__all__ = ["swapped_pkl5"]

_NESTING = Nesting()
_OWN: list = []  # the module's own type, while swapped
_COPIES: "weakref.WeakKeyDictionary[Any, types.ModuleType]" = weakref.WeakKeyDictionary()  # RankContext -> copy
_CODE: list = []  # pkl5's compiled source


def _comm_lock(comm: Any, key: Any = None) -> Any:
    if not isinstance(comm, SimComm):
        from mpi4py import MPI

        return MPI._comm_lock(comm, key)
    locks = comm._h.private.setdefault("locks", {})
    lock = locks.get(key)
    if lock is None:
        lock = locks.setdefault(key, threading.Lock())
    return lock


def _commctx_intra(comm: Any) -> tuple:
    """(the communicator's private duplicate, a new tag): pkl5's collectives send on it with that tag."""
    if not isinstance(comm, SimComm):
        from mpi4py import MPI

        return MPI._commctx_intra(comm)
    ctx = comm._h.private.get("commctx")
    if ctx is None:
        ctx = comm._h.private["commctx"] = [SimComm.Dup(comm), 0]
    ctx[1] = ctx[1] % 32767 + 1  # MPI guarantees tags up to 32767
    return ctx[0], ctx[1]


def _commctx_inter(comm: Any) -> tuple:
    """(the intercommunicator's private duplicate, a new tag, a private duplicate of its local group, whether
    its group is the low one): pkl5's collectives on an intercommunicator send on them."""
    if not isinstance(comm, SimIntercomm):
        from mpi4py import MPI

        return MPI._commctx_inter(comm)
    ctx = comm._h.private.get("commctx")
    if ctx is None:
        ctx = comm._h.private["commctx"] = [SimIntercomm.Dup(comm), 0, SimComm.Dup(comm._local)]
    ctx[1] = ctx[1] % 32767 + 1
    return ctx[0], ctx[1], ctx[2], comm._low


def _rank_copy(state: Any) -> types.ModuleType:
    """The calling rank's own pkl5, made on first use in its thread (its classes derive from SimComm)."""
    module = _COPIES.get(state)
    if module is None:
        real = sys.modules["mpi4py.util.pkl5"]
        if not _CODE:
            with open(real.__file__, "rb") as f:
                _CODE.append(compile(f.read(), real.__file__, "exec"))
        module = types.ModuleType(real.__name__, real.__doc__)
        module.__dict__.update(__package__=real.__package__, __file__=real.__file__, __spec__=real.__spec__)
        exec(_CODE[0], module.__dict__)
        module._comm_lock, module._commctx_intra, module._commctx_inter = _comm_lock, _commctx_intra, _commctx_inter
        _COPIES[state] = module
    return module


def _simulated_state() -> Any:
    state = _local.simulated()
    return state if state is not None and state.engine is THREADS else None


def _property(name: str) -> property:
    def get(module: Any) -> Any:
        state = _simulated_state()
        if state is None:
            return module.__dict__[name]
        return getattr(_rank_copy(state), name)

    def put(module: Any, value: Any) -> None:
        state = _simulated_state()
        if state is None:
            module.__dict__[name] = value
        else:
            setattr(_rank_copy(state), name, value)

    return property(get, put)


@contextlib.contextmanager
def swapped_pkl5() -> Iterator[None]:
    """Within this block, simulated ranks see mpi4py.util.pkl5 as their own copy (see above); nests."""
    from mpi4py.util import pkl5

    def install() -> None:
        names = [n for n in vars(pkl5) if not (n.startswith("__") and n.endswith("__"))]
        _OWN[:] = [type(pkl5)]
        pkl5.__class__ = type("_SimulatedPkl5", (_OWN[0],), {n: _property(n) for n in names})

    def restore() -> None:
        pkl5.__class__ = _OWN.pop()

    with _NESTING(install, restore):
        yield
