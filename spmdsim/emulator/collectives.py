"""The buffer collectives of SimComm (mpi4py's Intracomm methods with capitalized names).

Every member deposits its send data; the last member to arrive runs every
member's reads of the others' data and writes of its own receive buffer, in
member order, and the members go on without a second wait
(engine.Group.enter_all). Counts are read from the message arguments as
mpi4py reads them (spmdsim.runtime.sim._buffers.message): in Allgather, Alltoall,
Gather and Scatter a count is per peer. Reductions add in a fixed order (member
0 + member 1 + ..., or MPICH's association), so every rank gets the same bytes on every run.
Reduce and Allreduce of floating-point values associate as MPICH 5 does
(spmdsim.runtime.sim.orders), so a program prints MPICH's digits.
Nonblocking forms (Iallreduce, Ibarrier, ..., a started Allreduce_init) return at
once, as MPI's posting must: the member's checks run and its call is deposited
with a copy of its data (engine.Group.post, `_kept`), without waiting for the
others. Its request is done once every member has posted the collective (in the
same order on every member, as MPI requires), and its completion (Wait, Waitall,
a Test that returns true, ..., or Free once done) runs the member's own phases,
reading the others' copies and writing its own receive buffer, and what the call
does after them (a derived datatype's unpacking), as MPICH's progress completes
it (CollectiveRequest): a program reading the buffer before then sees what was
there before, as on MPI, where it is undefined until completion. A Wait for a
collective some member never posts is a deadlock that names the call
(Ibarrier on the world, call 1).
"""
from __future__ import annotations

from typing import Any, Callable

import threading

from ..errors import RuntimeMismatchError, ShapeError
from ..runtime.sim import thread_engine as bodies
from .._lazy import numpy_on_first_use
from .derived import blocks, laid_out, may_be_derived, packed, unpacking, wmessage
from ..runtime.sim._buffers import (BufferSpecError, _unpack, copy_into, dtype_name, fold, in_place, mpi_error,
                            mpi_module, numpy_dtype, reduction)
from .typemap import message, vector  # the shared readers, refusing what mpi4py cannot map first
from ..runtime.sim.orders import allreduce_tree, reduce_tree
from ..runtime.sim.bodies import _nothing
from ..runtime.sim.thread_engine import bad_root
from ..runtime.sim.engine import _Waiting
from ..runtime.sim.report import whereabouts
from ..runtime.sim.requests import noted, rank_name, Request
from ..runtime.sim.landing import land

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["BufferCollectives", "bad_root"]

_SUM = "sum"


_same = bodies.checked_same


def _predefined_op_types(call: str, red: Any, *specs: Any) -> None:
    """MPI.ERR_OP, as MPICH raises it, where a predefined op (MPI.SUM, ..., MPI.REPLACE) meets a derived datatype
    (a contiguous one too) in a reduction: MPI defines those ops on predefined datatypes; a user-defined op
    (MPI.Op.Create) takes derived ones."""
    if red.name == "user op":
        return
    allowed = _OP_KINDS.get(red.name)
    if allowed is not None:
        _op_on_elements(call, red, allowed, specs)
    for spec in specs:
        if not may_be_derived(spec):  # a buffer, or one ending in a predefined datatype (most calls)
            continue
        try:
            datatype = _unpack(spec)[3]
        except ValueError:  # a malformed spec: refused where the others are
            continue
        mpi = mpi_module()
        if mpi is not None and isinstance(datatype, mpi.Datatype) and datatype != mpi.DATATYPE_NULL \
                and not datatype.is_predefined:
            combiner = datatype.decode()[1].lower()
            raise mpi_error(mpi, mpi.ERR_OP, f"{call}: MPI.{red.name.upper()} is not defined on a derived datatype "
                                             f"(a {combiner} type): MPI's predefined operations take predefined "
                                             f"datatypes, as MPICH checks; reduce the data as its element type, or "
                                             f"with a user-defined MPI.Op.Create")


#: The element kinds (numpy's) each predefined op is defined on, as the MPI standard lists them and MPICH checks:
#: sums and products of integers, floats and complex numbers; max and min of integers and floats; logical ops of
#: integers and booleans (C_BOOL); bitwise ops of integers.
_OP_KINDS = {"sum": "iufc", "prod": "iufc", "max": "iuf", "min": "iuf", "land": "iub", "lor": "iub", "lxor": "iub",
             "band": "iu", "bor": "iu", "bxor": "iu"}
