"""The bytes of a one-sided operation (spmdsim.emulator.window): a window's memory, buffer and target specs
read as byte positions in their datatypes, and what an accumulate computes of them.

Datatypes: predefined ones and any derived datatype MPI can pack, on both sides: a derived type's
bytes are found with this process's MPI (``Datatype.Pack`` on the real MPI.COMM_SELF of a buffer
whose bytes count their own positions), as spmdsim.emulator.derived sends them. An accumulate
computes in the datatype's predefined element type (MPI requires one per operation).
"""
from __future__ import annotations

from typing import Any

from ..runtime.sim._buffers import _unpack
from ..runtime.sim._datatypes import array_of, mpi_datatype, numpy_dtype, typecode_datatype
from ..runtime.sim._mpi import mpi_error
from ..runtime.sim._reductions import fold, reduction
from .._lazy import numpy_on_first_use
from .typemap import mapped
from .derived import _self, committed
from .window_state import _mpi

np = numpy_on_first_use(globals())

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
    committed(datatype, "a one-sided operation's datatype")
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
    step = basic.Get_size()
    if step > 1 and basic != _mpi().BYTE:  # each element's bytes from its first: MPI packs a long double's 10
        packed = (packed[::step, None] + np.arange(step)).ravel()  # bytes of value, not its padding
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
