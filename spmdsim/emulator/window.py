"""One-sided communication on simulated ranks: mpi4py's ``MPI.Win`` (docs/howto/simulate.md, "One-sided").

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

Datatypes: predefined ones and any derived datatype MPI can pack, on both sides: a derived type's
bytes are found with this process's MPI (``Datatype.Pack`` on the real MPI.COMM_SELF of a buffer
whose bytes count their own positions), as spmdsim.emulator.derived sends them. An accumulate
computes in the datatype's predefined element type (MPI requires one per operation).
"""
from __future__ import annotations

import threading
from typing import Any, Optional

from ..runtime.sim._buffers import _unpack, array_of, fold, mpi_error, mpi_module, mpi_datatype, numpy_dtype, \
    reduction, special, typecode_datatype
from ..runtime.sim.engine import _Waiting
from ..runtime.sim.waiting import ranks_text
from .._lazy import numpy_on_first_use
from .group import SimGroup, _sim as _sim_group, speak_mpi4py
from .handles import CommHandles, end_on_fatal_errors, initial_errhandler
from .typemap import mapped
from .comm import _resolve, self_comm
from ..runtime.sim.requests import completed, noted, rank_name
from ..runtime.sim.report import whereabouts
from ..base.context import simulated
from .derived import _self

np = numpy_on_first_use(globals())

__all__ = ["SimWin"]


def _mpi() -> Any:
    from mpi4py import MPI

    return MPI


class _Shared:
    """What the members of one window share: each member's memory (a flat uint8 view), displacement
    unit and, for a dynamic window, attached regions; the targets' locks and the post/complete counts."""

    def __init__(self, flavor: int, memories: list, units: list) -> None:
        self.flavor = flavor
        self.group: Any = None  # the Group of the communicator it was made on (a warning names it)
        self.memories = memories  # member -> its window's bytes (uint8, 1-d), or None (dynamic)
        self.units = units
        self.attached: list = [[] for _ in memories]  # dynamic: member -> [(address, bytes)]
        self.mutex = threading.Lock()  # one operation at a time on the window's memory
        self.locks: dict = {}  # target -> [exclusive holder or None, {shared holder: count}]
        self.posts: dict = {}  # (target, origin) -> Posts not yet met by a Start
        self.completes: dict = {}  # (target, origin) -> Completes not yet met by a Wait
        self.waiters: dict = {}  # world rank -> the token it waits with (released on any change)
        self.lock_lines: dict = {}  # target -> [member, ...] waiting for a lock on it, in the order they asked


class _Access:
    """One member's synchronization state on its window (its own, not shared)."""

    __slots__ = ("fence", "started", "posted", "locked", "lock_all")

    def __init__(self) -> None:
        self.fence = False  # inside a fence epoch (a Fence without MODE_NOSUCCEED)
        self.started: Optional[tuple] = None  # Start's targets (window ranks), until Complete
        self.posted: Optional[tuple] = None  # Post's origins, until Wait
        self.locked: dict = {}  # target -> MPI.LOCK_EXCLUSIVE / LOCK_SHARED (None: MODE_NOCHECK)
        self.lock_all = False


class _Handle:
    """What copies of one window share (``MPI.Win(win)``): its name, info, error handler, attributes."""

    __slots__ = ("name", "info", "errhandler", "attrs", "freed")

    def __init__(self) -> None:
        self.name = ""
        self.info: Any = None
        self.errhandler: Any = None  # None: MPI.ERRORS_RETURN (a new window: what mpi4py.rc.errors gives)
        self.attrs: dict = {}
        self.freed = False


class _WinType(type):
    """SimWin's metaclass: mpi4py's own windows (MPI.WIN_NULL) are instances of the swapped MPI.Win too."""

    def __instancecheck__(cls, obj: Any) -> bool:
        if type.__instancecheck__(cls, obj):
            return True
        mpi = mpi_module()
        return mpi is not None and isinstance(obj, mpi.__dict__["Win"])


