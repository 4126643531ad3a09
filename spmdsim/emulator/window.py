"""One-sided communication on simulated ranks: mpi4py's ``MPI.Win`` (docs/reference/emulator-windows-files.md).

    win = MPI.Win.Create(memory, disp_unit, MPI.INFO_NULL, comm)   # or Allocate, Allocate_shared, Create_dynamic
    win.Fence(); win.Put(data, target_rank); win.Fence()            # or Lock/Unlock, Start/Complete + Post/Wait

The ranks are threads of one process, so a window is the members' own memory, seen by every member:
an operation (Put, Get, Accumulate, Get_accumulate, Fetch_and_op, Compare_and_swap and their
request-based forms) is done when its call returns, one operation at a time on a window (so
accumulates are atomic per element, as MPI's are), a valid way for MPI to complete them (any time
up to the closing synchronization). What synchronizes is real: Fence is a barrier of the window's
group; Lock waits while another rank holds a conflicting lock on the target (exclusive against any,
shared against exclusive); Start waits for the targets' Post, Wait (and Test) for the origins'
Complete. A wait goes through the simulation's engine (spmdsim.runtime.sim.engine: the run slot handed on,
a deadlock reported with every rank's line). An operation outside an access epoch to its target (no
Fence, Start or Lock of it) raises MPI.Exception ERR_RMA_SYNC, as MPICH does; one outside the
target's window, ERR_RMA_RANGE.

Datatypes: predefined ones and any derived datatype MPI can pack, on both sides (spmdsim.emulator.window_bytes).

This module makes windows and answers for their identity and attributes; the operations are
spmdsim.emulator.window_ops', the synchronization calls spmdsim.emulator.window_sync's, the state they
share spmdsim.emulator.window_state's.
"""
from __future__ import annotations

from typing import Any

from ..runtime.sim._mpi import mpi_error, mpi_module, special
from .._lazy import numpy_on_first_use
from .group import SimGroup, speak_mpi4py
from .comm_errors import end_on_fatal_errors
from .handles import CommHandles, SwappedKind, initial_errhandler
from .comm import _resolve, self_comm
from ..base.context import simulated
from .window_bytes import _address, _memory
from .window_ops import WindowOperations
from .window_state import _Access, _Handle, _Shared, _mpi
from .window_sync import WindowSynchronization

np = numpy_on_first_use(globals())

__all__ = ["SimWin"]