_KIND_NAMES = {"b": "boolean (logical)", "f": "floating", "c": "complex", "i": "integer", "u": "integer"}


def _op_on_elements(call: str, red: Any, allowed: str, specs: tuple) -> None:
    """MPI.ERR_OP, as MPICH raises it ("Invalid MPI_Op"), where a predefined op meets elements the standard does
    not define it on: MPI.MAX of complex numbers, MPI.SUM of booleans, MPI.BAND of floats (numpy's answer here
    was a value, or a TypeError). The elements are a plain array's, or a predefined datatype's."""
    for spec in specs:
        if in_place(spec):
            continue
        if type(spec) is np.ndarray:
            kind = spec.dtype.kind
        elif type(spec) in (list, tuple) and spec and getattr(spec[-1], "is_predefined", False) is True:
            try:
                kind = numpy_dtype(spec[-1]).kind
            except (ShapeError, KeyError, TypeError):  # MPI.BYTE and the like: refused or taken where they are
                continue
        else:
            continue
        if kind in allowed or kind not in _KIND_NAMES:
            return
        mpi = mpi_module()
        if mpi is None:
            return
        raise mpi_error(mpi, mpi.ERR_OP, f"{call}: MPI.{red.name.upper()} is not defined on {_KIND_NAMES[kind]} "
                                         "data: MPI defines it on "
                                         f"{' and '.join(sorted({_KIND_NAMES[k] for k in allowed}))} data, as "
                                         "MPICH checks (Invalid MPI_Op)")


def _aliased(call: str, sent: np.ndarray, into: np.ndarray, where: str = "the receive buffer",
             instead: str = "the send buffer") -> None:
    """MPI.Exception with MPI.ERR_BUFFER, as MPICH raises it ("Invalid buffer pointer ... Buffers must not be
    aliased"), where the data a rank sends (`sent`) and the memory its message is received into (`into`: the
    receive buffer, or the rank's own block of it in a gather, the root's block of the send buffer in a scatter)
    overlap. MPICH compares their addresses, and of buffers that overlap from another address aborts on some
    (Allreduce, Scan: an assertion; "memcpy argument memory ranges overlap") and runs others (Alltoall: an answer
    that changes from run to run; Exscan, Reduce_scatter(_block): as if the data sent were copied first): the MPI
    standard forbids them all (an OUT argument may not be aliased with another), and here each rank's data is
    read while others write, so every overlap is refused, the message saying so. Empty messages pass, as MPICH's
    (count 0). The one check of every collective MPICH checks: Sendrecv, Alltoallv(w) and the neighbour
    collectives take aliased buffers."""
    if sent.size and into.size and np.may_share_memory(sent, into):  # flat, one block each: the bounds are exact
        if sent.__array_interface__["data"][0] == into.__array_interface__["data"][0]:  # what MPICH refuses
            how = "share memory (the MPI standard forbids it)"
        else:
            how = ("overlap (the MPI standard forbids it; MPICH refuses only buffers that start at one address, "
                   "and runs this overlap with its copying order's answer, or aborts)")
        detail = f"{call}: buffers must not be aliased: the data sent and {where} {how}; pass MPI.IN_PLACE as {instead}"
        mpi = mpi_module()
        raise BufferSpecError(detail) if mpi is None else mpi_error(mpi, mpi.ERR_BUFFER, detail)


def _matching(op: str, sendbuf: Any, dst: np.ndarray, n: int) -> np.ndarray:
    """The send data of a reduction whose receive buffer is `dst` (n items), checked (thread_engine.matching)
    and not aliased with it."""
    src, ns, _ = message(sendbuf, f"{op} sendbuf")
    src = bodies.matching(op, src if src.size == ns else src[:ns], dst if dst.size == n else dst[:n])
    _aliased(op, src, dst[:n])
    return src


def _blocks_fit(op: str, sent: np.ndarray, recv: np.ndarray) -> None:
    if sent.nbytes != recv.nbytes:
        raise ShapeError(f"{op}: a block of {sent.size} x {sent.dtype.name} is sent where "
                         f"{recv.size} x {recv.dtype.name} are received")


