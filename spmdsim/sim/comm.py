"""SimComm: the part of mpi4py's Intracomm that spmdsim and ordinary SPMD programs use, in one process.

Each simulated rank holds its own SimComm per communicator (they share a
`Group`). The buffer collectives read the other members' buffers directly and
write only the caller's own; reductions add in group order (member 0 + member
1 + ...), each member reducing one slice into a shared result that every
member then copies, so every rank gets the same bytes on every run. Object
forms pickle like mpi4py, so no rank ever holds another's Python object.
Nonblocking collectives complete when posted (a program may post them only in
the same order on every member, as MPI requires); persistent ones raise
NotImplementedError, which runtime.prepared answers with the blocking call.
"""
from __future__ import annotations

import functools
import pickle
from typing import Any, Callable, Optional

import numpy as np

from ..errors import DTypeError, ShapeError
from . import _local, p2p
from ._buffers import flat, in_place, reduction, special, vector
from .engine import Call, Group, SimulationError

__all__ = ["SimComm"]

_PICKLE = pickle.HIGHEST_PROTOCOL
DRY_MOVE_BYTES = 64 << 10  # see SimComm._dry


def _fold(ufunc: Any, parts: list, out: np.ndarray) -> None:
    """out = parts[0] op parts[1] op ... in that order (the fixed order every run repeats)."""
    if len(parts) == 1:
        np.copyto(out, parts[0])
        return
    ufunc(parts[0], parts[1], out=out)
    for part in parts[2:]:
        ufunc(out, part, out=out)


def _same_dtype(op: str, a: np.ndarray, b: np.ndarray) -> None:
    if a.dtype != b.dtype:
        raise DTypeError(f"{op}: send dtype {a.dtype.name!r} and receive dtype {b.dtype.name!r} differ")


def _alike(exc: BaseException) -> BaseException:
    """A fresh copy of `exc` for one more rank (each raises its own), or a SimulationError saying it."""
    try:
        return type(exc)(*exc.args)
    except Exception:  # noqa: BLE001 - a type that cannot be rebuilt from its args
        return SimulationError(f"{type(exc).__name__}: {exc}")


def _shared(n: int, dtype: np.dtype) -> Callable[[Any], None]:
    def complete(slot: Any) -> None:
        slot.shared = np.empty(n, dtype)
    return complete


