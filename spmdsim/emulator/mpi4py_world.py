"""Unmodified mpi4py programs on simulated ranks: ``MPI.COMM_WORLD`` is each rank's own communicator.

    with swapped():
        spmdsim.simulate(8, main)     # inside main, MPI.COMM_WORLD is the simulated world

While `swapped()` is active, the threads of simulated ranks see, on the
``mpi4py.MPI`` module, COMM_WORLD and COMM_SELF as their own SimComms and
Comm, Intracomm, Intercomm, Topocomm, Cartcomm, Graphcomm, Distgraphcomm, Request, Prequest, Group and Win as the
simulated classes, and File and Session as spmdsim.emulator.file and spmdsim.emulator.unsupported make them (so
``MPI.Request.Waitall(reqs)`` and ``MPI.Comm.Compare(a, b)`` take simulated
objects); Init, Init_thread, Finalize, Is_initialized, Is_finalized and Query_thread are the
rank's own, as under mpiexec (`_Lifetime`: the real MPI stays initialized for the
other ranks), and Is_thread_main is True on the rank's own thread, as on a process's main thread.
Threads a rank starts are the rank's (spmdsim.emulator.rank_threads), and so are the
``sys.stdout`` and ``sys.stderr`` it sets (spmdsim.emulator.rank_streams). Every
other thread, and every other name, sees mpi4py as it is.
It works by giving the module object a subclass of its type with those names
as properties, and gives the type back on exit.
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
from .real import real, real_module
from .intercomm import SimIntercomm
from .comm import SimCartComm, SimComm, SimDistGraphComm, SimGraphComm, SimTopoComm, self_comm, world_of
from ..runtime.sim.requests import completed, Request, REQUEST_NULL
from .unsupported import session_class
from . import ports
from .persistent import Prequest
from .group import SimGroup
from . import message
from .after_finalize import refuse_from_now
from ..runtime.sim._mpi import mpi_error
from ..runtime.process import release_segments_once
from ..runtime.sim import p2p
from .pkl5 import swapped_pkl5
from .rank_streams import streams_of_ranks
from .rank_threads import is_rank_thread, threads_of_ranks

__all__ = ["swapped", "SWAPPED"]

#: The names of mpi4py.MPI that a simulated rank sees as its own.
SWAPPED = ("COMM_WORLD", "COMM_SELF", "Comm", "Intracomm", "Intercomm", "Topocomm", "Cartcomm", "Graphcomm",
           "Distgraphcomm", "Request", "Prequest", "Group", "Message", "REQUEST_NULL", "MESSAGE_NULL",
           "MESSAGE_NO_PROC", "Init", "Init_thread", "Finalize", "Is_initialized", "Is_finalized", "Query_thread",
           "Is_thread_main", "Attach_buffer", "Detach_buffer", "Flush_buffer", "Iflush_buffer", "Win", "File",
           "FILE_NULL", "Session", "Open_port", "Close_port", "Publish_name", "Unpublish_name", "Lookup_name")

#: The ports' module functions, each the calling rank's run's (spmdsim.emulator.ports).
_PORT_CALLS = {"Open_port": ports.open_port, "Close_port": ports.close_port, "Publish_name": ports.publish_name,
               "Unpublish_name": ports.unpublish_name, "Lookup_name": ports.lookup_name}

_BSEND_BUFFERS: dict = {}  # thread -> the buffer a simulated rank attached (its Bsend copies anyway)

_LOCK = threading.Lock()
_NESTING = Nesting()
_OWN: list = []  # the module's own type, while swapped


def _simulated(name: str, state: Any) -> Any:
    if name == "COMM_WORLD":
        return world_of(state)
    if name == "COMM_SELF":
        return self_comm(state)
    if name in ("Comm", "Intracomm"):
        return SimComm
    if name == "Intercomm":
        return SimIntercomm
    if name in ("Topocomm", "Cartcomm", "Graphcomm", "Distgraphcomm"):
        return {"Topocomm": SimTopoComm, "Cartcomm": SimCartComm, "Graphcomm": SimGraphComm,
                "Distgraphcomm": SimDistGraphComm}[name]
    if name == "Request":
        return Request
    if name == "Win":
        from .window import SimWin  # (numpy, at its import: a program that opens no window runs without it)

        return SimWin
    if name in ("File", "FILE_NULL"):
        from . import file  # (numpy, at its import, as the windows')

        return file.SimFile if name == "File" else file.file_null(state)
    if name == "Session":
        return session_class()
    if name in _PORT_CALLS:
        return _PORT_CALLS[name]
    if name == "Prequest":
        return Prequest
    if name == "Group":
        return SimGroup
    if name in ("Message", "MESSAGE_NULL", "MESSAGE_NO_PROC"):
        return message.SimMessage if name == "Message" else getattr(message, name)
    if name == "REQUEST_NULL":
        return REQUEST_NULL
    if name in _Lifetime.CALLS:
        return getattr(_lifetime(state), name)
    if name == "Is_thread_main":
        return is_rank_thread
    if name == "Attach_buffer":
        return _attach_buffer
    if name == "Detach_buffer":
        return _detach_buffer
    if name == "Iflush_buffer":
        return completed
    return _flush_buffer


class _Lifetime:
    """One simulated rank's MPI_Init ... MPI_Finalize, as an MPI process sees its own.

    A rank starts initialized, as mpi4py initializes MPI when a program imports it, unless
    ``mpi4py.rc.initialize`` is False when the rank first asks (then its Init or Init_thread does it).
    Init twice is MPI.Exception (ERR_OTHER, "Cannot call MPI_INIT or MPI_INIT_THREAD more than once"),
    as MPICH raises, and so is Init after Finalize (MPICH aborts the job); Finalize before Init raises what
    MPICH aborts with, and any other MPI call after Finalize (Finalize again too) ends the run, as MPICH ends the
    job (spmdsim.emulator.after_finalize). Its thread level (Query_thread) is mpi4py.rc's, as mpi4py asks for
    it (THREAD_SINGLE with rc.threads False), or what Init_thread asked for (MPICH provides each level),
    THREAD_SINGLE after Init.
    """

    CALLS = ("Init", "Init_thread", "Finalize", "Is_initialized", "Is_finalized", "Query_thread")
    LEVELS = ("single", "funneled", "serialized", "multiple")

    def __init__(self) -> None:
        import mpi4py

        rc = getattr(mpi4py, "rc", None)
        self.state = 0 if getattr(rc, "initialize", True) is False else 1
        level = getattr(rc, "thread_level", "multiple")  # (mpi4py warns of another value, and asks for multiple)
        self.level = (0 if getattr(rc, "threads", True) is False else
                      self.LEVELS.index(level) if level in self.LEVELS else 3)

    def _error(self, text: str) -> BaseException:
        mpi = real_module()
        return mpi_error(mpi, mpi.ERR_OTHER, text)

    def Init(self) -> None:  # noqa: N802 - mpi4py's names
        if self.state:
            raise self._error("Cannot call MPI_INIT or MPI_INIT_THREAD more than once"
                              + (" (this rank called MPI.Finalize)" if self.state == 2 else
                                 " (mpi4py calls MPI_Init as a program imports mpi4py.MPI: drop this call, or set "
                                 "mpi4py.rc.initialize = False before that import)"))
        self.state, self.level = 1, 0

    def Init_thread(self, required: int = None) -> int:  # noqa: N802
        self.Init()
        levels = [real(f"THREAD_{name.upper()}") for name in self.LEVELS]
        self.level = levels.index(required) if required in levels else 3  # MPICH provides what is asked
        return levels[self.level]

    def Query_thread(self) -> int:  # noqa: N802
        return real(f"THREAD_{self.LEVELS[self.level].upper()}")

    def Finalize(self) -> None:  # noqa: N802
        if self.state != 1:
            raise self._error("Attempting to use an MPI routine (MPI_Finalize) before initializing or after "
                              "finalizing MPICH")
        self.state = 2
        refuse_from_now(sys._getframe(1), _RANK_CALLS)

    def Is_initialized(self) -> bool:  # noqa: N802
        return self.state >= 1

    def Is_finalized(self) -> bool:  # noqa: N802
        return self.state == 2


_LIFETIMES: "weakref.WeakKeyDictionary[Any, _Lifetime]" = weakref.WeakKeyDictionary()  # RankContext -> its own


def _lifetime(state: Any) -> _Lifetime:
    found = _LIFETIMES.get(state)
    if found is None:
        with _LOCK:
            found = _LIFETIMES.setdefault(state, _Lifetime())
    return found


def _attach_buffer(buf: Any) -> None:
    """A rank's MPI.Attach_buffer: kept (its Bsend copies anyway); a read-only one is mpi4py's BufferError."""
    mpi = real_module()
    if buf is not None and buf is not getattr(mpi, "BUFFER_AUTOMATIC", None):
        try:
            readonly = memoryview(buf).readonly
        except TypeError:  # DLPack, __cuda_array_interface__: as a send buffer reads them
            readonly = False
        if readonly:
            raise BufferError("Attach_buffer: the buffer is read-only")
    _BSEND_BUFFERS[threading.get_ident()] = buf


def _detach_buffer() -> Any:
    return _BSEND_BUFFERS.pop(threading.get_ident(), None)


def _flush_buffer(*args: Any, **kwargs: Any) -> None:
    pass


#: The rank's own module functions that are MPI calls, by their code (what spmdsim.emulator.after_finalize
#: refuses after the rank's Finalize, besides the emulator's methods).
_RANK_CALLS = {_Lifetime.Finalize.__code__: "Finalize", _Lifetime.Query_thread.__code__: "Query_thread",
               is_rank_thread.__code__: "Is_thread_main", _attach_buffer.__code__: "Attach_buffer",
               _detach_buffer.__code__: "Detach_buffer", _flush_buffer.__code__: "Flush_buffer",
               completed.__code__: "Iflush_buffer"}


#: The swapped names whose simulated value is the same for every rank (a class, a constant): found once.
_SAME_FOR_EVERY_RANK = frozenset(("Comm", "Intracomm", "Intercomm", "Topocomm", "Cartcomm", "Graphcomm",
                                  "Distgraphcomm", "Request", "Prequest", "Group", "Message", "REQUEST_NULL",
                                  "MESSAGE_NULL", "MESSAGE_NO_PROC", "Attach_buffer", "Iflush_buffer",
                                  "Is_thread_main", *_PORT_CALLS))


def _property(name: str) -> property:
    fixed: list = []  # the value, once found, of a name in _SAME_FOR_EVERY_RANK
    world = name == "COMM_WORLD"

    def get(module: Any) -> Any:
        state = _local.simulated()
        if state is None:
            return module.__dict__[name]
        if world:  # a program (mpi4py's tests: self.COMM) reads it again and again: the rank's, once made
            comm = state.world_comm
            if comm is not None:
                return comm
        elif fixed:
            return fixed[0]
        value = _simulated(name, state)
        if name in _SAME_FOR_EVERY_RANK:
            fixed[:] = [value]
        return value
    return property(get)


class _SimulatedMPI(types.ModuleType):
    """mpi4py.MPI's module type while swapped (see the module docstring)."""


for _name in SWAPPED:
    setattr(_SimulatedMPI, _name, _property(_name))
del _name


@contextlib.contextmanager
def swapped() -> Iterator[None]:
    """Within this block, simulated ranks' threads see MPI.COMM_WORLD as their own (nests)."""
    from mpi4py import MPI

    if real("COMM_WORLD").Get_size() == 1:  # importing MPI initialized MPICH: unlink its segment now,
        release_segments_once(real("COMM_WORLD"))  # so a SIGKILL leaves nothing in /dev/shm

    def install() -> None:
        _OWN[:] = [type(MPI)]
        MPI.__class__ = _SimulatedMPI
        p2p.TAG_UB = real("COMM_WORLD").Get_attr(MPI.TAG_UB)  # the bound the ranks read: the one they meet

    def restore() -> None:
        MPI.__class__ = _OWN.pop()

    # a rank's threads are its own; so are mpi4py.util.pkl5 and sys.stdout, sys.stderr
    with _NESTING(install, restore), threads_of_ranks(), swapped_pkl5(), streams_of_ranks():
        yield