class SimWin(np.ndarray, WindowOperations, WindowSynchronization, CommHandles, metaclass=SwappedKind):
    """One simulated rank's view of one window (mpi4py's Win). ``SimWin()`` is null (== MPI.WIN_NULL).

    Like mpi4py's Win it exposes this member's window memory through the buffer protocol
    (``memoryview(win)``, as mpi4py.util.sync reads its lock flags): Python 3.11 has no ``__buffer__``
    for a class of its own, so the window is a numpy array (of bytes) over that memory. Only the
    buffer is meant: numpy's methods on a window are not mpi4py's.
    """

    def __new__(cls, win: Any = None, memory: Any = None) -> "SimWin":
        if type.__instancecheck__(SimWin, win):  # MPI.Win(win): a copy sharing the handle
            memory = np.ndarray.view(win, np.ndarray)
        elif win is not None:
            mpi = mpi_module()
            if not (mpi is not None and isinstance(win, mpi.__dict__["Win"]) and win == mpi.WIN_NULL):
                raise TypeError(f"expected a window, got {type(win).__name__}")
        if memory is None or not memory.size:
            memory = np.zeros(0, np.uint8)
        self = np.ndarray.__new__(cls, (memory.size,), np.uint8, memory)
        if type.__instancecheck__(SimWin, win):
            self.__dict__.update(win.__dict__)
        else:
            self._h, self._comm, self._shared, self._access = None, None, None, _Access()
        return self

    def __init__(self, win: Any = None, memory: Any = None) -> None:
        pass

    # -- making one -----------------------------------------------------------------------

    @classmethod
    def _make(cls, comm: Any, flavor: int, memory: Any, unit: Any, info: Any) -> "SimWin":
        comm = _resolve(comm)
        comm._live_handle()
        unit = int(unit)
        if unit <= 0:
            raise mpi_error(_mpi(), _mpi().ERR_DISP, f"displacement unit {unit} must be positive")
        mine = _memory(memory) if flavor != _mpi().WIN_FLAVOR_DYNAMIC else None
        private = comm.Dup()  # the window's own communicator: its Fences are no calls of `comm`'s
        private._group.made = comm._group.label()  # a report names the window's ('a window's memory on the world')

        def complete(slot: Any) -> None:
            datas = [c.data for c in slot.calls]
            if flavor == _mpi().WIN_FLAVOR_SHARED:  # one block, each member's part after the one before
                sizes = [int(d[0]) for d in datas]
                block = np.zeros(max(1, sum(sizes)), np.uint8)
                starts = np.cumsum([0] + sizes)
                memories = [block[starts[i]:starts[i + 1]] for i in range(len(sizes))]
            elif flavor == _mpi().WIN_FLAVOR_ALLOCATE:
                memories = [np.zeros(int(d[0]), np.uint8) for d in datas]
            else:
                memories = [d[0] for d in datas]
            slot.shared = _Shared(flavor, memories, [d[1] for d in datas])
            slot.shared.group = comm._group  # the communicator's it was made on (every member's is one)

        slot = private._enter("win_create", ("win_create", flavor), (mine, unit), complete)
        win = cls(None, slot.shared.memories[private._me])
        win._h, win._comm, win._shared = _Handle(), private, slot.shared
        win._h.errhandler = initial_errhandler()  # mpi4py's rc.errors, else MPI's default for a window
        if info is not None and info != _mpi().INFO_NULL:
            win._h.info = info.Dup()
        return win

    @classmethod
    def Create(cls, memory: Any, disp_unit: int = 1, info: Any = None, comm: Any = None) -> "SimWin":
        """A window over each member's `memory` (a buffer; MPI.BOTTOM or None: none) (collective)."""
        return cls._make(_default_comm(comm), _mpi().WIN_FLAVOR_CREATE, memory, disp_unit, info)

    @classmethod
    def Allocate(cls, size: int, disp_unit: int = 1, info: Any = None, comm: Any = None) -> "SimWin":
        """A window over `size` new bytes of each member's (``tomemory()`` gives them) (collective)."""
        return cls._make(_default_comm(comm), _mpi().WIN_FLAVOR_ALLOCATE, _size(size), disp_unit, info)

    @classmethod
    def Allocate_shared(cls, size: int, disp_unit: int = 1, info: Any = None, comm: Any = None) -> "SimWin":
        """Allocate, the members' parts one block every member may read (``Shared_query``) (collective)."""
        return cls._make(_default_comm(comm), _mpi().WIN_FLAVOR_SHARED, _size(size), disp_unit, info)

    @classmethod
    def Create_dynamic(cls, info: Any = None, comm: Any = None) -> "SimWin":
        """A window of no memory; ``Attach`` exposes regions, addressed by ``MPI.Get_address`` (collective)."""
        return cls._make(_default_comm(comm), _mpi().WIN_FLAVOR_DYNAMIC, None, 1, info)

    def Attach(self, memory: Any) -> None:
        data = _memory(memory)
        shared = self._live()
        with shared.mutex:
            shared.attached[self._comm._me].append((_address(data), data))

    def Detach(self, memory: Any) -> None:
        address = _address(_memory(memory))
        shared = self._live()
        with shared.mutex:
            regions = shared.attached[self._comm._me]
            for i, (start, _) in enumerate(regions):
                if start == address:
                    del regions[i]
                    return
        raise mpi_error(_mpi(), _mpi().ERR_ARG, "Detach: this memory is not attached to the window")

    def Free(self) -> None:
        """Release the window (collective: a barrier of its group, as MPI's)."""
        self._live()
        comm = self._comm
        self._end_fence_epoch()  # (a fence epoch left open: its operations done, as MPI's Free does them)
        self._delete_attrs()
        self._h.freed = True
        with self._shared.mutex:
            self._shared.memories[comm._me] = None
        comm.Free()
        self._h, self._comm, self._shared = None, None, None

    def toint(self) -> int:
        """-1: a simulated window has no MPI handle (as a simulated communicator)."""
        return -1

    py2f = toint

    def free(self) -> None:
        """Free the window unless it is null (mpi4py's free)."""
        if self._h is not None and not self._h.freed:
            self.Free()

    # -- identity and attributes ---------------------------------------------------------------

    def _live(self) -> _Shared:
        if self._h is None or self._h.freed:
            raise mpi_error(_mpi(), _mpi().ERR_WIN, "the window is MPI.WIN_NULL (freed or never made)")
        return self._shared

    def _live_handle(self) -> Any:  # CommHandles' error handlers and attributes
        self._live()
        return self._h

    @property
    def _group(self) -> Any:  # for a fatal handler's report (spmdsim.emulator.comm_errors)
        return self._comm._group

    @property
    def world_rank(self) -> int:
        return self._comm.world_rank

    def __bool__(self) -> bool:
        return self._h is not None

    # Identity by the shared handle (CommHandles'), not numpy's elementwise comparison, which comes first in
    # the order of the bases.
    _MPI_CLASS, _MPI_NULL = "Win", "WIN_NULL"
    __eq__, __ne__, __hash__ = CommHandles.__eq__, CommHandles.__ne__, CommHandles.__hash__

    def __reduce__(self) -> Any:
        raise ValueError("cannot serialize 'mpi4py.MPI.Win' instance")

    def __repr__(self) -> str:
        if not self:
            return "<simulated Win null>"
        return f"<simulated Win rank {self._comm._me} of {self._comm.size} ({self._comm._group.label()})>"

    def Get_group(self) -> SimGroup:
        self._live()
        return self._comm.Get_group()

    group = property(Get_group)
    group_size = property(lambda self: self.Get_group().Get_size())
    group_rank = property(lambda self: self.Get_group().Get_rank())

    def Get_name(self) -> str:
        return "MPI_WIN_NULL" if self._h is None else self._h.name

    def Set_name(self, name: str) -> None:
        self._live()
        self._h.name = str(name)

    name = property(Get_name, Set_name)

    def Get_info(self) -> Any:
        self._live()
        return self._h.info.Dup() if self._h.info is not None else _mpi().Info.Create()

    def Set_info(self, info: Any) -> None:
        self._live()
        self._h.info = info.Dup() if info is not None and info != _mpi().INFO_NULL else None

    info = property(Get_info, Set_info)

    def _mine(self) -> tuple[int, int]:
        """(base address, size in bytes) of this member's memory (0, 0: dynamic)."""
        shared = self._live()
        memory = shared.memories[self._comm._me]
        if memory is None:
            return 0, 0
        return _address(memory), memory.size

    def Get_attr(self, keyval: int) -> Any:
        """MPI.WIN_BASE, WIN_SIZE, WIN_DISP_UNIT, WIN_CREATE_FLAVOR, WIN_MODEL (always MPI.WIN_UNIFIED:
        the members' memory is the window), or a user keyval's value."""
        mpi = _mpi()
        shared = self._live()
        if keyval == mpi.WIN_BASE:
            return self._mine()[0]
        if keyval == mpi.WIN_SIZE:
            return self._mine()[1]
        if keyval == mpi.WIN_DISP_UNIT:
            return shared.units[self._comm._me]
        if keyval == mpi.WIN_CREATE_FLAVOR:
            return shared.flavor
        if keyval == mpi.WIN_MODEL:
            return mpi.WIN_UNIFIED
        return super().Get_attr(keyval)

    attrs = property(lambda self: (*self._mine(), self._live().units[self._comm._me]))
    flavor = property(lambda self: self.Get_attr(_mpi().WIN_CREATE_FLAVOR))
    model = property(lambda self: self.Get_attr(_mpi().WIN_MODEL))

    def tomemory(self) -> Any:
        """This member's window memory as an MPI.buffer (empty for a dynamic window)."""
        base, size = self._mine()
        return _mpi().buffer.fromaddress(base, size)

    def Shared_query(self, rank: int) -> tuple:
        """(member `rank`'s memory, its displacement unit); MPI.PROC_NULL: the first member with memory."""
        shared = self._live()
        rank = int(rank)
        if rank == special("PROC_NULL"):
            rank = next((i for i, m in enumerate(shared.memories) if m is not None and m.size), 0)
        elif not 0 <= rank < len(shared.memories):
            raise mpi_error(_mpi(), _mpi().ERR_RANK, f"Shared_query: rank {rank} is not in the window's group "
                                                     f"of {len(shared.memories)}")
        memory = shared.memories[rank]
        if memory is None:
            return _mpi().buffer.fromaddress(0, 0), shared.units[rank]
        return _mpi().buffer.fromaddress(_address(memory), memory.size), shared.units[rank]


speak_mpi4py(SimWin, "Win")
end_on_fatal_errors(SimWin)


def _default_comm(comm: Any) -> Any:
    if comm is None:
        return self_comm(simulated())
    return comm


def _size(size: Any) -> int:
    size = int(size)
    if size < 0:
        raise mpi_error(_mpi(), _mpi().ERR_SIZE, f"window size {size} is negative")
    return size
