"""Reading mpi4py-style message arguments (buffer, counts, displacements, datatype) without importing mpi4py.

A message is read as mpi4py reads it (its msgbuffer.pxi): ``buf``, ``[buf, datatype]``,
``[buf, count]``, ``[buf, count, datatype]``, ``[buf, (count, displ), datatype]`` or
``[buf, count, displ, datatype]``, where a count is per peer in the collectives that move one
block per peer (`blocks`), and a buffer is anything with the buffer protocol, ``__dlpack__``
or ``__cuda_array_interface__`` (host memory), seen in place, never copied. MPI's constants and errors are
spmdsim.runtime.sim._mpi's, datatypes and buffers as arrays _datatypes', reduction ops _reductions'.
"""
from __future__ import annotations

import array
import mmap
import operator
import sys
from typing import Any, Optional

from ...errors import ShapeError
from ..._lazy import numpy_on_first_use
from ._datatypes import _BY_OBJECT, _is_datatype, array_of, as_bytes, numpy_dtype
from ._mpi import BufferSpecError, _numpy_type, integer, mpi_error, mpi_module

np = numpy_on_first_use(globals())  # a program without numpy does not load it

#: The byte order numpy marks as not this machine's ('>' on little-endian machines).
_FOREIGN = ">" if sys.byteorder == "little" else "<"
_FLAT = (bytearray, bytes, mmap.mmap, array.array)  # buffers that are always one contiguous block


def _typed(a: np.ndarray, dtype: Optional[np.dtype], what: str) -> np.ndarray:
    if dtype is None or dtype == a.dtype:
        return a
    raw = a.view(np.uint8)
    usable = raw.size - raw.size % dtype.itemsize
    return raw[:usable].view(dtype)


def _unpack(spec: Any, pair: Any = (list, tuple)) -> tuple:
    """(buffer, count, displ, datatype) of a message spec, as mpi4py's message_simple reads it.

    A count of a type in `pair` is (count, displ); message_vector passes ``tuple`` (its list is counts).
    """
    count = displ = dtype = None
    if isinstance(spec, (list, tuple)):
        n = len(spec)
        if n == 2:
            buf, count = spec
            if _is_datatype(count):
                count, dtype = None, count
            elif isinstance(count, pair):
                count, displ = count
        elif n == 3:
            buf, count, dtype = spec
            if isinstance(count, pair):
                count, displ = count
        elif n == 4:
            buf, count, displ, dtype = spec
        else:
            raise ValueError("message: expecting 2 to 4 items")
    else:
        buf = spec
    return buf, count, displ, dtype


def no_buffer(what: str, methods: str = "send, bcast, allreduce") -> TypeError:
    """mpi4py's TypeError for None where a message goes ("message: expecting buffer or list/tuple"): its readers
    take None only for a message MPI does not read (to or from MPI.PROC_NULL, a non-root's receive buffer of a
    gather or reduce, a non-root's send buffer of a scatter) and, where MPI allows it, as MPI.IN_PLACE; the callers
    pass neither here. Read as an empty buffer, it would be a receive of 0 x uint8 ("send dtype 'float64' and
    receive dtype 'uint8' differ"), a Bcast that runs or whose ranks diverge."""
    return TypeError(f"{what}: message: expecting buffer or list/tuple, got None (Python objects go with the "
                     f"lowercase methods: {methods}, ...)")