class SimWin(np.ndarray, CommHandles, metaclass=_WinType):
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
        comm.Barrier()
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
    def _group(self) -> Any:  # for a fatal handler's report (spmdsim.emulator.handles)
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

    # -- operations ----------------------------------------------------------------------------

    def Put(self, origin: Any, target_rank: int, target: Any = None) -> None:
        """Write `origin` into `target_rank`'s window at `target` (disp, or (disp, count, datatype))."""
        found = self._operation("Put", origin, target_rank, target, readonly=True)
        if found is not None:
            self._apply(found[1], None, found[0])

    def Get(self, origin: Any, target_rank: int, target: Any = None) -> None:
        """Read `target_rank`'s window at `target` into `origin`."""
        found = self._operation("Get", origin, target_rank, target, readonly=False)
        if found is not None:
            self._apply(found[1], _NO_OP, into=found[0])

    def Accumulate(self, origin: Any, target_rank: int, target: Any = None, op: Any = None) -> None:
        """target = target `op` origin, element by element (MPI.SUM by default; MPI.REPLACE: Put)."""
        found = self._operation("Accumulate", origin, target_rank, target, readonly=True)
        if found is not None:
            self._apply(found[1], _op(op), found[0])

    def Get_accumulate(self, origin: Any, result: Any, target_rank: int, target: Any = None,
                       op: Any = None) -> None:
        """result = target, then target = target `op` origin (MPI.NO_OP: a Get)."""
        red = _op(op)
        if int(target_rank) == special("PROC_NULL"):
            return
        source, where = self._operation("Get_accumulate", origin, target_rank, target, readonly=True,
                                        no_origin=red is _NO_OP)
        into = _Side.of(result, "result buffer", readonly=False)
        _same_bytes("Get_accumulate", into, where)
        self._apply(where, red, source, into)

    def Fetch_and_op(self, origin: Any, result: Any, target_rank: int, target_disp: int = 0,
                     op: Any = None) -> None:
        """Get_accumulate of one element at `target_disp`."""
        red = _op(op)
        source = _Side.of(origin, "origin buffer", readonly=True)
        into = _Side.of(result, "result buffer", readonly=False)
        if int(target_rank) == special("PROC_NULL"):
            return
        _one_element(("origin", source), ("result", into))
        where = self._target("Fetch_and_op", target_rank, (int(target_disp), 1, source.datatype))
        self._apply(where, red, source, into)

    def _apply(self, where: "_Side", red: Any, source: Optional["_Side"] = None,
               into: Optional["_Side"] = None) -> None:
        """One operation on the target's bytes `where`, under the window's lock: `into` (if given) gets
        them as they were, then they become old `red` source's (`red` None: MPI.REPLACE, the source's;
        _NO_OP: unchanged)."""
        with self._shared.mutex:
            old = where.read() if into is not None or red is not None else None  # a Put reads no target
            if into is not None:
                into.write(old)
            if red is not _NO_OP:
                where.write(_combined(red, old, source.read(), where.basic))
                self._moved()

    def Compare_and_swap(self, origin: Any, compare: Any, result: Any, target_rank: int,
                         target_disp: int = 0) -> None:
        """result = target; target = origin where target equals `compare` (one element)."""
        source = _Side.of(origin, "origin buffer", readonly=True)
        against = _Side.of(compare, "compare buffer", readonly=True)
        into = _Side.of(result, "result buffer", readonly=False)
        if int(target_rank) == special("PROC_NULL"):
            return
        _one_element(("origin", source), ("compare", against), ("result", into))
        where = self._target("Compare_and_swap", target_rank, (int(target_disp), 1, source.datatype))
        with self._shared.mutex:
            old = where.read()
            into.write(old)
            if bytes(old) == bytes(against.read()):
                where.write(source.read())
                self._moved()

    def _moved(self) -> None:
        """A write into a window: progress, as a message moving is, for a loop that polls (World.pause: a loop
        of Puts and Flushes while the others wait is no deadlock; one of Gets and Flushes alone reads what
        nothing changes). Counted without the world lock (the count only has to change)."""
        self._comm._group.world.moves += 1

    def Rput(self, origin: Any, target_rank: int, target: Any = None) -> Any:
        self.Put(origin, target_rank, target)
        return self._request("Rput")

    def Rget(self, origin: Any, target_rank: int, target: Any = None) -> Any:
        self.Get(origin, target_rank, target)
        return self._request("Rget")

    def Raccumulate(self, origin: Any, target_rank: int, target: Any = None, op: Any = None) -> Any:
        self.Accumulate(origin, target_rank, target, op)
        return self._request("Raccumulate")

    def Rget_accumulate(self, origin: Any, result: Any, target_rank: int, target: Any = None,
                        op: Any = None) -> Any:
        self.Get_accumulate(origin, result, target_rank, target, op)
        return self._request("Rget_accumulate")

    def _request(self, call: str) -> Any:
        """The request of a request-based operation (`call`: Rput, ...), done when its call returned; noted until
        the program completes it, as a nonblocking collective's (a warning names one never completed, on the
        communicator the window was made on: spmdsim.runtime.sim.requests.noted)."""
        return noted(completed(), call, self._shared.group, self._comm._me)

    def _operation(self, call: str, origin: Any, target_rank: Any, target: Any, readonly: bool,
                   no_origin: bool = False) -> Optional[tuple]:
        """(the origin's side, the target's) of one operation, checked; None for MPI.PROC_NULL."""
        rank = int(target_rank)
        if rank == special("PROC_NULL"):
            return None
        side = _Side.of(origin, "origin buffer", readonly, allow_none=no_origin)
        disp, count, datatype = _target_args(target, side)
        where = self._target(call, rank, (disp, count, datatype))
        if not no_origin:
            _same_bytes(call, side, where)
        return side, where

    def _target(self, call: str, rank: int, target: tuple) -> "_Side":
        """The target's side of an operation on member `rank`, after checking this member may access it."""
        shared = self._live()
        mpi = _mpi()
        rank = int(rank)
        if not 0 <= rank < len(shared.memories):
            raise mpi_error(mpi, mpi.ERR_RANK, f"{call}: target rank {rank} is not in the window's group of "
                                               f"{len(shared.memories)}")
        access = self._access
        if not (access.fence or access.lock_all or rank in access.locked
                or (access.started is not None and rank in access.started)):
            raise mpi_error(mpi, mpi.ERR_RMA_SYNC, f"{call} to rank {rank} outside an access epoch (call Fence, "
                                                   f"Lock({rank}), Lock_all or Start first)")
        disp, count, datatype = target
        if disp < 0:
            raise mpi_error(mpi, mpi.ERR_DISP, f"{call}: negative target displacement {disp}")
        positions, nbytes, basic = _positions(datatype, count)
        with shared.mutex:
            if shared.flavor == mpi.WIN_FLAVOR_DYNAMIC:
                memory, start = _attached(shared.attached[rank], disp, call, rank)
            else:
                memory = shared.memories[rank]
                start = disp * shared.units[rank]
        if memory is None:
            memory = np.zeros(0, np.uint8)
        span = _span(positions, nbytes)
        if nbytes and (start < 0 or start + span > memory.size):
            raise mpi_error(mpi, mpi.ERR_RMA_RANGE, f"{call}: {nbytes} bytes at byte {start} of rank {rank}'s "
                                                    f"window of {memory.size} bytes")
        return _Side(memory, start, positions, nbytes, basic, datatype)

    # -- synchronization ----------------------------------------------------------------------

    def Fence(self, assertion: int = 0) -> None:
        """End the fence epoch and start the next (collective: a barrier of the window's group);
        MPI.MODE_NOSUCCEED: no epoch follows."""
        self._live()
        assertion = int(assertion)
        self._comm.Barrier()
        self._access.fence = not assertion & _mpi().MODE_NOSUCCEED

    def Start(self, group: Any, assertion: int = 0) -> None:
        """Open an access epoch to the members of `group`, once each has posted one to this member."""
        shared = self._live()
        targets = self._members_of(group)
        me = self._comm._me
        def consume() -> None:
            for t in targets:
                shared.posts[(t, me)] -= 1

        self._until(lambda: all(shared.posts.get((t, me), 0) for t in targets), "Win.Start", then=consume)
        self._access.started, self._access.fence = targets, False

    def Complete(self) -> None:
        """End Start's access epoch: its targets' Wait may return."""
        shared = self._live()
        targets = self._access.started
        if targets is None:
            raise mpi_error(_mpi(), _mpi().ERR_RMA_SYNC, "Complete without a Start")
        me = self._comm._me
        world = self._comm._group.world
        with world.lock:
            for t in targets:
                shared.completes[(t, me)] = shared.completes.get((t, me), 0) + 1
            _release_all(world, shared)
        self._access.started = None

    def Post(self, group: Any, assertion: int = 0) -> None:
        """Expose this member's window to the members of `group` (each one's Start may return)."""
        shared = self._live()
        origins = self._members_of(group)
        me = self._comm._me
        world = self._comm._group.world
        with world.lock:
            for o in origins:
                shared.posts[(me, o)] = shared.posts.get((me, o), 0) + 1
            _release_all(world, shared)
        self._access.posted, self._access.fence = origins, False

    def Wait(self) -> None:
        """End Post's exposure epoch once every origin in its group has called Complete."""
        shared = self._live()
        origins = self._posted()
        me = self._comm._me
        self._until(lambda: all(shared.completes.get((me, o), 0) for o in origins), "Win.Wait",
                    then=lambda: self._met(origins))

    def Test(self) -> bool:
        """Wait's test: True (and the exposure epoch ended) once every origin has called Complete."""
        shared = self._live()
        origins = self._posted()
        me = self._comm._me
        world = self._comm._group.world
        with world.lock:
            missing = [o for o in origins if not shared.completes.get((me, o), 0)]
            if not missing:
                self._met(origins)
        if missing:  # a loop of Tests no origin's Complete can end is a deadlock report (World.pause)
            world.pause(self.world_rank, _WinPoll(self, "Win.Test", tuple(missing)))
        return not missing

    def _posted(self) -> tuple:
        if self._access.posted is None:
            raise mpi_error(_mpi(), _mpi().ERR_RMA_SYNC, "Wait without a Post")
        return self._access.posted

    def _met(self, origins: tuple) -> None:
        """Wait's end: one Complete of each origin met (world lock held)."""
        me = self._comm._me
        for o in origins:
            self._shared.completes[(me, o)] -= 1
        self._access.posted = None

    def Lock(self, rank: int, lock_type: Any = None, assertion: int = 0) -> None:
        """Lock member `rank`'s window: MPI.LOCK_EXCLUSIVE (the default) waits until no other member holds
        a lock on it, MPI.LOCK_SHARED until none holds an exclusive one. MPI.MODE_NOCHECK: no wait."""
        shared = self._live()
        mpi = _mpi()
        rank = int(rank)
        lock_type = mpi.LOCK_EXCLUSIVE if lock_type is None else int(lock_type)
        if lock_type not in (mpi.LOCK_EXCLUSIVE, mpi.LOCK_SHARED):
            raise mpi_error(mpi, mpi.ERR_LOCKTYPE, f"Lock: lock type {lock_type} is not MPI.LOCK_EXCLUSIVE or "
                                                   f"MPI.LOCK_SHARED")
        if rank == special("PROC_NULL"):
            return
        if not 0 <= rank < len(shared.memories):
            raise mpi_error(mpi, mpi.ERR_RANK, f"Lock: rank {rank} is not in the window's group of "
                                               f"{len(shared.memories)}")
        if rank in self._access.locked:
            raise mpi_error(mpi, mpi.ERR_RMA_SYNC, f"Lock: this rank holds a lock on rank {rank} already")
        self._access.fence = False  # a fence epoch ends where a lock epoch begins (MPICH: no Put after it)
        if int(assertion) & mpi.MODE_NOCHECK:
            self._access.locked[rank] = None
            return
        exclusive = lock_type == mpi.LOCK_EXCLUSIVE
        self._lock_in_turn(shared, rank, exclusive, f"Win.Lock of rank {rank}")
        self._access.locked[rank] = lock_type

    def Unlock(self, rank: int) -> None:
        """Release the lock on member `rank` (its operations are complete already)."""
        shared = self._live()
        rank = int(rank)
        if rank == special("PROC_NULL"):
            return
        if rank not in self._access.locked:
            raise mpi_error(_mpi(), _mpi().ERR_RMA_SYNC, f"Unlock: this rank holds no lock on rank {rank}")
        if self._access.locked.pop(rank) is not None:
            self._drop_lock(shared, rank)
        self._poll("Win.Unlock", nap=False)  # a loop of Lock and Unlock waiting for another rank's update lets
        # that rank run

    def Lock_all(self, assertion: int = 0) -> None:
        """A shared lock on every member's window."""
        shared = self._live()
        if self._access.lock_all:
            raise mpi_error(_mpi(), _mpi().ERR_RMA_SYNC, "Lock_all: this rank holds Lock_all already")
        self._access.fence = False
        if not int(assertion) & _mpi().MODE_NOCHECK:
            for rank in range(len(shared.memories)):
                self._lock_in_turn(shared, rank, False, f"Win.Lock_all (rank {rank})")
        self._access.lock_all = "checked" if not int(assertion) & _mpi().MODE_NOCHECK else "nocheck"

    def Unlock_all(self) -> None:
        shared = self._live()
        held, self._access.lock_all = self._access.lock_all, False
        if not held:
            raise mpi_error(_mpi(), _mpi().ERR_RMA_SYNC, "Unlock_all without a Lock_all")
        if held == "checked":
            for rank in range(len(shared.memories)):
                self._drop_lock(shared, rank)
        self._poll("Win.Unlock_all", nap=False)

    def _lock_in_turn(self, shared: _Shared, rank: int, exclusive: bool, what: str) -> None:
        """Take a lock on member `rank`'s window once it may be taken and the members that asked before this
        one have theirs: in the order they asked, as a fair lock grants it. A member that unlocks and locks
        again at once no longer takes the lock before one that waits for it (mpi4py's nxtval-scalable demo:
        two ranks' mutex loops, one always locking again first, the other's increment never undone, and
        the loop ran forever now and then)."""
        me = self._comm._me
        world = self._comm._group.world
        with world.lock:
            line = shared.lock_lines.setdefault(rank, [])
            line.append(me)

        def take() -> None:
            _take_lock(shared, rank, me, exclusive)
            line.remove(me)
            _release_all(world, shared)  # the next in line may take a shared lock beside this one

        try:
            self._until(lambda: line[0] == me and _may_lock(shared, rank, exclusive), what, then=take)
        except BaseException:  # stopped while in line (another rank failed): leave the line
            with world.lock:
                if me in line:
                    line.remove(me)
            raise

    def _drop_lock(self, shared: _Shared, rank: int) -> None:
        me = self._comm._me
        world = self._comm._group.world
        with world.lock:
            state = shared.locks[rank]
            if state[0] == me:
                state[0] = None
            else:
                state[1][me] -= 1
                if not state[1][me]:
                    del state[1][me]
            _release_all(world, shared)

    def Flush(self, rank: int) -> None:
        """Complete this member's operations on `rank` (each is complete when its call returns): a poll
        point (a rank in line for a run slot computes first: a loop of Get and Flush waiting for another
        rank's Put lets that rank run)."""
        self._poll("Win.Flush", nap=False)

    def Flush_all(self) -> None:
        self._poll("Win.Flush_all", nap=False)

    def Flush_local(self, rank: int) -> None:
        self._poll("Win.Flush_local", nap=False)

    def Flush_local_all(self) -> None:
        self._poll("Win.Flush_local_all", nap=False)

    def Sync(self) -> None:
        """The public and private copies agree (one copy: MPI.WIN_UNIFIED); a poll point as Test is, where a
        loop that reads its window until another rank writes it (``while mem[0] == 0: win.Sync()``) naps
        after a while (spmdsim.runtime.sim.engine: SPIN_S) instead of spinning a core."""
        self._poll("Win.Sync", nap=True)

    def _poll(self, call: str, nap: bool) -> None:
        """A poll point (`call`: the program's call): a rank in line for a run slot computes first, and a loop of
        these that no write into a window ends, while every other rank waits or polls idly, is a deadlock
        report (World.pause, _WinPoll)."""
        self._live()
        self._comm._group.world.pause(self.world_rank, _WinPoll(self, call), nap=nap)

    def _members_of(self, group: Any) -> tuple:
        """The window ranks of `group`'s members (world ranks)."""
        members = self._comm._group.members
        sim = _sim_group(group)._live()
        out = []
        for w in sim._members:
            if w not in members:
                raise mpi_error(_mpi(), _mpi().ERR_GROUP, f"rank {w} of the group is not in the window's group")
            out.append(members.index(w))
        return tuple(out)

    def _until(self, ready: Any, what: str, then: Any = None) -> None:
        """Wait (through the engine) until `ready()` holds, then run `then()`, both under the world lock."""
        shared = self._shared
        world = self._comm._group.world
        rank = self.world_rank
        token = object()
        with world.lock:
            while True:
                world.check(rank)
                if ready():
                    shared.waiters.pop(rank, None)
                    if then is not None:
                        then()
                    return
                shared.waiters[rank] = token
                world.wait(rank, _Waiting(what, self._comm._group, None, token=token))


