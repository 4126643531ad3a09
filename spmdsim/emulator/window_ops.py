"""A window's operations (spmdsim.emulator.window): Put, Get, Accumulate, Get_accumulate, Fetch_and_op,
Compare_and_swap and their request-based forms, one at a time on a window. In a lock or a Start epoch each is
done when its call returns; in a fence epoch it is done at the Fence that ends the epoch, as MPICH does it, so
a target that reads its window, or an origin that reads what a Get brought, before that Fence sees the bytes
as they were (MPI leaves them undefined until then): the origin's bytes are taken when it calls."""
from __future__ import annotations

from typing import Any, Optional

from ..runtime.sim._mpi import mpi_error, special
from ..runtime.sim.requests import completed, noted
from .._lazy import numpy_on_first_use
from .window_bytes import _NO_OP, _Side, _attached, _combined, _one_element, _op, _positions, _same_bytes, _span, \
    _target_args
from .window_state import _mpi

np = numpy_on_first_use(globals())


class WindowOperations:
    """SimWin's one-sided operations (a mixin; `self._shared`, `self._access`: the window's state)."""

    def Put(self, origin: Any, target_rank: int, target: Any = None) -> None:
        """Write `origin` into `target_rank`'s window at `target` (disp, or (disp, count, datatype))."""
        found = self._operation("Put", origin, target_rank, target, readonly=True)
        if found is not None:
            self._apply(found[1], None, found[0], fenced=found[2])

    def Get(self, origin: Any, target_rank: int, target: Any = None) -> None:
        """Read `target_rank`'s window at `target` into `origin`."""
        found = self._operation("Get", origin, target_rank, target, readonly=False)
        if found is not None:
            self._apply(found[1], _NO_OP, into=found[0], fenced=found[2])

    def Accumulate(self, origin: Any, target_rank: int, target: Any = None, op: Any = None) -> None:
        """target = target `op` origin, element by element (MPI.SUM by default; MPI.REPLACE: Put)."""
        found = self._operation("Accumulate", origin, target_rank, target, readonly=True)
        if found is not None:
            self._apply(found[1], _op(op), found[0], fenced=found[2])

    def Get_accumulate(self, origin: Any, result: Any, target_rank: int, target: Any = None,
                       op: Any = None) -> None:
        """result = target, then target = target `op` origin (MPI.NO_OP: a Get)."""
        red = _op(op)
        if int(target_rank) == special("PROC_NULL"):
            return
        source, where, fenced = self._operation("Get_accumulate", origin, target_rank, target, readonly=True,
                                                no_origin=red is _NO_OP)
        into = _Side.of(result, "result buffer", readonly=False)
        _same_bytes("Get_accumulate", into, where)
        self._apply(where, red, source, into, fenced)

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
        self._apply(where, red, source, into, self._fenced(int(target_rank)))

    def _apply(self, where: "_Side", red: Any, source: Optional["_Side"] = None,
               into: Optional["_Side"] = None, fenced: bool = False) -> None:
        """One operation on the target's bytes `where`, under the window's lock: `into` (if given) gets
        them as they were, then they become old `red` source's (`red` None: MPI.REPLACE, the source's;
        _NO_OP: unchanged). `fenced`: kept, with the source's bytes as they are now, for the Fence that ends
        the epoch (`done_fenced`)."""
        data = source.read() if red is not _NO_OP else None
        if fenced and red is not None and red is not _NO_OP:  # an op the type lacks raises at the call, as MPICH's
            _combined(red, data, data, where.basic)
        self._now_or_kept(fenced, lambda: self._apply_now(where, red, data, into))

    def _now_or_kept(self, fenced: bool, operation: Any) -> None:
        """`operation()` now, or where `fenced` kept for the Fence that ends the epoch (`done_fenced`)."""
        if fenced:
            self._access.pending.append(operation)
        else:
            operation()

    def _apply_now(self, where: "_Side", red: Any, data: Any, into: Optional["_Side"]) -> None:
        with self._shared.mutex:
            old = where.read() if into is not None or red is not None else None  # a Put reads no target
            if into is not None:
                into.write(old)
            if red is not _NO_OP:
                where.write(_combined(red, old, data, where.basic))
                self._moved()

    def _fenced(self, rank: int) -> bool:
        """Whether this member reaches member `rank`'s window by its fence epoch alone (not a lock, nor Start)."""
        access = self._access
        return bool(access.fence and not access.lock_all and rank not in access.locked
                    and not (access.started is not None and rank in access.started))

    def done_fenced(self, kept: int = 0) -> None:
        """Do the operations this member's fence epoch kept (`_now_or_kept`), in the order it made them, from the
        `kept`-th on: the Fence that ends the epoch, or a call that ends it otherwise (Free, Lock, Lock_all,
        Start), all of them; a request-based operation, its own (`_requested`)."""
        pending = self._access.pending
        now, pending[kept:] = pending[kept:], []
        for operation in now:
            operation()

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
        data, compare = source.read(), bytes(against.read())

        def swap() -> None:
            with self._shared.mutex:
                old = where.read()
                into.write(old)
                if bytes(old) == compare:
                    where.write(data)
                    self._moved()
        self._now_or_kept(self._fenced(int(target_rank)), swap)

    def _moved(self) -> None:
        """A write into a window: progress, as a message moving is, for a loop that polls (World.pause: a loop
        of Puts and Flushes while the others wait is no deadlock; one of Gets and Flushes alone reads what
        nothing changes). Counted without the world lock (the count only has to change)."""
        self._comm._group.world.moves += 1

    def Rput(self, origin: Any, target_rank: int, target: Any = None) -> Any:
        return self._requested("Rput", lambda: self.Put(origin, target_rank, target))

    def Rget(self, origin: Any, target_rank: int, target: Any = None) -> Any:
        return self._requested("Rget", lambda: self.Get(origin, target_rank, target))

    def Raccumulate(self, origin: Any, target_rank: int, target: Any = None, op: Any = None) -> Any:
        return self._requested("Raccumulate", lambda: self.Accumulate(origin, target_rank, target, op))

    def Rget_accumulate(self, origin: Any, result: Any, target_rank: int, target: Any = None,
                        op: Any = None) -> Any:
        return self._requested("Rget_accumulate",
                               lambda: self.Get_accumulate(origin, result, target_rank, target, op))

    def _requested(self, call: str, operation: Any) -> Any:
        """A request-based operation (`call`: Rput, ...): `operation` done before it returns, in a fence epoch too
        (what a Wait on its request completes MPICH has done by then), and its request."""
        kept = len(self._access.pending)
        operation()
        self.done_fenced(kept)
        return self._request(call)

    def _request(self, call: str) -> Any:
        """The request of a request-based operation (`call`: Rput, ...), done when its call returned; noted until
        the program completes it, as a nonblocking collective's (a warning names one never completed, on the
        communicator the window was made on: spmdsim.runtime.sim.requests.noted)."""
        return noted(completed(), call, self._shared.group, self._comm._me)

    def _operation(self, call: str, origin: Any, target_rank: Any, target: Any, readonly: bool,
                   no_origin: bool = False) -> Optional[tuple]:
        """(the origin's side, the target's, whether it waits for the Fence: `_fenced`) of one operation, checked;
        None for MPI.PROC_NULL."""
        rank = int(target_rank)
        if rank == special("PROC_NULL"):
            return None
        side = _Side.of(origin, "origin buffer", readonly, allow_none=no_origin)
        disp, count, datatype = _target_args(target, side)
        where = self._target(call, rank, (disp, count, datatype))
        if not no_origin:
            _same_bytes(call, side, where)
        return side, where, self._fenced(rank)

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
