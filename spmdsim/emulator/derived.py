"""Point-to-point messages of derived datatypes (``Create_vector``, ``Create_indexed``, ``Create_hvector``,
``Create_struct``, ...) on simulated ranks: the sender's values are packed with this process's MPI
(``Datatype.Pack`` on the real MPI.COMM_SELF, the typemap MPI itself reads) and travel as bytes; a receive
into a derived datatype (``Recv``, ``Irecv``, ``Sendrecv``, a persistent ``Recv_init``, a matched message's
``Mrecv``) unpacks them with ``Datatype.Unpack`` when they arrive, before the receive completes
(spmdsim.runtime.sim.p2p: ``Request.unpack``). The bytes of a message are the same whichever datatypes the two sides
name, as MPI's type matching requires, so a vector sent to an array of MPI.DOUBLE arrives as its doubles. ``Bcast``,
``Scatter(v)``, ``Gather(v)``, ``Allgather(v)``, ``Alltoall(v)`` and the neighbour collectives move them alike
(`blocks`: a message's blocks packed side by side where they are sent, unpacked where received); ``Alltoallw`` and
``Neighbor_alltoallw`` too, a datatype per block, from a buffer or from MPI.BOTTOM (struct types of absolute
addresses: `wblocks`); with MPI.IN_PLACE, a rank's own blocks are packed from its receive buffer first. The
reductions take a derived datatype with a user-defined op (MPI.Op.Create: `laid_out`, the data travelling
packed and the user's function called on it laid out as the type lays it, as MPICH calls it); a predefined op
on a derived datatype raises MPI.ERR_OP, as MPICH does (spmdsim.emulator.collective_checks).
"""
from __future__ import annotations

import threading
from itertools import accumulate
from typing import Any, Callable, Optional

from ..errors import DTypeError, ShapeError
from ..runtime.sim._buffers import _unpack, int_array, wparts, wvector
from ..runtime.sim._datatypes import array_of
from ..runtime.sim._mpi import in_place, mpi_error, mpi_module
from ..runtime.sim._reductions import Reduction
from .._lazy import numpy_on_first_use
from .real import real

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["committed", "packed", "unpacking", "may_be_derived", "blocks", "wblocks", "wmessage", "laid_out"]


def may_be_derived(spec: Any) -> bool:
    """Whether `spec` may name a derived datatype: a list or tuple not ending in a predefined datatype
    (``[buf, count, MPI.BYTE]``, each of osu_bw's messages, is plain: asked first, on every message)."""
    return type(spec) in (list, tuple) and not (spec and getattr(spec[-1], "is_predefined", False) is True)


def _derived(spec: Any) -> Any:
    """The derived datatype (not contiguous) `spec` names, else None."""
    if not may_be_derived(spec):
        return None
    try:
        buf, count, displ, datatype = _unpack(spec)
    except ValueError:  # a malformed spec: refused where the others are
        return None
    mpi = mpi_module()
    if mpi is None or not isinstance(datatype, mpi.Datatype) or datatype.is_predefined:
        return None
    if datatype == mpi.DATATYPE_NULL or datatype.extent <= 0 or buf is None \
            or (isinstance(count, int) and count < 0) or (isinstance(displ, int) and displ < 0):
        return None  # refused by the plain path, with mpi4py's ValueError
    committed(datatype, "the message's datatype")  # a contiguous one too, as MPI refuses it
    return None if _plain_type(datatype) else datatype


def committed(datatype: Any, whose: str) -> Any:
    """`datatype`; a derived datatype not committed refused as MPI refuses its message or one-sided operation
    (MPI.ERR_TYPE), in the program's words, not as the error stack of a packing call it never made. Asked by
    packing none of it: Open MPI's Pack_size reads a type not committed and crashes the process, where Pack
    refuses it in both MPIs."""
    mpi = mpi_module()
    none = np.empty(0, np.uint8)
    try:
        datatype.Pack(none, none, 0, _self())
        return datatype
    except mpi.Exception as exc:
        if exc.Get_error_class() != mpi.ERR_TYPE:
            raise
    raise mpi_error(mpi, mpi.ERR_TYPE, f"{whose} has not been committed: call its .Commit() before a message "
                                       "or a one-sided operation uses it (t = MPI.DOUBLE.Create_vector(...).Commit())")