class _WinPoll:
    """What a rank polls a window with, for World.pause (spmdsim.runtime.sim.engine), which reports a loop of polls in
    vain as a request's: ``Win.Test`` waits for the Complete of the origins in `missing` (window ranks), and no
    rank left completes it once they all finished (`definite`: reported too while every other rank waits, as a
    request's Test); ``Sync``, ``Flush*`` and ``Unlock*`` wait for what the program's loop reads, which only a
    write into a window can change (`SimWin._moved`): reported only while every live rank waits or polls idly."""

    __slots__ = ("group", "me", "call", "missing", "definite")
    kind = "window"

    def __init__(self, win: SimWin, call: str, missing: Optional[tuple] = None) -> None:
        self.group, self.me, self.call = win._comm._group, win._comm._me, call
        self.missing, self.definite = missing, missing is not None

    def _what(self) -> str:
        if self.missing is None:
            return "a window's memory"
        return f"a window's exposure epoch (the Complete of {_names(self.group, self.missing)})"

    def why_stuck(self, world: Any) -> tuple[str, str]:
        """Where the origins whose Complete a Win.Test waits for are (those that wait have their own clause)."""
        if self.missing is None:
            return "", ""
        ranks = [self.group.members[o] for o in self.missing]
        return "".join(f"; {whereabouts(world, r)}" for r in ranks[:8] if r not in world.waiting), ""

    def never_completes(self, world: Any) -> bool:
        """Whether every origin a Win.Test waits for has finished (world lock held)."""
        return self.missing is not None and all(self.group.members[o] in world.finished for o in self.missing)


