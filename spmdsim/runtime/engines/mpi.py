"""MPI's engine: every transfer as mpi4py's call on an MPI communicator.

The one module of spmdsim's own path that calls a communicator's transfer
methods (``Allreduce``, ``Isend``, ``allgather`` ...); the runtime reaches it
through spmdsim.runtime.door. A `wait` (engines/base.py) turns a call into
its nonblocking twin, whose request the wait completes: the polite wait of
oversubscribed ranks, or the watchdog's. mpi4py is imported when the first
transfer needs one of its constants, not when spmdsim is imported.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from ...base.context import PROCESS
from .base import Engine, Wait
from ..._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["MpiEngine", "MPI"]

_OPS: dict = {}  # "sum"/"max"/"min" -> MPI.SUM/MAX/MIN, filled on first use
_CONST: list = []  # [MPI.IN_PLACE], on first use
_SPECIAL = frozenset("VSU")  # dtype kinds `_w` converts: bfloat16's ("V") and text's


def _op(op: str) -> Any:
    found = _OPS.get(op)
    if found is None:
        from mpi4py import MPI

        _OPS.update(sum=MPI.SUM, max=MPI.MAX, min=MPI.MIN)
        found = _OPS[op]
    return found


def _w(a: Any) -> Any:
    """`a` as MPI can move it: a bfloat16 block (ml_dtypes', which MPI has no datatype for) as a view of
    its 16-bit words, the same memory; a text block (numpy's ``S``/``U``: mpi4py maps no datatype to their
    buffer formats, ``'2w'``) with `_text`'s datatype of its item's bytes; other blocks as they are. Sums
    never see either: the collectives widen bfloat16 to float32 first (spmdsim.runtime.collectives) and
    refuse text (spmdsim.runtime.door) on every engine."""
    kind = getattr(getattr(a, "dtype", None), "kind", None)
    if kind == "S" or kind == "U":
        return [a, _text(a.dtype.itemsize)]
    if kind != "V":  # not bfloat16 (is_low's first test): spmdsim.base.precision loads
        return a  # dataclasses, which spmdsim mpirun's start does without
    from ...base.precision import is_low

    return a.view(np.uint16) if is_low(a.dtype) else a


def _v(a: Any, counts: Any, displs: Any) -> list:
    """Alltoallv's message spec of `a` with its counts and displacements (in items), as `_w` moves `a`."""
    moved = _w(a)
    return [moved, (counts, displs)] if type(moved) is not list else [a, (counts, displs), moved[1]]


_TEXT: dict = {}  # item size in bytes -> its committed MPI datatype, made on first use and kept


def _text(itemsize: int) -> Any:
    """MPI's datatype of one text item of `itemsize` bytes: contiguous bytes, so that counts (Alltoallv's)
    stay counts of items, as numpy's arrays count them."""
    found = _TEXT.get(itemsize)
    if found is None:
        from mpi4py import MPI

        found = _TEXT[itemsize] = MPI.BYTE.Create_contiguous(itemsize).Commit()
    return found


def _in_place() -> Any:
    if not _CONST:
        from mpi4py import MPI

        _CONST.append(MPI.IN_PLACE)
    return _CONST[0]


class _Bound:
    """A group's persistent requests (`MpiEngine.bind`) in a plain list (mpi4py's Startall and Waitall take a
    list subclass about 0.4 us a group more slowly), each freed when this holder is dropped: a captured step's
    graph holds it (spmdsim.runtime.replay) while its replays start the requests."""

    __slots__ = ("requests",)
    #: MPI.Is_finalized, kept by the first bind: a holder dropped while the interpreter shuts down (a graph kept
    #: to the end) frees its requests without importing anything, before MPI finalizes or not at all after it.
    finalized: Any = None

    def __init__(self, requests: list) -> None:
        self.requests = requests

    def __del__(self) -> None:
        try:
            if type(self).finalized():
                return
            for request in self.requests:
                if request:
                    request.Free()
        except Exception:  # noqa: BLE001 - the interpreter is shutting down: MPI is gone with it
            return


class MpiEngine(Engine):
    """Ranks are MPI processes; a group is an mpi4py sub-communicator."""

    name = "mpi"

    def group(self, mesh: Any, axes: tuple[str, ...]) -> tuple[Any, int, int]:
        """The group over `axes` with MPI_Comm_create_group: collective over its members only
        (`mesh.group_ranks`, in the order `split_color_key` gives Comm.Split). Split gathers every rank's
        color and key over the whole mesh before it agrees on a context over it; this agrees among the
        members alone. At 8 ranks on 2 cores, measured in a loop of group builds between uneven work
        (MPICH 5.0, load 15): a group of 8 cost 2x less CPU than Split, a group of 2 5x less, a group of 1
        nothing."""
        comm = mesh.comm
        whole = comm.Get_group()
        try:
            members = whole.Incl(mesh.group_ranks(axes))
        finally:
            whole.Free()
        try:
            sub = comm.Create_group(members)
        finally:
            members.Free()
        return sub, sub.Get_size(), sub.Get_rank()

    def split(self, comm: Any, color: int, key: int) -> Any:
        return comm.Split(color, key)

    def free(self, comm: Any) -> None:
        comm.Free()

    def all_reduce(self, comm: Any, send: np.ndarray, recv: np.ndarray, op: str, wait: Wait) -> None:
        source = _in_place() if send is recv else send
        if wait is None:
            comm.Allreduce(source, recv, _OPS.get(op) or _op(op))
        else:
            wait(comm.Iallreduce(source, recv, _OPS.get(op) or _op(op)))

    def all_gather(self, comm: Any, send: np.ndarray, recv: np.ndarray, wait: Wait) -> None:
        # `_w` only for the kinds it converts (`post`'s test): numbers pass as they are, with no call
        if send.dtype.kind in _SPECIAL or recv.dtype.kind in _SPECIAL:
            send, recv = _w(send), _w(recv)
        if wait is None:
            comm.Allgather(send, recv)
        else:
            wait(comm.Iallgather(send, recv))

    def reduce_scatter(self, comm: Any, send: np.ndarray, recv: np.ndarray, op: str, wait: Wait) -> None:
        if wait is None:
            comm.Reduce_scatter_block(send, recv, _OPS.get(op) or _op(op))
        else:
            wait(comm.Ireduce_scatter_block(send, recv, _OPS.get(op) or _op(op)))

    def all_to_all(self, comm: Any, send: np.ndarray, recv: np.ndarray, wait: Wait) -> None:
        if send.dtype.kind in _SPECIAL or recv.dtype.kind in _SPECIAL:  # as all_gather
            send, recv = _w(send), _w(recv)
        if wait is None:
            comm.Alltoall(send, recv)
        else:
            wait(comm.Ialltoall(send, recv))

    def all_to_allv(self, comm: Any, send: np.ndarray, scounts: Any, sdispls: Any, recv: np.ndarray,
                    rcounts: Any, rdispls: Any, wait: Wait) -> None:
        if wait is None:
            comm.Alltoallv(_v(send, scounts, sdispls), _v(recv, rcounts, rdispls))
        else:
            wait(comm.Ialltoallv(_v(send, scounts, sdispls), _v(recv, rcounts, rdispls)))

    def direct(self, transfer: Callable[..., None], comm: Any, wait: Wait, dtype: Any) -> Callable[..., None]:
        """The communicator's own method where that can stand for `transfer` (a numeric `dtype`, which
        `_w` leaves as it is): with a busy wait, mpi4py's blocking call itself (no Python frame of ours
        between a kept collective's checks and MPI); with a polite one, one frame around the nonblocking call.
        With 4 ranks to a core each runs this on cold caches in turn while its group waits: a frame
        left out is a few microseconds of each rank's, paid by the group (docs/explanation/performance.md)."""
        if getattr(dtype, "kind", "V") in _SPECIAL:
            return super().direct(transfer, comm, wait, dtype)
        gathers = transfer == self.all_gather
        if gathers or transfer == self.all_to_all:
            if wait is None:
                return comm.Allgather if gathers else comm.Alltoall
            post = comm.Iallgather if gathers else comm.Ialltoall

            def moved(send: Any, recv: Any) -> None:
                wait(post(send, recv))
            return moved
        reduce_scatter = transfer == self.reduce_scatter
        if reduce_scatter or transfer == self.all_reduce:
            call = comm.Reduce_scatter_block if reduce_scatter else comm.Allreduce
            post = comm.Ireduce_scatter_block if reduce_scatter else comm.Iallreduce
            _op("sum")  # MPI's operations looked up once: `_OPS` holds all three after
            in_place, ops = _in_place(), _OPS

            def summed(send: Any, recv: Any, op: str) -> None:
                source = in_place if send is recv and not reduce_scatter else send
                if wait is None:
                    call(source, recv, ops[op])
                else:
                    wait(post(source, recv, ops[op]))
            return summed
        if transfer == self.broadcast:
            if wait is None:
                return comm.Bcast
            post_cast = comm.Ibcast

            def cast(buf: Any, root: int) -> None:
                wait(post_cast(buf, root))
            return cast
        return super().direct(transfer, comm, wait, dtype)

    def broadcast(self, comm: Any, buf: np.ndarray, root: int, wait: Wait) -> None:
        if wait is None:
            comm.Bcast(_w(buf), root)
        else:
            wait(comm.Ibcast(_w(buf), root))

    def gather_to(self, comm: Any, send: np.ndarray, recv: np.ndarray | None, root: int, wait: Wait) -> None:
        if wait is None:
            comm.Gather(_w(send), _w(recv), root)
        else:
            wait(comm.Igather(_w(send), _w(recv), root))

    def barrier(self, comm: Any, wait: Wait) -> None:
        if wait is None:
            comm.Barrier()
        else:
            wait(comm.Ibarrier())

    def isend(self, comm: Any, buf: np.ndarray, dest: int, tag: int) -> Any:
        return comm.Isend(_w(buf), dest, tag)

    def irecv(self, comm: Any, buf: np.ndarray, source: int, tag: int) -> Any:
        return comm.Irecv(_w(buf), source, tag)

    def post(self, comm: Any, receives: list, sends: list) -> list:
        """The messages of a group in one call, a plain loop (no comprehension frames): a buffer passed as
        it is unless its dtype is of kind "V" (ml_dtypes' bfloat16, moved as `_w`'s 16-bit words) or
        text ("S", "U": moved with `_w`'s datatype of its items' bytes)."""
        requests: list = []
        put = requests.append
        for buf, source, tag in receives:
            put(comm.Irecv(buf if buf.dtype.kind not in _SPECIAL else _w(buf), source, tag))
        for buf, dest, tag in sends:
            put(comm.Isend(buf if buf.dtype.kind not in _SPECIAL else _w(buf), dest, tag))
        return requests

    def wait_all(self, requests: list, wait: Wait) -> None:
        if wait is None:
            if requests:  # Request.Waitall, a class method: reached from a request, no import on the way
                requests[0].Waitall(requests)
        else:
            for request in requests:
                wait(request)

    def bind(self, comm: Any, receives: list, sends: list) -> _Bound:
        """``Recv_init`` of each receive, then ``Send_init`` of each send: `start` posts them all by one
        ``Startall`` (no message spec parsed, no request made per message)."""
        if _Bound.finalized is None:
            from mpi4py import MPI

            _Bound.finalized = MPI.Is_finalized
        requests = [comm.Recv_init(_w(buf), source, tag) for buf, source, tag in receives]
        requests += [comm.Send_init(_w(buf), dest, tag) for buf, dest, tag in sends]
        return _Bound(requests)

    def start(self, bound: _Bound) -> list:
        requests = bound.requests
        if requests:  # Prequest.Startall, a class method: reached from a request, no import on the way
            requests[0].Startall(requests)
        return requests

    def persistent(self, transfer: Callable[..., None], comm: Any, args: tuple) -> Any:
        """MPI-4's persistent collectives (``Allreduce_init``, ...); None without them (MPI < 4.0)."""
        try:
            if transfer == self.all_reduce:
                send, recv, op = args
                return comm.Allreduce_init(_in_place() if send is recv else send, recv, _op(op))
            if transfer == self.all_gather:
                return comm.Allgather_init(*map(_w, args))
            if transfer == self.all_to_all:
                return comm.Alltoall_init(*map(_w, args))
        except NotImplementedError:
            return None
        return None

    def dup(self, comm: Any) -> Any:
        return comm.Dup()

    def ibarrier(self, comm: Any) -> Any:
        return comm.Ibarrier()

    def abort(self, comm: Any, code: int) -> None:
        comm.Abort(code)
        os._exit(code)  # MPICH's Abort can return before mpiexec ends the job: the rank stops here

    def node_size(self, comm: Any) -> int:
        """MPI's shared-memory split (all of `comm` where the MPI has none)."""
        from mpi4py import MPI

        try:
            node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        except Exception:  # noqa: BLE001 - an MPI without shared-memory splits: count every rank
            return comm.Get_size()
        try:
            return node.Get_size()
        finally:
            node.Free()

    def world_ranks(self, comm: Any) -> list[int]:
        from mpi4py import MPI

        group, world_group = comm.Get_group(), MPI.COMM_WORLD.Get_group()
        try:
            return list(group.Translate_ranks(list(range(comm.Get_size())), world_group))
        finally:
            group.Free()
            world_group.Free()

    def post_object(self, comm: Any, obj: Any, dest: int, tag: int) -> Any:
        return comm.isend(obj, dest, tag)

    def take_object(self, comm: Any, tag: int) -> Any:
        from mpi4py import MPI

        status = MPI.Status()
        message = comm.improbe(MPI.ANY_SOURCE, tag, status)  # matched: no other receive can take it
        return None if message is None else (status.Get_source(), message.recv())

    def all_gather_object(self, comm: Any, obj: Any) -> list:
        return comm.allgather(obj)

    def gather_object(self, comm: Any, obj: Any, root: int) -> list | None:
        return comm.gather(obj, root=root)

    def broadcast_object(self, comm: Any, obj: Any, root: int) -> Any:
        return comm.bcast(obj, root=root)

    def all_reduce_object(self, comm: Any, obj: Any, op: str) -> Any:
        return comm.allreduce(obj, op=_op(op))


#: MPI's engine (`MpiEngine()`), the engine of any communicator that names none.
MPI = MpiEngine()
PROCESS.engine = MPI