def message(spec: Any, what: str, blocks: int = 1, readonly: bool = True) -> tuple[np.ndarray, int, Any]:
    """(typed flat view from the displacement on, count per block, MPI datatype or None) of `spec`.

    Without a count, the buffer's entries split into `blocks` equal blocks (mpi4py's rule). `spec` None is
    mpi4py's TypeError (`no_buffer`); a None buffer in a list (``[None, 0, MPI.DOUBLE]``) is empty, as mpi4py's.
    """
    if (type(spec) is np.ndarray and spec.flags.c_contiguous and spec.dtype.byteorder != _FOREIGN
            and spec.dtype.char != "O"):  # the hot path: a plain array (array_of says what the others lack)
        a = spec.reshape(-1)
        if not readonly and not a.flags.writeable:
            raise BufferSpecError(f"{what}: buffer is read-only")
        n = a.size
        if blocks > 1 and n % blocks:
            raise ValueError(f"{what}: {n} entries do not split into {blocks} equal blocks")
        return a, n // blocks if blocks > 1 else n, None
    if type(spec) in (list, tuple) and len(spec) == 3 and type(spec[1]) is int and spec[1] >= 0 and blocks == 1:
        buf, count, datatype = spec  # [buffer, count, predefined datatype]: each of osu_bw's messages
        known = _BY_OBJECT.get(id(datatype))
        if known is not None and known[0] is datatype and (type(buf) in _FLAT or type(buf) is _numpy_type("ndarray")):
            if type(buf) in _FLAT:  # one block of bytes: numpy's view of it directly, not through memoryview
                a = np.frombuffer(buf, np.uint8)
                if not readonly and not a.flags.writeable:
                    raise BufferSpecError(f"{what}: buffer is read-only")
            else:
                a = array_of(buf, what, readonly, True)
            a = _typed(a, known[1], what)  # as below, without the general cases
            if count > a.size:
                raise ShapeError(f"{what}: 1 x {count} entries do not fit a buffer of {a.size}")
            return a, count, datatype
    if spec is None:
        raise no_buffer(what)
    buf, count, displ, datatype = _unpack(spec)
    try:  # the buffer first, as mpi4py reads it: [1, 2, 3] is a list of numbers, not [buf, count, type]
        a = None if buf is None else array_of(buf, what, readonly, datatype is not None)
    except TypeError:
        if isinstance(spec, (list, tuple)):
            raise TypeError(f"{what}: {spec!r} is read as [buffer, count, datatype] and {buf!r} is not a "
                            f"buffer; pass a numpy array (np.array({spec!r})), or send Python objects with "
                            f"the lowercase methods (send, recv, bcast, ...)") from None
        raise
    if datatype is not None and datatype == getattr(mpi_module(), "DATATYPE_NULL", None):
        raise _null_datatype(a, count, displ, what)
    dtype = None if datatype is None else numpy_dtype(datatype)
    if a is None:
        a = np.empty(0, dtype or np.uint8)
    else:
        if count is None and dtype is not None and a.nbytes % dtype.itemsize:
            raise ValueError(f"{what}: buffer length {a.nbytes} is not a multiple of datatype extent "
                             f"{dtype.itemsize}")
        a = _typed(a, dtype, what)
    if displ is not None:
        displ = operator.index(displ)
        if displ < 0 or displ > a.size:
            raise ValueError(f"{what}: displacement {displ} out of bounds of {a.size} entries")
        a = a[displ:]
    if count is None:
        if blocks > 1 and a.size % blocks:
            raise ValueError(f"{what}: {a.size} entries do not split into {blocks} equal blocks")
        count = a.size // blocks if blocks > 1 else a.size
    else:
        count = operator.index(count)
        if count < 0:
            raise ValueError(f"{what}: negative count {count}")
    if count * max(blocks, 1) > a.size:
        raise ShapeError(f"{what}: {blocks} x {count} entries do not fit a buffer of {a.size}")
    return a, count, datatype


def _null_datatype(a: Any, count: Any, displ: Any, what: str) -> BaseException:
    """The error of a message of MPI.DATATYPE_NULL: mpi4py's ValueError where it needs the type's extent (a
    displacement, a count to infer from the buffer), else MPICH's MPI.Exception (MPI.ERR_TYPE), which a program's
    ``except MPI.Exception`` catches."""
    displ = 0 if displ is None else operator.index(displ)
    count = None if count is None else operator.index(count)
    if displ < 0 or (count is not None and count < 0):
        return ValueError(f"{what}: message: negative {'displacement' if displ < 0 else 'count'} "
                          f"{displ if displ < 0 else count}")
    if displ or (count is None and a is not None and a.nbytes):
        return ValueError(f"{what}: message: cannot {'handle displacement' if displ else 'infer count'}, "
                          "datatype is null")
    mpi = mpi_module()
    return mpi_error(mpi, mpi.ERR_TYPE, "datatype MPI.DATATYPE_NULL cannot carry a message")


def wparts(spec: Any) -> tuple:
    """(buffer, counts or None, displacements or None, datatypes) of an Alltoallw message as mpi4py's
    message_vector_w reads it: ``[buf, types]``, ``[buf, (counts, displs), types]``, ``[buf, counts, displs,
    types]``; mpi4py's ValueError for another number of items."""
    if len(spec) == 2:
        buf, types = spec
        return buf, None, None, types
    if len(spec) == 3:
        buf, (counts, displs), types = spec
        return buf, counts, displs, types
    if len(spec) == 4:
        return tuple(spec)
    raise ValueError("message: expecting 2 to 4 items")


