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
Nonblocking forms (Iallreduce, Ibarrier, ...) are in spmdsim.emulator.nonblocking.
"""
from __future__ import annotations

from typing import Any, Callable

from ..errors import ShapeError
from ..runtime.sim import thread_engine as bodies
from .._lazy import numpy_on_first_use
from .collective_checks import _aliased, _bcast_count, _blocks_fit, _matching, _predefined_op_types, plain_reduction
from .derived import blocks, laid_out, may_be_derived, packed, unpacking, wmessage
from ..base.validate import dtype_name
from ..runtime.sim._datatypes import copy_into
from ..runtime.sim._mpi import in_place
from ..runtime.sim._reductions import fold, reduction
from .nonblocking import _POSTING, _SUM, NonblockingCollectives
from .typemap import message, vector  # the shared readers, refusing what mpi4py cannot map first
from ..runtime.sim.orders import allreduce_tree, reduce_order, scan_trees
from ..runtime.sim.bodies import _nothing, mpich_parts
from ..runtime.sim.thread_engine import bad_root

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["BufferCollectives", "bad_root"]


_same = bodies.checked_same


class BufferCollectives(NonblockingCollectives):
    """Buffer collectives on `self._group` (a mixin of SimComm; their nonblocking forms: NonblockingCollectives)."""

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
        plain = plain_reduction("Allreduce", red, sendbuf, recvbuf)
        if plain is not None:
            bodies.all_reduce(self, plain[0], plain[1], red, None, allreduce_tree)
            return
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
        plain = plain_reduction("Reduce", red, sendbuf, recvbuf, me == root)
        if plain is not None:
            (src, dst), dt, finish = plain, None, None
        else:
            src, dst, dt, finish, red = self._reduce_checked(red, sendbuf, recvbuf, me == root)
        n = src.size
        out = np.empty(n, src.dtype) if me == root else None

        def fold_all(slot: Any) -> None:  # the root's: read every member's before it writes (in place)
            fold(red, [c.data for c in slot.calls], out, dt, reduce_order(self._group.size, root, n, n * src.itemsize))

        def write(slot: Any) -> None:
            dst[:n] = out

        phases = (fold_all, write) if me == root else (_nothing, _nothing)
        self._enter_all("reduce", ("reduce", dtype_name(src.dtype), n, red.name, f"root {root}"), src, phases)
        if finish is not None:
            self._then(finish)

    def _reduce_checked(self, red: Any, sendbuf: Any, recvbuf: Any, root: bool) -> tuple:
        """(send data, receive buffer or None, MPI datatype or None, finish, reduction) of a Reduce that is not
        two plain arrays: every check, derived datatypes laid out."""
        _predefined_op_types("Reduce", red, sendbuf, recvbuf if root else None)
        red, sendbuf, recvbuf, finish = laid_out("Reduce", red, sendbuf, recvbuf if root else None)
        if root:
            dst, n, dt = message(recvbuf, "Reduce recvbuf", readonly=False)
            return dst[:n] if in_place(sendbuf) else _matching("Reduce", sendbuf, dst, n), dst, dt, finish, red
        src, n, dt = message(sendbuf, "Reduce sendbuf")
        return src[:n], None, dt, finish, red

    def _scan(self, call: str, sendbuf: Any, recvbuf: Any, op: Any, exclusive: bool) -> None:
        red = reduction(op)
        plain = plain_reduction(call, red, sendbuf, recvbuf)
        if plain is not None:
            (src, dst), dt, finish = plain, None, None
        else:
            _predefined_op_types(call, red, sendbuf, recvbuf)
            red, sendbuf, recvbuf, finish = laid_out(call, red, sendbuf, recvbuf)
            dst, count, dt = message(recvbuf, f"{call} recvbuf", readonly=False)
            src = dst[:count] if in_place(sendbuf) else _matching(call, sendbuf, dst, count)
        n = src.size
        me = self._me
        upto = me if exclusive else me + 1
        out = np.empty(n, src.dtype) if upto else None

        def fold_mine(slot: Any) -> None:  # read before any member writes (in place); floats as MPICH associates
            fold(red, [c.data for c in slot.calls[:upto]], out, dt, scan_trees(len(slot.calls), exclusive)[me])

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
        g = self._group.size
        plain = plain_reduction("Reduce_scatter_block", red, sendbuf, recvbuf, blocks=g)
        if plain is not None:
            bodies.reduce_scatter(self, plain[0], plain[1], plain[1].size, red, None,
                                  self._scatter_bytes(plain[1].size * plain[1].itemsize))
            return
        _predefined_op_types("Reduce_scatter_block", red, sendbuf, recvbuf)
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
        bodies.reduce_scatter(self, src, dst, b, red, dt, self._scatter_bytes(b * src.itemsize))
        if finish is not None:
            self._then(finish)

    def _scatter_bytes(self, block: int) -> int:
        """The bytes by which MPICH picks the algorithm of a Reduce_scatter_block of `block` bytes a member (0, the
        shortest, for Ireduce_scatter_block: MPICH halves recursively at any size)."""
        return 0 if _POSTING.req is not None else block * self._group.size

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

        def fold_mine(slot: Any) -> None:  # read before any member writes (in place); floats as MPICH associates
            parts, tree = mpich_parts([c.data[lo:lo + b] for c in slot.calls], me, red, out, total * src.itemsize)
            fold(red, parts, out, dt, tree)

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