def _bytes(spec: Any, datatype: Any, writable: bool) -> np.ndarray:
    """The bytes of `spec`'s buffer its count of `datatype` spans, from its displacement on (Pack and
    Unpack read the count from the length: whole extents)."""
    buf, count, displ, _ = _unpack(spec)
    raw = array_of(buf, "buffer", readonly=not writable, typed=True).view(np.uint8)
    extent = datatype.extent
    start = 0 if displ is None else int(displ) * extent
    end = raw.size if count is None else min(raw.size, start + int(count) * extent)
    return raw[start: start + (end - start) // extent * extent]


def _self() -> Any:
    return real("COMM_SELF")


def packed(spec: Any) -> Any:
    """`spec`, or for a message of a derived datatype its packed bytes as ``[bytes, MPI.BYTE]``."""
    datatype = _derived(spec)
    if datatype is None:
        return spec
    comm = _self()
    values = _bytes(spec, datatype, writable=False)
    out = np.empty(datatype.Pack_size(values.size // datatype.extent, comm), np.uint8)
    end = datatype.Pack(values, out, 0, comm)
    return [out[:end], mpi_module().BYTE]


def unpacking(spec: Any) -> tuple[Any, Optional[Callable[[int], None]]]:
    """(what to receive into, None) for a plain message; for a derived datatype's, (a byte buffer, a
    function unpacking the bytes received into `spec`'s buffer)."""
    datatype = _derived(spec)
    if datatype is None:
        return spec, None
    comm = _self()
    values = _bytes(spec, datatype, writable=True)
    whole = values.size // datatype.extent
    space = np.empty(datatype.Pack_size(whole, comm), np.uint8)

    def unpack(nbytes: int) -> None:
        size, extent = datatype.size, datatype.extent
        count, rest = divmod(nbytes, size) if size else (0, 0)
        datatype.Unpack(space[:count * size], 0, values[:count * extent], comm)
        if rest:  # a last item in part (a shorter or truncated message): its first bytes in the type's order go
            # where the type puts them, the rest of its elements keep theirs, as MPICH receives them
            item = values[count * extent:(count + 1) * extent]
            own = np.empty(size, np.uint8)
            datatype.Pack(item, own, 0, comm)
            own[:rest] = space[count * size:count * size + rest]
            datatype.Unpack(own, 0, item, comm)

    # The type's data bytes, what the sender's Pack gives (Pack_size may be more: a broadcast's sizes must match).
    return [space[:whole * datatype.size], mpi_module().BYTE], unpack


def laid_out(call: str, red: Reduction, sendbuf: Any, recvbuf: Any, g: int = 1, counted: bool = True) -> tuple:
    """(red, sendbuf, recvbuf, finish) of a reduction: as given with finish None, but for a user-defined op
    (MPI.Op.Create) on a derived datatype other than contiguous ones: the messages' packed bytes (`blocks`: a
    message of MPI.BYTE), a Reduction that calls the user's function as MPICH calls it (`_LaidOut`), and a
    function unpacking the result into `recvbuf` once reduced. `recvbuf` None: not read (a Reduce's on a rank
    other than the root); `g`: the blocks of the send buffer, and of an in-place receive buffer (a
    Reduce_scatter_block's: the group's size; their counts are per block, as mpi4py reads them); `counted`:
    whether the send count must be the receive count (not a Reduce_scatter's: its recvcounts say)."""
    if red.name != "user op":
        return red, sendbuf, recvbuf, None
    inplace = in_place(sendbuf)
    sent = None if inplace else _derived(sendbuf)
    datatype = sent if recvbuf is None else _derived(recvbuf)
    if datatype is None and sent is None:
        return red, sendbuf, recvbuf, None
    if not inplace and recvbuf is not None and (sent is None or datatype is None or sent != datatype):
        raise DTypeError(f"{call}: mismatch in send and receive MPI datatypes: {_kind(sendbuf)} is sent, "
                         f"{_kind(recvbuf)} received; a reduction takes one datatype")
    if not inplace:
        sendbuf = blocks(sendbuf, g, False, writable=False)[0]
    finish = None
    if recvbuf is not None:
        parts = g if inplace else 1
        values = blocks(recvbuf, parts, False, writable=False)[0][0]  # kept where not reduced (Exscan's rank 0)
        recvbuf, finish = blocks(recvbuf, parts, False, writable=True)
        np.copyto(recvbuf[0], values)
        size = datatype.size
        if counted and not inplace and size and sendbuf[1] != recvbuf[1]:
            raise ShapeError(f"{call}: {sendbuf[1] // size} items of a {datatype.decode()[1].lower()} type are "
                             f"sent{' per rank' if g > 1 else ''} but the receive buffer takes {recvbuf[1] // size}")
    return Reduction(red.name, None, red.fn, _LaidOut(red.op, datatype)), sendbuf, recvbuf, finish


def _kind(spec: Any) -> str:
    """A message's datatype, in words."""
    try:
        datatype = _unpack(spec)[3]
    except ValueError:
        datatype = None
    mpi = mpi_module()
    if mpi is None or not isinstance(datatype, mpi.Datatype):
        return "a buffer of its own dtype"
    if datatype.is_predefined:
        return f"MPI.{datatype.Get_name().removeprefix('MPI_')}"
    return f"a {datatype.decode()[1].lower()} type"


class _LaidOut:
    """A user-defined op on items of a derived datatype that travel packed: each call unpacks its two operands into
    memory laid out as the type lays them and has this process's MPI call the user's function on them
    (``Op.Reduce_local`` on count items of the datatype: the function gets that memory, count extents of it,
    and the datatype, as MPICH hands them over in a collective), then packs the result back."""

    __slots__ = ("op", "datatype")

    def __init__(self, op: Any, datatype: Any) -> None:
        self.op, self.datatype = op, datatype

    def Reduce_local(self, inbuf: list, inoutbuf: list) -> None:  # noqa: N802 - MPI.Op's name (sim._reductions.fold)
        """inoutbuf = inbuf op inoutbuf, each ``[packed bytes, MPI.BYTE]``."""
        datatype = self.datatype
        count = inoutbuf[0].size // datatype.size if datatype.size else 0
        if not count:
            return
        comm = _self()
        extent = datatype.extent
        # The memory of count items: the data may lie before the start (a negative lower bound) or past count
        # extents (a resized type's): room for both, zeros where the type has none (MPICH's: whatever was there).
        before = max(0, -datatype.true_lb)
        after = max(count * extent, datatype.true_lb + (count - 1) * extent + datatype.true_extent)
        x, y = (np.zeros(before + after, np.uint8)[before:] for _ in range(2))
        datatype.Unpack(inbuf[0], 0, x[:count * extent], comm)
        datatype.Unpack(inoutbuf[0], 0, y[:count * extent], comm)
        self.op.Reduce_local([x, count, datatype], [y, count, datatype])
        datatype.Pack(y[:count * extent], inoutbuf[0], 0, comm)


def blocks(spec: Any, g: int, v: bool, writable: bool) -> Any:
    """For a collective's message of `g` blocks of a derived datatype (a Scatter's or an Alltoall's send buffer,
    a Gather's, Allgather's or Alltoall's receive buffer; `v`: its (counts, displacements) per block, in extents,
    as a Scatterv's): (the same blocks as bytes, packed side by side: a message of MPI.BYTE; a function unpacking
    them into `spec`'s buffer once received, None for a message sent, packed here); None for a plain message."""
    datatype = _derived(spec)
    if datatype is None:
        return None
    buf, count, displ, _ = _unpack(spec, pair=tuple if v else (list, tuple))
    raw = array_of(buf, "buffer", readonly=not writable, typed=True).view(np.uint8)
    extent, size = datatype.extent, datatype.size
    if v:
        counts = [int(c) for c in count] if count is not None else [raw.size // extent // max(g, 1)] * g
        if displ is None:
            displs = [0, *accumulate(counts)][:g]
        else:
            displs = [int(d) for d in displ] if not isinstance(displ, int) else [j * displ for j in range(g)]
    else:
        start = 0 if displ is None else int(displ) * extent
        raw = raw[start:]
        whole = raw.size // extent
        if count is None and g > 1 and whole % g:  # mpi4py's check
            raise ValueError(f"message: cannot infer count, {whole} items of a {datatype.decode()[1].lower()} type "
                             f"do not split into {g} equal blocks")
        per = whole // max(g, 1) if count is None else int(count)
        counts, displs = [per] * g, [j * per for j in range(g)]
    nbytes = [c * size for c in counts]
    offsets = [0, *accumulate(nbytes)][:g]
    space = np.empty(sum(nbytes), np.uint8)
    comm = _self()

    def region(j: int) -> np.ndarray:  # block j's extents (a resized type's data may reach past them)
        return raw[displs[j] * extent:(displs[j] + counts[j]) * extent]

    message = [space, (nbytes, offsets), mpi_module().BYTE] if v else [space, nbytes[0] if g else 0,
                                                                       mpi_module().BYTE]
    if not writable:
        for j in range(g):
            if counts[j]:
                datatype.Pack(region(j), space[offsets[j]:offsets[j] + nbytes[j]], 0, comm)
        return message, None

    def unpack() -> None:
        for j in range(g):
            if counts[j]:
                datatype.Unpack(space[offsets[j]:offsets[j] + nbytes[j]], 0, region(j), comm)

    return message, unpack


def _plain_type(datatype: Any) -> bool:
    """Whether an MPI datatype moves as its bytes read straight (predefined, or contiguous of a predefined)."""
    if datatype.is_predefined:
        return True
    base, combiner, _ = datatype.decode()
    return combiner == "CONTIGUOUS" and base.is_predefined


def wblocks(spec: Any, what: str, g: int, writable: bool) -> Any:
    """For an Alltoallw message (sim._buffers.wvector's forms: ``[buf, types]``, ``[buf, (counts, displs),
    types]``, ``[buf, counts, displs, types]``) from MPI.BOTTOM or with a derived datatype for some block:
    (the blocks' data packed side by side, each block's bytes, their offsets in it, a function unpacking them
    into the message's memory once received: None for one sent, packed here); None for a plain message.

    A block is `counts[i]` items of `types[i]` at byte `displs[i]` of the buffer, or at the addresses the type
    itself holds from MPI.BOTTOM (absolute ones: the ranks are threads of this process, so every rank's memory
    is this process's). Each block is packed and unpacked by this process's MPI, a message to itself on the
    real MPI.COMM_SELF, which reads the typemap as MPI does."""
    mpi = mpi_module()
    if mpi is None or type(spec) not in (list, tuple) or not 2 <= len(spec) <= 4:
        return None
    buf, counts, displs, types = wparts(spec)
    bottom = buf is mpi.BOTTOM
    if bottom and counts is None:  # mpi4py's message_vector_w
        raise ValueError("message: BOTTOM requires counts")
    if bottom and displs is None:
        raise ValueError("message: BOTTOM requires displs")
    types = list(types)
    if not bottom and all(isinstance(t, mpi.Datatype) and _plain_type(t) for t in types):
        return None
    if len(types) != g:
        raise ValueError(f"expecting {g} items, got {len(types)}")
    counts = [1] * g if counts is None else int_array(counts, g)
    displs = [0] * g if displs is None else int_array(displs, g)
    raw = None if bottom else array_of(buf, what, readonly=not writable, typed=True).view(np.uint8)
    sizes = [c * t.size for c, t in zip(counts, types)]
    offsets = [0, *accumulate(sizes)][:g]
    space = np.empty(sum(sizes), np.uint8)
    byte = mpi.BYTE

    def memory(i: int) -> tuple:
        """Block i where it lies, as a message (from MPI.BOTTOM: a struct of its count of its type at its
        displacement, an address) and the type to free after."""
        if not bottom:
            return [raw[displs[i]:], counts[i], types[i]], None
        at = mpi.Datatype.Create_struct([counts[i]], [displs[i]], [types[i]]).Commit()
        return [mpi.BOTTOM, 1, at], at

    def move(i: int, out: bool) -> None:
        where, made = memory(i)
        data = [space[offsets[i]:offsets[i] + sizes[i]], byte]
        try:
            _to_self(where, data) if out else _to_self(data, where)
        finally:
            if made is not None:
                made.Free()

    if not writable:
        for i in range(g):
            if sizes[i]:
                move(i, True)
        return space, sizes, offsets, None

    def unpack() -> None:
        for i in range(g):
            if sizes[i]:
                move(i, False)

    return space, sizes, offsets, unpack


def wmessage(spec: Any, what: str, g: int, writable: bool) -> tuple:
    """(its bytes, each block's bytes, their offsets, a function unpacking them once received or None) of an
    Alltoallw message of `g` blocks: `wblocks`' for MPI.BOTTOM or derived datatypes, else its bytes where they
    lie (sim._buffers.wvector's; nothing to unpack)."""
    found = wblocks(spec, what, g, writable)
    return found if found is not None else (*wvector(spec, what, g, readonly=not writable), None)


_SELF_LOCK = threading.Lock()  # the ranks are threads: one message to itself at a time on the real COMM_SELF
_SELF_TAG = 32766  # a tag no rank's own messages meet: the process's COMM_SELF is spmdsim's alone here


def _to_self(sendbuf: list, recvbuf: list) -> None:
    """Copy `sendbuf`'s data into `recvbuf` through this process's MPI (a Sendrecv with itself): MPI reads
    each side's typemap, MPI.BOTTOM's absolute addresses included."""
    comm = _self()
    with _SELF_LOCK:
        comm.Sendrecv(sendbuf, 0, _SELF_TAG, recvbuf, 0, _SELF_TAG)