def _bcast_count(group: Any, root: int, me: int, sent: np.ndarray, data: np.ndarray) -> BaseException:
    """MPICH's error on a Bcast receiver whose count is not the root's: MPI_ERR_TRUNCATE where the root
    sends more (MPI.Exception "Message truncated"), MPI_ERR_OTHER where it sends fewer."""
    kind = dtype_name(data.dtype)
    detail = (f"Bcast: {rank_name(group, root)} (the root) broadcasts {sent.size} {kind} ({sent.nbytes} bytes) "
              f"but {rank_name(group, me)} " + ("receives into a buffer of" if sent.size > data.size else "expects")
              + f" {data.size} ({data.nbytes} bytes)")
    mpi = mpi_module()
    if mpi is None:
        return ShapeError(detail)
    return mpi_error(mpi, mpi.ERR_TRUNCATE if sent.size > data.size else mpi.ERR_OTHER, detail)


#: The nonblocking collective request the calling thread posts now (`BufferCollectives._posted`), if any: its
#: method's rendezvous deposits the call without waiting, and what the method does after it waits for completion.
_POSTING = threading.local()
#: Held while a member of a nonblocking collective runs its phases (one at a time: they share the slot).
_PHASES = threading.Lock()


def posting() -> Any:
    """The request of the nonblocking collective the calling thread is posting now and has not deposited yet
    (SimComm._enter_all), else None."""
    req = getattr(_POSTING, "req", None)
    return req if req is not None and req.deposited is None else None


def _kept(data: Any) -> Any:
    """A copy of a member's posted data (its arrays; lists and tuples of them): what the other members read, each
    as it completes (this one may have completed and written its buffers again by then). Read when posted, as
    MPI may (the program must not write a buffer of a pending collective), and so no other thread ever touches
    this member's buffers, nor holds a view of them (a DLPack producer's reference count, a bytearray's export,
    stay this rank's own)."""
    if isinstance(data, np.ndarray):
        return data.copy()
    if type(data) in (tuple, list):
        return type(data)(_kept(d) for d in data)
    return data


class CollectiveRequest(Request):
    """The request of a nonblocking collective (Iallreduce, Ibarrier, ..., a started Allreduce_init): posting
    deposits the member's call (engine.Group.post) and returns at once, as MPI's posting does; the request is
    done once every member posted it, and its completion (Wait, a Test that returns true, ...: sim.landing.land
    runs `held`) runs this member's phases of the collective (its reads of the others' data, its writes of its
    own receive buffer) and what its call does after them (a derived datatype's unpacking), in its own thread:
    the result lands then, in any buffer. The others read a copy of its data, taken when posted (`_kept`)."""

    __slots__ = ("slot", "deposited", "after", "number", "writes")

    def __init__(self, group: Any, me: int, kind: str) -> None:
        super().__init__(group, me, kind)
        self.slot: Any = None  # the rendezvous, once deposited
        self.deposited: Any = None  # this member's call in it (engine.Call; not `call`, which names a poll)
        self.after: list = []  # what the method does after its rendezvous, run at completion
        self.number = 0  # its call number on its communicator (a report names it)
        self.writes = False  # whether its completion writes into a buffer of the program (a warning says so)
        self.held = self._complete

    def _block(self) -> None:
        """Wait (as this rank) until every member posted the collective; the members waiting for one
        collective are one clause of a deadlock report (`_InCollective`)."""
        if self.done:
            return
        group = self.group
        world, rank = group.world, group.members[self.me]
        with world.lock:
            world.check(rank)
            if not self.done:
                world.wait(rank, _InCollective(self))

    def _complete(self) -> None:
        slot, call, after = self.slot, self.deposited, self.after
        self.slot, self.after = None, []
        if slot is None:
            return
        phases, call.finish = call.finish or (), None  # they hold this rank's buffers: dropped in its thread
        if slot.error is not None:
            raise RuntimeMismatchError(slot.error)
        with _PHASES:
            for phase in phases:
                phase(slot)
        for step in after:
            step()

    def free(self) -> None:
        """MPI forbids freeing a collective's request; MPICH lets the operation go on: a request done already
        completes now, one not done yet when the last member posts the collective (`landed_freed`)."""
        world = self.group.world
        with world.lock:  # against the last member's post (`landed_freed`): one of the two lands it
            done, self.null = self.done, True
        super().free()
        if done:
            _land(self)

    def why_stuck(self, world: Any) -> tuple[str, str]:
        """Where the members that have not posted the collective are (world lock held)."""
        slot = self.slot
        if slot is None or self.done:
            return "", ""
        missing = [m for i, m in enumerate(self.group.members) if slot.calls[i] is None]
        more = "".join(f"; {whereabouts(world, m)}" for m in missing[:8])
        return more + (f"; and {len(missing) - 8} more" if len(missing) > 8 else ""), ""

    def never_completes(self, world: Any) -> bool:
        """Whether a member that has not posted the collective finished (world lock held)."""
        slot = self.slot
        return (slot is not None and not self.done
                and any(slot.calls[i] is None and m in world.finished for i, m in enumerate(self.group.members)))


