"""The argument checks of the buffer collectives (spmdsim.emulator.collectives), with MPICH's errors.

A predefined op on a derived datatype or on elements it is not defined on
(MPI.ERR_OP), a send buffer aliased with the receive buffer (MPI.ERR_BUFFER),
send data that does not match the receive buffer, blocks of different sizes,
and a Bcast receiver whose count is not the root's (MPI.ERR_TRUNCATE).
"""
from __future__ import annotations

from typing import Any

from ..errors import ShapeError
from ..runtime.sim import thread_engine as bodies
from .._lazy import numpy_on_first_use
from .derived import may_be_derived
from ..base.validate import dtype_name
from ..runtime.sim import _buffers
from ..runtime.sim._buffers import _unpack
from ..runtime.sim._datatypes import numpy_dtype
from ..runtime.sim._mpi import BufferSpecError, _numpy_type, in_place, mpi_error, mpi_module
from .typemap import _MAPPED_KINDS, message  # the shared reader, refusing what mpi4py cannot map first
from ..runtime.sim.requests import rank_name

np = numpy_on_first_use(globals())  # a program without numpy does not load it


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
             "band": "iu", "bor": "iu", "bxor": "iu", "maxloc": "V", "minloc": "V"}
_KIND_NAMES = {"b": "boolean (logical)", "f": "floating", "c": "complex", "i": "integer", "u": "integer"}
#: What an op is defined on, by element kind: those above, and MAXLOC's and MINLOC's pairs (numpy's "V").
_TAKES = {**_KIND_NAMES, "V": "(value, index) pair (MPI.DOUBLE_INT, MPI.FLOAT_INT, MPI.TWOINT, ...)"}


#: Each reduction's names of its two messages, as its refusals give them (`plain_reduction`'s, made once).
_MESSAGES = {call: (f"{call} sendbuf", f"{call} recvbuf")
             for call in ("Allreduce", "Reduce", "Scan", "Exscan", "Reduce_scatter_block")}


def plain_reduction(call: str, red: Any, sendbuf: Any, recvbuf: Any, receives: bool = True, blocks: int = 0) -> Any:
    """(send data, receive buffer), flat, of a reduction given numpy arrays (most programs' call) that every
    check of the general path (`_predefined_op_types`, derived.laid_out, `message`, `_matching`) passes with
    nothing to change: their checks without the steps that cannot refuse plain arrays. Else None, and the
    general path checks (and refuses, with its messages). `receives` False: a Reduce's off the root (`recvbuf`
    not read: the send data and None); `blocks`: a Reduce_scatter_block's group size (its send buffer's blocks,
    each of the receive buffer's count)."""
    ndarray = _numpy_type("ndarray")
    if ndarray is None or type(sendbuf) is not ndarray or receives and type(recvbuf) is not ndarray:
        return None
    kind = sendbuf.dtype.kind
    if kind not in _MAPPED_KINDS or receives and recvbuf.dtype.kind not in _MAPPED_KINDS:
        return None  # typemap.mapped's refusals
    allowed = _OP_KINDS.get(red.name)  # (a user op: none, and laid_out keeps plain arrays as they are)
    if allowed is not None and not _defined_on(allowed, kind):  # _op_on_elements' refusal
        return None
    what = _MESSAGES[call]
    if not receives:
        return _buffers.message(sendbuf, what[0])[0], None
    dst = _buffers.message(recvbuf, what[1], readonly=False)[0]
    if blocks:
        src, count = _buffers.message(sendbuf, what[0], blocks)[:2]
        if count != dst.size or src.dtype != dst.dtype:  # refused by the general path, which says how
            return None
        _aliased(call, src[:blocks * count], dst)
        return src, dst
    src = bodies.matching(call, _buffers.message(sendbuf, what[0])[0], dst)
    _aliased(call, src, dst)
    return src, dst


def _op_on_elements(call: str, red: Any, allowed: str, specs: tuple) -> None:
    """MPI.ERR_OP, as MPICH raises it ("Invalid MPI_Op"), where a predefined op meets elements the standard does
    not define it on: MPI.MAX of complex numbers, MPI.SUM of booleans, MPI.BAND of floats (numpy alone answers
    with a value, or a TypeError). The elements are a plain array's, or a predefined datatype's."""
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
        if _defined_on(allowed, kind):
            return
        mpi = mpi_module()
        if mpi is None:
            return
        raise mpi_error(mpi, mpi.ERR_OP, f"{call}: MPI.{red.name.upper()} is not defined on {_KIND_NAMES[kind]} "
                                         "data: MPI defines it on "
                                         f"{' and '.join(sorted({_TAKES[k] for k in allowed}))} data, as "
                                         "MPICH checks (Invalid MPI_Op)")


def _defined_on(allowed: str, kind: str) -> bool:
    """Whether a predefined op defined on the element kinds `allowed` takes elements of numpy kind `kind` (one
    MPI does not name, such as a structured dtype's, is left to the reduction)."""
    return kind in allowed or kind not in _KIND_NAMES


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