def wvector(spec: Any, what: str, blocks: int, readonly: bool = True) -> tuple[np.ndarray, list, list]:
    """(the buffer's bytes, each block's bytes, each block's byte displacement) of an Alltoallw message,
    as mpi4py's message_vector_w reads it: ``[buf, types]`` (each block one item at displacement 0),
    ``[buf, (counts, displs), types]`` or ``[buf, counts, displs, types]``, a block `counts[i]` items of
    `types[i]` (predefined, or contiguous: its bytes) at `displs[i]` bytes. A message from MPI.BOTTOM or of
    other derived datatypes is spmdsim.emulator.derived.wblocks'."""
    buf, counts, displs, types = wparts(spec)
    raw = as_bytes(array_of(buf, what, readonly, True))  # flat, one block of memory
    if counts is None and displs is None:
        counts, displs = [1] * blocks, [0] * blocks
    else:
        counts, displs = int_array(counts, blocks), int_array(displs, blocks)
    if len(types) != blocks:
        raise ValueError(f"expecting {blocks} items, got {len(types)}")
    sizes = [c * numpy_dtype(t).itemsize for c, t in zip(counts, types)]
    for i, (at, n) in enumerate(zip(displs, sizes)):
        if at < 0 or n < 0 or at + n > raw.size:
            raise ShapeError(f"{what}: block {i} ({counts[i]} items, {n} bytes at byte {at}) does not fit a "
                             f"buffer of {raw.size} bytes")
    return raw, sizes, list(displs)


def int_array(values: Any, count: Optional[int] = None) -> list:
    """`values` as a list of ints, as mpi4py reads an array argument (getarray: each through
    operator.index); with `count`, that many (chkarray: its ValueError for another length)."""
    out = [operator.index(v) for v in values]
    if count is not None and len(out) != count:
        raise ValueError(f"expecting {count} items, got {len(out)}")
    return out


def vector(spec: Any, what: str, blocks: int, readonly: bool = True) -> tuple[np.ndarray, list, list, Any]:
    """(typed flat buffer, counts, displacements, MPI datatype or None) of a v-collective message.

    As mpi4py's message_vector: ``[buf, counts]``, ``[buf, (counts, displs)]``, ``[buf, counts,
    datatype]``, ``[buf, counts, displs, datatype]``; a count or a displacement may be one integer
    (every block that count; displacements i * that stride); no counts split the buffer evenly.
    """
    if (type(spec) is list and len(spec) == 2 and type(spec[0]) is np.ndarray and type(spec[1]) is tuple
            and len(spec[1]) == 2 and type(spec[1][0]) is list and spec[0].flags.c_contiguous
            and spec[0].dtype.byteorder != _FOREIGN and spec[0].dtype.char != "O"):
        # The hot path (runtime.executor's moves): [array, (counts, displs or None)], no datatype.
        a = spec[0].reshape(-1)
        if not readonly and not a.flags.writeable:
            raise BufferSpecError(f"{what}: buffer is read-only")
        counts, displs = spec[1]
        return (a, *_layout(counts, displs, blocks, a.size, what), None)
    if spec is None:
        raise no_buffer(what)
    buf, counts, displs, datatype = _unpack(spec, pair=tuple)
    dtype = None if datatype is None else numpy_dtype(datatype)
    a = (np.empty(0, dtype or np.uint8) if buf is None
         else _typed(array_of(buf, what, readonly, datatype is not None), dtype, what))
    if counts is None:
        size = a.size
        counts = [size // blocks + (size % blocks > i) for i in range(blocks)]
    elif _scalar(counts):  # one count for every block (a 0-d array too, as mpi4py reads it)
        counts = [operator.index(counts)] * blocks
    return (a, *_layout(counts, displs, blocks, a.size, what), datatype)


def _scalar(value: Any) -> bool:
    found = _numpy_type("ndarray")
    return integer(value) or (found is not None and isinstance(value, found) and value.ndim == 0)


def _layout(counts: Any, displs: Any, blocks: int, size: int, what: str) -> tuple[list, list]:
    """(counts, displacements) of `blocks` blocks, checked to lie inside a buffer of `size` entries."""
    counts = list(map(operator.index, counts))
    if len(counts) < blocks:
        raise ValueError(f"{what}: {len(counts)} counts for {blocks} ranks")
    del counts[blocks:]
    if displs is None:
        displs, at = [], 0
        for c in counts:
            displs.append(at)
            at += c
    elif _scalar(displs):
        displs = [operator.index(displs) * i for i in range(blocks)]
    else:
        displs = list(map(operator.index, displs))
        del displs[blocks:]
    if blocks and (min(counts) < 0 or min(displs) < 0 or max(map(operator.add, counts, displs)) > size):
        bad = next((c, d) for c, d in zip(counts, displs) if c < 0 or d < 0 or c + d > size)
        raise ShapeError(f"{what}: block of {bad[0]} entries at {bad[1]} is outside a buffer of {size}")
    return counts, displs