def landed_freed(slot: Any) -> None:
    """Every member posted the collective of `slot` (the last member to post calls this): the requests the
    program freed before then complete now, in this thread, as MPICH's progress completes them."""
    if slot.error is None:
        for call in slot.calls:
            req = call.request
            if req.null and req.held is not None:
                _land(req)


class _InCollective(_Waiting):
    """A Wait for a nonblocking collective's request, for a report: 'Ibarrier on the world (call 2)', one key
    for every member waiting for it (released as a wait for the request: World.release)."""

    __slots__ = ()

    def __init__(self, req: CollectiveRequest) -> None:
        super().__init__(req.kind, req.group, req.number, token=req)

    def key(self) -> tuple:
        return (self._op, id(self.group), self.seq, "posted")


def _land(req: Request) -> None:
    land(req)


class BufferCollectives:
    """Buffer collectives on `self._group` (a mixin of SimComm)."""

    def _via_bytes(self, run: Callable, sendbuf: Any, recvbuf: Any, v: bool, send_blocks: bool = False,
                   counts: Any = None) -> None:
        """``run(sendbuf, recvbuf)``, a gather (or, `send_blocks`, an all-to-all) whose messages may be of
        derived datatypes: the send buffer packed (each of its blocks), the receive buffer's blocks as bytes,
        unpacked into it after (spmdsim.emulator.derived.blocks). `counts`: (send blocks, receive blocks),
        default the group's size each (a topology's: its out- and in-degree)."""
        sends, receives = (self._group.size,) * 2 if counts is None else counts
        if may_be_derived(sendbuf) and not in_place(sendbuf):
            if send_blocks:
                found = blocks(sendbuf, sends, v, writable=False)
                sendbuf = sendbuf if found is None else found[0]
            else:
                sendbuf = packed(sendbuf)
        found = blocks(recvbuf, receives, v, writable=True) if may_be_derived(recvbuf) else None
        if found is None:
            run(sendbuf, recvbuf)
            return
        if in_place(sendbuf):  # this rank's data is in the receive buffer: its blocks packed where they go
            np.copyto(found[0][0], blocks(recvbuf, receives, v, writable=False)[0][0])
        run(sendbuf, found[0])
        self._then(found[1])

    def Allreduce(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> None:
        red = reduction(op)
        _predefined_op_types("Allreduce", red, sendbuf, recvbuf)
        red, sendbuf, recvbuf, finish = laid_out("Allreduce", red, sendbuf, recvbuf)
        dst, n, dt = message(recvbuf, "Allreduce recvbuf", readonly=False)
        if dst.size != n:
            dst = dst[:n]
        src = dst if in_place(sendbuf) else _matching("Allreduce", sendbuf, dst, n)
        bodies.all_reduce(self, src, dst, red, dt, allreduce_tree)  # MPICH's association, for floats
        if finish is not None:
            self._then(finish)

    def Reduce(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM, root: int = 0) -> None:
        red = reduction(op)
        me, root = self._me, self._root(root, "Reduce")
        _predefined_op_types("Reduce", red, sendbuf, recvbuf if me == root else None)
        red, sendbuf, recvbuf, finish = laid_out("Reduce", red, sendbuf, recvbuf if me == root else None)
        dst = dt = None
        if me == root:
            dst, n, dt = message(recvbuf, "Reduce recvbuf", readonly=False)
            src = dst[:n] if in_place(sendbuf) else _matching("Reduce", sendbuf, dst, n)
        else:
            src, n, dt = message(sendbuf, "Reduce sendbuf")
            src = src[:n]
        out = np.empty(n, src.dtype) if me == root else None

        def fold_all(slot: Any) -> None:  # the root's: read every member's before it writes (in place)
            fold(red, [c.data for c in slot.calls], out, dt, reduce_tree(self._group.size, root))

        def write(slot: Any) -> None:
            dst[:n] = out

        phases = (fold_all, write) if me == root else (_nothing, _nothing)
        self._enter_all("reduce", ("reduce", dtype_name(src.dtype), n, red.name, f"root {root}"), src, phases)
        if finish is not None:
            self._then(finish)

    def _scan(self, call: str, sendbuf: Any, recvbuf: Any, op: Any, exclusive: bool) -> None:
        red = reduction(op)
        _predefined_op_types(call, red, sendbuf, recvbuf)
        red, sendbuf, recvbuf, finish = laid_out(call, red, sendbuf, recvbuf)
        dst, n, dt = message(recvbuf, f"{call} recvbuf", readonly=False)
        src = dst[:n] if in_place(sendbuf) else _matching(call, sendbuf, dst, n)
        me = self._me
        upto = me if exclusive else me + 1
        out = np.empty(n, src.dtype) if upto else None

        def fold_mine(slot: Any) -> None:  # read before any member writes (in place)
            fold(red, [c.data for c in slot.calls[:upto]], out, dt)

        def write(slot: Any) -> None:
            dst[:n] = out

        # Exscan leaves rank 0's receive buffer as it was (MPI: undefined)
        phases = (fold_mine, write) if upto else (_nothing, _nothing)
        self._enter_all(call.lower(), (call.lower(), dtype_name(src.dtype), n, red.name), src, phases)
        if finish is not None:
            self._then(finish)

    def Scan(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> None:
        self._scan("Scan", sendbuf, recvbuf, op, False)

    def Exscan(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> None:
        self._scan("Exscan", sendbuf, recvbuf, op, True)

    def Reduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> None:
        red = reduction(op)
        _predefined_op_types("Reduce_scatter_block", red, sendbuf, recvbuf)
        g = self._group.size
        red, sendbuf, recvbuf, finish = laid_out("Reduce_scatter_block", red, sendbuf, recvbuf, g)
        if in_place(sendbuf):
            src, b, dt = message(recvbuf, "Reduce_scatter_block recvbuf", blocks=g, readonly=False)
            dst = src
        else:
            dst, b, dt = message(recvbuf, "Reduce_scatter_block recvbuf", readonly=False)
            src, bs, _ = message(sendbuf, "Reduce_scatter_block sendbuf", blocks=g)
            _same("Reduce_scatter_block", src, dst)
            if bs != b:
                raise ShapeError(f"Reduce_scatter_block: send buffer of {g} x {bs} items for receive "
                                 f"blocks of {b}")
            _aliased("Reduce_scatter_block", src[:g * b], dst[:b])
        bodies.reduce_scatter(self, src, dst, b, red, dt)
        if finish is not None:
            self._then(finish)

    def Reduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = _SUM) -> None:
        red = reduction(op)
        _predefined_op_types("Reduce_scatter", red, sendbuf, recvbuf)
        g, me = self._group.size, self._me
        red, sendbuf, recvbuf, finish = laid_out("Reduce_scatter", red, sendbuf, recvbuf, counted=False)
        if finish is not None and recvcounts is not None:  # items of the datatype: their packed bytes travel
            recvcounts = [int(c) * red.op.datatype.size for c in recvcounts]
        dst, rc, dt = message(recvbuf, "Reduce_scatter recvbuf", readonly=False)
        inplace = in_place(sendbuf)
        if recvcounts is None:
            if inplace:
                raise ShapeError("Reduce_scatter with MPI.IN_PLACE needs recvcounts")
            counts = [int(c) for c in self.allgather(rc)]
        else:
            counts = [int(c) for c in recvcounts]
            if len(counts) != g:
                raise ValueError(f"Reduce_scatter: {len(counts)} recvcounts for {g} ranks")
        total = sum(counts)
        if inplace:
            if rc < total:  # as mpi4py checks it
                raise ShapeError(f"Reduce_scatter: mismatch in receive count {rc} and sum(counts) {total}")
            src = dst[:total]
        else:
            src, ns, _ = message(sendbuf, "Reduce_scatter sendbuf")
            _same("Reduce_scatter", src, dst)
            if ns != total or rc != counts[me]:
                raise ValueError(f"Reduce_scatter: send count {ns} and receive count {rc} do not match "
                                 f"recvcounts {counts}")
            src = src[:total]
            _aliased("Reduce_scatter", src, dst[:counts[me]])
        signature = ("reduce_scatter_v", dtype_name(src.dtype), tuple(counts), red.name)
        lo, b = sum(counts[:me]), counts[me]
        out = np.empty(b, src.dtype)

        def fold_mine(slot: Any) -> None:  # read before any member writes (in place)
            fold(red, [c.data[lo:lo + b] for c in slot.calls], out, dt)

        def write(slot: Any) -> None:
            dst[:b] = out

        self._enter_all("reduce_scatter_v", signature, src, (fold_mine, write))
        if finish is not None:
            self._then(finish)

    def Allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        self._via_bytes(self._allgather, sendbuf, recvbuf, False)

    def _allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        g, me = self._group.size, self._me
        dst, n, _ = message(recvbuf, "Allgather recvbuf", blocks=g, readonly=False)
        inplace = in_place(sendbuf)
        if inplace:
            src = dst[me * n:(me + 1) * n]
        else:
            src, ns, _ = message(sendbuf, "Allgather sendbuf")
            src = src[:ns]
            if src.nbytes != n * dst.itemsize:
                if dst.nbytes < src.nbytes * g:
                    raise ShapeError(f"Allgather: receive buffer of {dst.size} items is smaller than "
                                     f"{g} x {src.size}")
                _blocks_fit("Allgather", src, dst[:n])
            _aliased("Allgather", src, dst[me * n:(me + 1) * n], "this rank's block of the receive buffer")
        bodies.all_gather(self, src, dst, n, inplace)

    def Allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        self._via_bytes(self._allgatherv, sendbuf, recvbuf, True)

    def _allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        g, me = self._group.size, self._me
        dst, counts, displs, _ = vector(recvbuf, "Allgatherv recvbuf", g, readonly=False)
        inplace = in_place(sendbuf)
        if inplace:
            src = dst[displs[me]:displs[me] + counts[me]]
        else:
            src, ns, _ = message(sendbuf, "Allgatherv sendbuf")
            src = src[:ns]
            _aliased("Allgatherv", src, dst[displs[me]:displs[me] + counts[me]], "this rank's block of the receive "
                                                                                 "buffer")

        def gather_mine(slot: Any) -> None:  # writes only this member's blocks no other member reads
            for j, call in enumerate(slot.calls):
                if j != me or not inplace:
                    part = dst[displs[j]:displs[j] + counts[j]]
                    _blocks_fit("Allgatherv", call.data, part)
                    copy_into(part, call.data)

        self._enter_all("allgatherv", ("allgatherv",), src, (gather_mine,))

    def Gather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        self._gather("Gather", sendbuf, recvbuf, root, False)

    def Gatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        self._gather("Gatherv", sendbuf, recvbuf, root, True)

    def _gather(self, call: str, sendbuf: Any, recvbuf: Any, root: int, v: bool) -> None:
        root = self._root(root, call)
        # Only the root's receive buffer is read (another rank's, even a derived one, is left alone).
        self._via_bytes(lambda s, r: self._gathered(call, s, r, root, v), sendbuf,
                        recvbuf if self._me == root else None, v)

    def _gathered(self, call: str, sendbuf: Any, recvbuf: Any, root: int, v: bool) -> None:
        g, me = self._group.size, self._me
        skip = me == root and in_place(sendbuf)  # the root's block is in place already
        src = None
        if not skip:
            src, ns, _ = message(sendbuf, f"{call} sendbuf")
            src = src[:ns]
        dst = counts = displs = None
        if me == root:
            if v:
                dst, counts, displs, _ = vector(recvbuf, f"{call} recvbuf", g, readonly=False)
            else:
                dst, n, _ = message(recvbuf, f"{call} recvbuf", blocks=g, readonly=False)
                counts, displs = [n] * g, [n * j for j in range(g)]
            if src is not None:
                _aliased(call, src, dst[displs[me]:displs[me] + counts[me]], "the root's block of the receive buffer",
                         "the root's send buffer")
        bodies.gather_to(self, src, root, dst, counts, displs, call)

    def Scatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        g, me, root = self._group.size, self._me, self._root(root, "Scatter")
        data = None
        if me == root:
            found = blocks(sendbuf, g, False, writable=False) if may_be_derived(sendbuf) else None
            sendbuf = sendbuf if found is None else found[0]
            src, n, _ = message(sendbuf, "Scatter sendbuf", blocks=g)
            data = [src[j * n:(j + 1) * n] for j in range(g)]
        self._scattered("Scatter", data, recvbuf, root)

    def Scatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> None:
        g, me, root = self._group.size, self._me, self._root(root, "Scatterv")
        data = None
        if me == root:
            found = blocks(sendbuf, g, True, writable=False) if may_be_derived(sendbuf) else None
            sendbuf = sendbuf if found is None else found[0]
            src, counts, displs, _ = vector(sendbuf, "Scatterv sendbuf", g)
            data = [src[d:d + c] for c, d in zip(counts, displs)]
        self._scattered("Scatterv", data, recvbuf, root)

    def _scattered(self, call: str, data: Any, recvbuf: Any, root: int) -> None:
        """The rest of Scatter(v): the root deposits its blocks (`data`), each member copies its own."""
        me, op = self._me, call.lower()
        if me == root and in_place(recvbuf):
            self._enter_all(op, (op, f"root {root}"), data, (_nothing,))
            return
        recvbuf, unpack = unpacking(recvbuf) if may_be_derived(recvbuf) else (recvbuf, None)
        dst, n, _ = message(recvbuf, f"{call} recvbuf", readonly=False)
        if me == root:
            _aliased(call, data[root], dst[:n], instead="the root's receive buffer")

        def copy_mine(slot: Any) -> None:
            block = slot.calls[root].data[me]
            _blocks_fit(call, block, dst[:n])
            copy_into(dst[:n], block)

        self._enter_all(op, (op, f"root {root}"), data, (copy_mine,))
        if unpack is not None:
            self._then(unpack, n * dst.itemsize)

    def Alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        self._via_bytes(self._alltoall, sendbuf, recvbuf, False, send_blocks=True)

    def _alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        g = self._group.size
        dst, n, _ = message(recvbuf, "Alltoall recvbuf", blocks=g, readonly=False)
        if in_place(sendbuf):
            src, b = dst[:n * g].copy(), n  # every member reads it while this one writes dst
        else:
            src, b, _ = message(sendbuf, "Alltoall sendbuf", blocks=g)
            if b * src.itemsize != n * dst.itemsize:
                raise ShapeError(f"Alltoall: blocks of {b} x {src.dtype.name} are sent where "
                                 f"blocks of {n} x {dst.dtype.name} are received")
            _aliased("Alltoall", src[:b * g], dst[:n * g])
        bodies.all_to_all(self, src, b, dst, n)

    def Alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:
        self._via_bytes(self._alltoallv, sendbuf, recvbuf, True, send_blocks=True)

    def _alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:
        g = self._group.size
        dst, rcounts, rdispls, _ = vector(recvbuf, "Alltoallv recvbuf", g, readonly=False)
        if in_place(sendbuf):
            src = dst.copy()  # every member reads it while this one writes dst
            scounts, sdispls = rcounts, rdispls
        else:
            src, scounts, sdispls, _ = vector(sendbuf, "Alltoallv sendbuf", g)
        bodies.all_to_allv(self, src, scounts, sdispls, dst, rcounts, rdispls)

    def Alltoallw(self, sendbuf: Any, recvbuf: Any) -> None:
        """Alltoallv with a datatype per block and displacements in bytes (sim._buffers.wvector): the blocks'
        bytes move, as MPI moves a type signature's; the receive message is read first, as mpi4py reads it."""
        g = self._group.size
        dst, rsizes, rdispls, unpack = wmessage(recvbuf, "Alltoallw recvbuf", g, writable=True)
        if in_place(sendbuf):  # every member reads it while this one writes (a derived one's: packed first)
            src, ssizes, sdispls = (dst.copy(), rsizes, rdispls) if unpack is None else \
                wmessage(recvbuf, "Alltoallw recvbuf", g, writable=False)[:3]
        else:
            src, ssizes, sdispls = wmessage(sendbuf, "Alltoallw sendbuf", g, writable=False)[:3]
        bodies.all_to_allv(self, src, ssizes, sdispls, dst, rsizes, rdispls, "Alltoallw", "bytes")
        if unpack is not None:
            self._then(unpack)

    def Bcast(self, buf: Any, root: int = 0) -> None:
        root = self._root(root, "Bcast")
        unpack = None
        if may_be_derived(buf):  # a derived datatype: its packed bytes (spmdsim.emulator.derived)
            buf, unpack = (packed(buf), None) if self._me == root else unpacking(buf)
        data, n, _ = message(buf, "Bcast buffer", readonly=self._me == root)
        bodies.broadcast(self, data[:n], root, _bcast_count)
        if unpack is not None:
            self._then(unpack, n * data.itemsize)

    # -- nonblocking: posted without waiting, run at completion (see the module docstring) -------

    def _posted(self, method: Callable, *args: Any) -> Any:
        """The nonblocking form of `method` (Allreduce: Iallreduce): its checks now, its call deposited at its
        rendezvous without waiting (SimComm._enter_all), the rest at completion (CollectiveRequest), its request
        noted until the program completes it (a warning names one it never completes: requests.noted)."""
        name = method.__name__
        req = CollectiveRequest(self._group, self._me, f"I{name[:1].lower()}{name[1:]}")
        _POSTING.req = req
        try:
            method(*args)
        finally:
            _POSTING.req = None
        if req.deposited is None:  # no rendezvous: nothing to wait for
            req.done = True
        else:
            req.writes = bool(req.after) or any(phase is not _nothing for phase in req.deposited.finish)
        return noted(req, req.kind, self._group, self._me)

    def _then(self, step: Callable, *args: Any) -> None:
        """What a collective does after its rendezvous (a derived datatype's unpacking): now, or, for a
        nonblocking one being posted, at its completion."""
        req = getattr(_POSTING, "req", None)
        if req is None or req.deposited is None:  # (before the rendezvous: a collective the post makes first)
            step(*args)
        else:
            req.after.append(lambda: step(*args))

    def Ialltoallw(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Alltoallw, sendbuf, recvbuf)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> Any:
        return self._posted(self.Allreduce, sendbuf, recvbuf, op)

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM, root: int = 0) -> Any:
        return self._posted(self.Reduce, sendbuf, recvbuf, op, root)

    def Iscan(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> Any:
        return self._posted(self.Scan, sendbuf, recvbuf, op)

    def Iexscan(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> Any:
        return self._posted(self.Exscan, sendbuf, recvbuf, op)

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> Any:
        return self._posted(self.Reduce_scatter_block, sendbuf, recvbuf, op)

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = _SUM) -> Any:
        return self._posted(self.Reduce_scatter, sendbuf, recvbuf, recvcounts, op)

    def Iallgather(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Allgather, sendbuf, recvbuf)

    def Iallgatherv(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Allgatherv, sendbuf, recvbuf)

    def Igather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Any:
        return self._posted(self.Gather, sendbuf, recvbuf, root)

    def Igatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Any:
        return self._posted(self.Gatherv, sendbuf, recvbuf, root)

    def Iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Any:
        return self._posted(self.Scatter, sendbuf, recvbuf, root)

    def Iscatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Any:
        return self._posted(self.Scatterv, sendbuf, recvbuf, root)

    def Ialltoall(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Alltoall, sendbuf, recvbuf)

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Alltoallv, sendbuf, recvbuf)

    def Ibcast(self, buf: Any, root: int = 0) -> Any:
        return self._posted(self.Bcast, buf, root)

    def Ibarrier(self) -> Any:
        return self._posted(self.Barrier)