def _names(group: Any, ranks: tuple) -> str:
    """'rank 1', 'ranks 1,2', or on a communicator other than the world 'group rank 0 (world rank 2)', ..."""
    if group.members == tuple(range(group.world.size)):
        return ranks_text(ranks)
    return ", ".join(rank_name(group, r) for r in ranks)


speak_mpi4py(SimWin, "Win")
end_on_fatal_errors(SimWin)

_NO_OP = object()  # MPI.NO_OP: Get_accumulate and Fetch_and_op read and leave the target


def _op(op: Any) -> Any:
    mpi = _mpi()
    if op is None:
        return reduction(mpi.SUM)
    if op == mpi.NO_OP:
        return _NO_OP
    if op == mpi.REPLACE:
        return None
    red = reduction(op)
    if red.name == "user op":
        raise mpi_error(mpi, mpi.ERR_OP, "one-sided accumulates take MPI's predefined ops only")
    return red


def _combined(red: Any, old: np.ndarray, new: np.ndarray, basic: Any) -> np.ndarray:
    """The bytes of old `red` new (`red` None: MPI.REPLACE, `new`) in the element type `basic`."""
    if red is None:
        return new
    dtype = numpy_dtype(basic)
    out = np.empty(old.size // dtype.itemsize, dtype)
    mpi = _mpi()
    try:
        with np.errstate(all="ignore"):  # MPI's sum of two large numbers overflows without a word
            fold(red, [old.view(dtype), new.view(dtype)], out, basic)
    except mpi.Exception:  # MPI's own refusal (MAXLOC of plain ints), with its internal error stack
        raise mpi_error(mpi, mpi.ERR_OP, f"MPI.{red.name.upper()} is not defined on "
                                         f"{basic.Get_name() or 'this datatype'}") from None
    return out.view(np.uint8)


def _release_all(world: Any, shared: _Shared) -> None:
    """Let every member waiting on this window look again (world lock held)."""
    for rank, token in list(shared.waiters.items()):
        world.release(rank, token)


def _may_lock(shared: _Shared, rank: int, exclusive: bool) -> bool:
    state = shared.locks.get(rank)
    if state is None:
        return True
    return state[0] is None and (not exclusive or not state[1])


def _take_lock(shared: _Shared, rank: int, me: int, exclusive: bool) -> None:
    state = shared.locks.setdefault(rank, [None, {}])
    if exclusive:
        state[0] = me
    else:
        state[1][me] = state[1].get(me, 0) + 1


def _default_comm(comm: Any) -> Any:
    if comm is None:
        return self_comm(simulated())
    return comm


def _size(size: Any) -> int:
    size = int(size)
    if size < 0:
        raise mpi_error(_mpi(), _mpi().ERR_SIZE, f"window size {size} is negative")
    return size


def _memory(memory: Any) -> Any:
    """The memory's bytes (a flat uint8 view; MPI.BOTTOM and None: none), or an int: a size to allocate."""
    if type(memory) is int:
        return memory
    mpi = _mpi()
    if memory is None or memory is mpi.BOTTOM:
        return np.zeros(0, np.uint8)
    a = array_of(memory, "window memory", readonly=False, typed=True)
    return a.view(np.uint8) if a.size else np.zeros(0, np.uint8)


def _address(data: np.ndarray) -> int:
    return data.__array_interface__["data"][0] if data.size else 0


def _attached(regions: list, address: int, call: str, rank: int) -> tuple:
    """(the attached region holding `address`, the byte there) of a dynamic window's member."""
    for start, data in regions:
        if start <= address < start + max(data.size, 1):
            return data, address - start
    raise mpi_error(_mpi(), _mpi().ERR_RMA_RANGE, f"{call}: address {address:#x} is in no memory rank {rank} "
                                                  "attached to the window")


def _span(positions: Any, nbytes: int) -> int:
    if not nbytes:
        return 0
    return nbytes if type(positions) is int else int(positions.max()) + 1


class _Side:
    """The bytes one side of an operation reads or writes: `memory` (flat uint8) from byte `start`, either
    `positions` bytes in a row (an int) or at those offsets (an array, a derived datatype's typemap)."""

    __slots__ = ("memory", "start", "positions", "nbytes", "basic", "datatype")

    def __init__(self, memory: np.ndarray, start: int, positions: Any, nbytes: int, basic: Any, datatype: Any) -> None:
        self.memory, self.start, self.positions, self.nbytes = memory, start, positions, nbytes
        self.basic, self.datatype = basic, datatype

    @classmethod
    def of(cls, spec: Any, what: str, readonly: bool, allow_none: bool = False) -> "_Side":
        """A buffer spec (buf, [buf, datatype], [buf, count, datatype], ...) as mpi4py's message_simple reads it."""
        mapped(spec, what)
        buf, count, displ, datatype = _unpack(spec)
        if buf is None or buf is _mpi().BOTTOM:
            if count not in (None, 0) and not allow_none:
                raise ValueError(f"{what}: no buffer for {count} entries")
            a = np.zeros(0, np.uint8)
        else:
            a = array_of(buf, what, readonly, typed=datatype is not None)
        if datatype is None:
            datatype = _buffer_type(a.dtype)
        datatype = _as_datatype(datatype)
        raw = a.view(np.uint8) if a.size else np.zeros(0, np.uint8)
        extent = datatype.Get_extent()[1]
        if count is None:
            count = raw.size // extent if extent else 0
        start = 0 if displ is None else int(displ) * extent
        positions, nbytes, basic = _positions(datatype, int(count))
        if nbytes and start + _span(positions, nbytes) > raw.size:
            raise ValueError(f"{what}: {count} x {datatype.Get_name() or 'datatype'} do not fit a buffer of "
                             f"{raw.size} bytes")
        return cls(raw, start, positions, nbytes, basic, datatype)

    def read(self) -> np.ndarray:
        """A copy of the side's bytes, in typemap order."""
        if type(self.positions) is int:
            return self.memory[self.start:self.start + self.nbytes].copy()
        return self.memory[self.start + self.positions]

    def write(self, data: np.ndarray) -> None:
        if type(self.positions) is int:
            self.memory[self.start:self.start + self.nbytes] = data
        else:
            self.memory[self.start + self.positions] = data


def _as_datatype(datatype: Any) -> Any:
    """An MPI datatype, or a typecode ("d", "i", ...) as mpi4py reads one (KeyError for an unknown one)."""
    if isinstance(datatype, str):
        return typecode_datatype(_mpi(), datatype)
    if not isinstance(datatype, _mpi().Datatype):
        raise TypeError(f"expected a datatype, got {type(datatype).__name__}")
    return datatype


def _buffer_type(dtype: Any) -> Any:
    """The predefined datatype mpi4py reads off a buffer's format (its typecode): MPI.INT for int32, ..."""
    mpi = _mpi()
    if dtype.kind == "V":
        return mpi.BYTE
    found = mpi._typedict.get(dtype.char)
    return found if found is not None else mpi_datatype(dtype)


def _one_element(*sides: tuple) -> None:
    """mpi4py's checks of Fetch_and_op's and Compare_and_swap's buffers, in its order: each (name, side) one
    element, then each of the same datatype as the first (the origin)."""
    for what, side in sides:
        size = side.datatype.Get_size()
        count = side.nbytes // size if size else 0
        if count != 1:
            raise ValueError(f"{what}: expecting a single element, got {count}")
    origin = sides[0][1].datatype
    for what, side in sides[1:]:
        if side.datatype != origin:
            raise ValueError(f"mismatch in origin and {what} MPI datatypes")


def _same_bytes(call: str, origin: _Side, target: _Side) -> None:
    if origin.nbytes != target.nbytes:
        raise mpi_error(_mpi(), _mpi().ERR_TRUNCATE if origin.nbytes > target.nbytes else _mpi().ERR_ARG,
                        f"{call}: the origin's {origin.nbytes} bytes against the target's {target.nbytes}")


def _target_args(target: Any, origin: _Side) -> tuple:
    """(displacement, count, datatype) of a target spec, as mpi4py reads it: None, an int, or a list or
    tuple of up to 3 (missing ones the origin's)."""
    size = origin.datatype.Get_size()
    count = origin.nbytes // size if size else 0
    if target is None:
        return 0, count, origin.datatype
    if isinstance(target, (list, tuple)):
        if len(target) > 3:
            raise ValueError("target: expecting 3 items at most")
        disp = int(target[0]) if len(target) >= 1 else 0
        count = int(target[1]) if len(target) >= 2 else count
        datatype = _as_datatype(target[2]) if len(target) >= 3 else origin.datatype
        return disp, count, datatype
    try:
        return target.__index__(), count, origin.datatype
    except AttributeError:
        raise ValueError("target: expecting integral or list/tuple") from None


def _positions(datatype: Any, count: int) -> tuple:
    """(positions, bytes, predefined element type) of `count` of `datatype`: positions an int (so many
    bytes in a row, a predefined or contiguous type's) or the byte offsets of a derived type's data in
    typemap order (found by packing a buffer whose bytes count their own offsets)."""
    mpi = _mpi()
    if count < 0:
        raise mpi_error(mpi, mpi.ERR_COUNT, f"negative count {count}")
    if datatype.is_predefined:
        return count * datatype.Get_size(), count * datatype.Get_size(), datatype
    basic = _basic(datatype)
    lb, extent = datatype.Get_extent()
    true_lb, true_extent = datatype.Get_true_extent()
    size = datatype.Get_size()
    if not count or not size:
        return 0, 0, basic
    if lb == 0 and true_lb == 0 and extent == size and true_extent == size:  # no holes: bytes in a row
        return count * size, count * size, basic
    span = true_lb + (count - 1) * extent + true_extent  # the bytes the data reach, from the buffer's start
    if true_lb < 0 or extent <= 0:
        raise NotImplementedError("one-sided operations on a datatype with data before its buffer's start "
                                  "(a negative displacement or extent) are not simulated")
    comm = _self()
    # `count` of the type as one element spanning exactly those bytes: Pack reads a buffer in whole extents.
    whole = datatype.Create_contiguous(count)
    one = whole.Create_resized(0, span).Commit()
    whole.Free()
    try:
        planes = np.arange(span, dtype=np.int64).view(np.uint8).reshape(span, 8)
        packed = np.zeros(count * size, np.int64)
        out = np.empty(one.Pack_size(1, comm), np.uint8)
        for k in range(8 if span >= 1 << 32 else 4):
            end = one.Pack(np.ascontiguousarray(planes[:, k]), out, 0, comm)
            packed |= out[:end].astype(np.int64) << (8 * k)
    finally:
        one.Free()
    return packed, count * size, basic


def _basic(datatype: Any) -> Any:
    """The one predefined type a derived datatype is made of (MPI.BYTE if it mixes several)."""
    if datatype.is_predefined:
        return datatype
    base, combiner, params = datatype.decode()
    if combiner != "STRUCT":
        return _basic(base)
    kinds = {_basic(t).py2f(): _basic(t) for t in params["datatypes"]}
    return next(iter(kinds.values())) if len(kinds) == 1 else _mpi().BYTE