class SimComm:
    """One simulated rank's view of one communicator (made by spmdsim.simulate, Split and Dup)."""

    def __init__(self, group: Group, me: int) -> None:
        self._group = group
        self._me = me
        self._seq = 0  # collective calls on this communicator: the rendezvous number
        self._freed = False

    # -- identity -------------------------------------------------------------------------

    def Get_rank(self) -> int:
        return self._me

    def Get_size(self) -> int:
        return self._group.size

    rank = property(Get_rank)
    size = property(Get_size)

    @property
    def world_rank(self) -> int:
        """This rank's number in the simulated world."""
        return self._group.members[self._me]

    def Is_inter(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<SimComm rank {self._me} of {self._group.size} ({self._group.label()})>"

    def _dry(self, op: str, signature: tuple, src: np.ndarray, dst: Any = None) -> bool:
        """In a dry run, for a large buffer: count it as held, meet the group, write zeros; True when done.

        Buffers up to DRY_MOVE_BYTES move for real even in a dry run: they carry
        what the program decides by (fingerprints, check tables, counts).
        """
        if not self._group.world.dry_run:
            return False
        _local.current().meter.hold(src, dst)
        if src.nbytes <= DRY_MOVE_BYTES:
            return False
        slot = self._enter(op, signature)
        self._group.leave(self._me, slot)
        if dst is not None and dst is not src:
            dst.fill(0)  # a result the program can read without tripping over garbage
        return True

    def _enter(self, op: str, signature: tuple, data: Any = None,
               complete: Optional[Callable[[Any], None]] = None) -> Any:
        if self._freed:
            raise SimulationError(f"{op} on a freed communicator (rank {self.world_rank})")
        self._seq += 1
        return self._group.enter(self._me, self._seq, Call(op, signature, data, complete))

    # -- communicators --------------------------------------------------------------------

    def Barrier(self) -> None:
        self._enter("barrier", ("barrier",))

    barrier = Barrier

    def Split(self, color: int = 0, key: int = 0) -> Any:
        """Members with equal `color` form a new communicator, ordered by (key, rank here)."""
        group = self._group

        def complete(slot: Any) -> None:
            by_color: dict[int, list] = {}
            for i, call in enumerate(slot.calls):
                c, k = call.data
                if c != special("UNDEFINED"):
                    by_color.setdefault(c, []).append((k, i))
            slot.shared = {c: Group(group.world, tuple(group.members[i] for _, i in sorted(items)))
                           for c, items in by_color.items()}

        slot = self._enter("split", ("split",), (int(color), int(key)), complete)
        new = slot.shared.get(int(color))
        if new is None:
            return _comm_null()
        return SimComm(new, new.members.index(self.world_rank))

    def Split_type(self, split_type: Any, key: int = 0, info: Any = None) -> Any:
        """Every simulated rank shares one node: one communicator of all members, ordered by key."""
        return self.Split(0, key)

    def Dup(self, info: Any = None) -> "SimComm":
        group = self._group
        slot = self._enter("dup", ("dup",), None,
                           lambda s: setattr(s, "shared", Group(group.world, group.members)))
        return SimComm(slot.shared, self._me)

    Clone = Dup

    def Free(self) -> None:
        self._freed = True

    def Abort(self, errorcode: int = 0) -> None:
        raise SimulationError(f"simulated rank {self.world_rank} called Abort({errorcode})")

    # -- buffer collectives ---------------------------------------------------------------

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = None) -> None:
        name, ufunc, _ = reduction("sum" if op is None else op)
        dst = flat(recvbuf, "Allreduce recvbuf")
        src = dst if in_place(sendbuf) else flat(sendbuf, "Allreduce sendbuf")
        _same_dtype("Allreduce", src, dst)
        n = src.size
        signature = ("allreduce", src.dtype.name, n, name)
        if self._dry("allreduce", signature, src, dst):
            return
        slot = self._enter("allreduce", signature, src, _shared(n, src.dtype))
        g, me = self._group.size, self._me
        lo, hi = n * me // g, n * (me + 1) // g
        if hi > lo:
            _fold(ufunc, [c.data[lo:hi] for c in slot.calls], slot.shared[lo:hi])
        self._group.leave(me, slot)
        dst[:n] = slot.shared

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        dst = flat(recvbuf, "Allgather recvbuf")
        g, me = self._group.size, self._me
        inplace = in_place(sendbuf)
        src = dst[me * (dst.size // g):(me + 1) * (dst.size // g)] if inplace else flat(sendbuf, "Allgather sendbuf")
        _same_dtype("Allgather", src, dst)
        n = src.size
        if dst.size < n * g:
            raise ShapeError(f"Allgather: receive buffer of {dst.size} items is smaller than {g} x {n}")
        if self._dry("allgather", ("allgather", src.dtype.name, n), src, dst):
            return
        slot = self._enter("allgather", ("allgather", src.dtype.name, n), src)
        if inplace:
            for j, call in enumerate(slot.calls):
                if j != me:
                    dst[j * n:(j + 1) * n] = call.data
        else:
            np.concatenate([c.data for c in slot.calls], out=dst[:n * g])
        self._group.leave(me, slot)

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        if in_place(sendbuf):
            raise ShapeError("Alltoall with MPI.IN_PLACE is not simulated; pass a send buffer")
        src, dst = flat(sendbuf, "Alltoall sendbuf"), flat(recvbuf, "Alltoall recvbuf")
        _same_dtype("Alltoall", src, dst)
        g, me = self._group.size, self._me
        if src.size % g or dst.size < src.size:
            raise ShapeError(f"Alltoall: {src.size} items do not split into {g} equal blocks "
                             f"or do not fit the receive buffer of {dst.size}")
        b = src.size // g
        if self._dry("alltoall", ("alltoall", src.dtype.name, src.size), src, dst):
            return
        slot = self._enter("alltoall", ("alltoall", src.dtype.name, src.size), src)
        for j, call in enumerate(slot.calls):
            dst[j * b:(j + 1) * b] = call.data[me * b:(me + 1) * b]
        self._group.leave(me, slot)

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:
        src, scounts, sdispls = vector(sendbuf, "Alltoallv sendbuf")
        dst, rcounts, rdispls = vector(recvbuf, "Alltoallv recvbuf")
        _same_dtype("Alltoallv", src, dst)
        g, me = self._group.size, self._me
        if len(scounts) != g or len(rcounts) != g:
            raise ShapeError(f"Alltoallv: {len(scounts)} send and {len(rcounts)} receive counts "
                             f"for a group of {g}")
        if self._dry("alltoallv", ("alltoallv", src.dtype.name), src, dst):
            return
        slot = self._enter("alltoallv", ("alltoallv", src.dtype.name), (src, scounts, sdispls))
        for j, call in enumerate(slot.calls):
            theirs, counts, displs = call.data
            if counts[me] != rcounts[j]:
                raise ShapeError(f"Alltoallv counts disagree: rank {self._group.members[j]} sends "
                                 f"{counts[me]} items to rank {self.world_rank}, which expects {rcounts[j]}")
            if rcounts[j]:
                dst[rdispls[j]:rdispls[j] + rcounts[j]] = theirs[displs[me]:displs[me] + counts[me]]
        self._group.leave(me, slot)

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = None) -> None:
        name, ufunc, _ = reduction("sum" if op is None else op)
        dst = flat(recvbuf, "Reduce_scatter_block recvbuf")
        inplace = in_place(sendbuf)
        src = dst if inplace else flat(sendbuf, "Reduce_scatter_block sendbuf")
        _same_dtype("Reduce_scatter_block", src, dst)
        g, me = self._group.size, self._me
        b = src.size // g if inplace else dst.size
        if src.size < b * g:
            raise ShapeError(f"Reduce_scatter_block: {src.size} items are fewer than {g} blocks of {b}")
        if self._dry("reduce_scatter", ("reduce_scatter", src.dtype.name, b, name), src, dst):
            return
        slot = self._enter("reduce_scatter", ("reduce_scatter", src.dtype.name, b, name), src)
        out = np.empty(b, src.dtype) if inplace else dst[:b]
        _fold(ufunc, [c.data[me * b:(me + 1) * b] for c in slot.calls], out)
        self._group.leave(me, slot)
        if inplace:
            dst[:b] = out

    def Bcast(self, buf: Any, root: int = 0) -> None:
        data = flat(buf, "Bcast buffer")
        if self._dry("bcast", ("bcast", data.dtype.name, data.size, f"root {root}"), data):
            return
        slot = self._enter("bcast", ("bcast", data.dtype.name, data.size, f"root {root}"), data)
        if self._me != root:
            data[...] = slot.calls[root].data
        self._group.leave(self._me, slot)

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        me = self._me
        src = flat(sendbuf, "Gather sendbuf")
        slot = self._enter("gather", ("gather", src.dtype.name, src.size, f"root {root}"), src)
        if me == root:
            n = src.size
            dst = flat(recvbuf, "Gather recvbuf")
            np.concatenate([c.data for c in slot.calls], out=dst[:n * self._group.size])
        self._group.leave(me, slot)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = None, root: int = 0) -> None:
        name, ufunc, _ = reduction("sum" if op is None else op)
        me = self._me
        src = flat(recvbuf, "Reduce recvbuf") if in_place(sendbuf) else flat(sendbuf, "Reduce sendbuf")
        slot = self._enter("reduce", ("reduce", src.dtype.name, src.size, name, f"root {root}"), src)
        out = np.empty(src.size, src.dtype) if me == root else None
        if me == root:
            _fold(ufunc, [c.data for c in slot.calls], out)
        self._group.leave(me, slot)
        if me == root:
            flat(recvbuf, "Reduce recvbuf")[:src.size] = out

    # Posted and completed at once (see the module docstring).
    def _eager(method: Callable) -> Callable:  # noqa: N805 - a decorator used in the class body
        @functools.wraps(method)
        def post(self: "SimComm", *args: Any, **kwargs: Any) -> p2p.Request:
            method(self, *args, **kwargs)
            return p2p.completed()
        return post

    Iallreduce = _eager(Allreduce)
    Iallgather = _eager(Allgather)
    Ialltoall = _eager(Alltoall)
    Ialltoallv = _eager(Alltoallv)
    Ireduce_scatter_block = _eager(Reduce_scatter_block)
    Ibcast = _eager(Bcast)
    Igather = _eager(Gather)
    Ibarrier = _eager(Barrier)
    del _eager

    def _persistent(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("persistent collectives are not simulated; use the blocking call")

    Allreduce_init = Allgather_init = Alltoall_init = Reduce_scatter_block_init = _persistent

    # -- object collectives (pickled, as mpi4py does) ---------------------------------------

    def allgather(self, sendobj: Any) -> list:
        slot = self._enter("allgather(obj)", ("allgather(obj)",), pickle.dumps(sendobj, _PICKLE))
        return [pickle.loads(c.data) for c in slot.calls]

    def allreduce(self, sendobj: Any, op: Any = None) -> Any:
        name, _, fn = reduction("sum" if op is None else op)

        def complete(slot: Any) -> None:
            # Reduced once, by the last member to arrive (in rank order, as before): each member
            # then unpickles its own copy, so p ranks cost O(p), not p reductions of p objects.
            try:
                slot.shared = (True, pickle.dumps(functools.reduce(fn, [pickle.loads(c.data) for c in slot.calls]),
                                                  _PICKLE))
            except Exception as exc:  # noqa: BLE001 - raised alike on every member below
                slot.shared = (False, exc)

        slot = self._enter("allreduce(obj)", ("allreduce(obj)", name), pickle.dumps(sendobj, _PICKLE), complete)
        ok, value = slot.shared
        if not ok:
            raise _alike(value)
        return pickle.loads(value)

    def bcast(self, obj: Any = None, root: int = 0) -> Any:
        mine = pickle.dumps(obj, _PICKLE) if self._me == root else None
        slot = self._enter("bcast(obj)", ("bcast(obj)", f"root {root}"), mine)
        return obj if self._me == root else pickle.loads(slot.calls[root].data)

    def gather(self, sendobj: Any, root: int = 0) -> Optional[list]:
        slot = self._enter("gather(obj)", ("gather(obj)", f"root {root}"), pickle.dumps(sendobj, _PICKLE))
        return [pickle.loads(c.data) for c in slot.calls] if self._me == root else None

    def scatter(self, sendobj: Any = None, root: int = 0) -> Any:
        mine = None
        if self._me == root:
            if sendobj is None or len(sendobj) != self._group.size:
                raise ShapeError(f"scatter: root needs a sequence of {self._group.size} objects")
            mine = [pickle.dumps(o, _PICKLE) for o in sendobj]
        slot = self._enter("scatter(obj)", ("scatter(obj)", f"root {root}"), mine)
        return pickle.loads(slot.calls[root].data[self._me])

    def reduce(self, sendobj: Any, op: Any = None, root: int = 0) -> Any:
        name, _, fn = reduction("sum" if op is None else op)
        slot = self._enter("reduce(obj)", ("reduce(obj)", name, f"root {root}"), pickle.dumps(sendobj, _PICKLE))
        if self._me != root:
            return None
        return functools.reduce(fn, [pickle.loads(c.data) for c in slot.calls])

    def alltoall(self, sendobj: Any) -> list:
        if len(sendobj) != self._group.size:
            raise ShapeError(f"alltoall: expected a sequence of {self._group.size} objects")
        slot = self._enter("alltoall(obj)", ("alltoall(obj)",), [pickle.dumps(o, _PICKLE) for o in sendobj])
        return [pickle.loads(c.data[self._me]) for c in slot.calls]

    # -- point to point (spmdsim.sim.p2p) -------------------------------------------------

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> p2p.Request:
        return p2p.post_send(self._group, self._me, dest, tag, buf)

    def Irecv(self, buf: Any, source: Optional[int] = None, tag: Optional[int] = None) -> p2p.Request:
        return p2p.post_recv(self._group, self._me, _any(source, "ANY_SOURCE"), _any(tag, "ANY_TAG"), buf)

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self.Isend(buf, dest, tag).Wait()

    Ssend = Send

    def Recv(self, buf: Any, source: Optional[int] = None, tag: Optional[int] = None, status: Any = None) -> None:
        self.Irecv(buf, source, tag).Wait(status)

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: Optional[int] = None, recvtag: Optional[int] = None, status: Any = None) -> None:
        send = self.Isend(sendbuf, dest, sendtag)
        self.Irecv(recvbuf, source, recvtag).Wait(status)
        send.Wait()

    def isend(self, obj: Any, dest: int, tag: int = 0) -> p2p.Request:
        return p2p.post_send(self._group, self._me, dest, tag, None, obj)

    def irecv(self, buf: Any = None, source: Optional[int] = None, tag: Optional[int] = None) -> p2p.Request:
        return p2p.post_recv(self._group, self._me, _any(source, "ANY_SOURCE"), _any(tag, "ANY_TAG"), None)

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        self.isend(obj, dest, tag).Wait()

    def recv(self, buf: Any = None, source: Optional[int] = None, tag: Optional[int] = None,
             status: Any = None) -> Any:
        return self.irecv(None, source, tag).Wait(status)

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: Optional[int] = None, recvtag: Optional[int] = None, status: Any = None) -> Any:
        send = self.isend(sendobj, dest, sendtag)
        got = self.irecv(None, source, recvtag).Wait(status)
        send.Wait()
        return got


def _any(value: Optional[int], name: str) -> int:
    return special(name) if value is None else int(value)


def _comm_null() -> Any:
    import sys

    mpi = sys.modules.get("mpi4py.MPI")
    return None if mpi is None else mpi.COMM_NULL
