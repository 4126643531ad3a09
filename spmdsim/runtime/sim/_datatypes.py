"""MPI datatypes as numpy dtypes, and a buffer as a flat numpy array over its own memory, never a copy.

A buffer is anything with the buffer protocol, ``__dlpack__`` or ``__cuda_array_interface__`` (host
memory); a datatype is a predefined MPI datatype, a contiguous derived one (its bytes) or an mpi4py typecode
('d', 'i', ...). Refused as mpi4py refuses them: a buffer not in one block, read-only where written, or of a
dtype in the other byte order or of Python objects.
"""
from __future__ import annotations

import math
from typing import Any

from ...errors import ShapeError
from ..._lazy import numpy_on_first_use
from ._mpi import BufferSpecError, DatatypeMapError, mpi_module

np = numpy_on_first_use(globals())  # a program without numpy does not load it


# -- datatypes -------------------------------------------------------------------------------

_DTYPES: dict = {}
_BY_OBJECT: dict = {}  # id(a predefined MPI datatype object) -> (the object, its numpy dtype)


def typecode_datatype(mpi: Any, code: str) -> Any:
    """The MPI datatype of an mpi4py typecode ('d', 'i', ...): DatatypeMapError (a KeyError) for an unknown one,
    as mpi4py's lookup refuses it."""
    found = mpi._typedict.get(code)
    if found is None:
        raise DatatypeMapError(f"cannot map typecode {code!r} to an MPI datatype")
    return found


def numpy_dtype(datatype: Any) -> np.dtype:
    """The numpy dtype of an MPI datatype (predefined ones) or of a typecode string like 'd'."""
    found = _BY_OBJECT.get(id(datatype))
    if found is not None and found[0] is datatype:  # a predefined one seen before (kept: its id stays its own)
        return found[1]
    mpi = mpi_module()
    if isinstance(datatype, str):
        if mpi is None:
            return np.dtype(datatype)
        datatype = typecode_datatype(mpi, datatype)
    key = datatype.py2f() if mpi is not None and isinstance(datatype, mpi.Datatype) else id(datatype)
    found = _DTYPES.get(key)
    if found is not None:
        return found
    if mpi is None or not isinstance(datatype, mpi.Datatype):
        raise ShapeError(f"datatype {datatype!r} is not an MPI datatype or a typecode")
    if datatype == mpi.DATATYPE_NULL:
        raise ShapeError("datatype MPI.DATATYPE_NULL cannot carry a message")
    if not datatype.is_predefined:
        base, combiner, params = datatype.decode()
        if combiner != "CONTIGUOUS":  # not cached: a freed type's handle is given to the next one
            raise NotImplementedError("derived datatypes other than contiguous ones are not simulated "
                                      "(docs/howto/simulate.md)")
        return np.dtype((np.void, params["count"] * numpy_dtype(base).itemsize))  # its bytes, moved as one
    from mpi4py.util.dtlib import to_numpy_dtype

    if datatype in (mpi.BYTE, mpi.PACKED):
        found = np.dtype(np.uint8)
    else:
        found = to_numpy_dtype(datatype)
    _DTYPES[key] = found
    _BY_OBJECT[id(datatype)] = (datatype, found)
    return found


def mpi_datatype(dtype: np.dtype) -> Any:
    from mpi4py.util.dtlib import from_numpy_dtype

    return from_numpy_dtype(dtype)


# -- buffers ---------------------------------------------------------------------------------

class _Interface:
    """A __cuda_array_interface__ on host memory, offered to numpy as an __array_interface__."""

    def __init__(self, cai: dict) -> None:
        self.__array_interface__ = {"shape": tuple(cai["shape"]), "typestr": cai["typestr"],
                                    "data": tuple(cai["data"]), "strides": cai.get("strides"),
                                    "version": 3}


def _from_interface(cai: dict, what: str) -> np.ndarray:
    """The host memory a __cuda_array_interface__ names, as a numpy array over it. An empty buffer's address
    may be 0 (an empty array.array's is): numpy before 2.3 takes no interface without memory, so such a
    buffer is an empty array of its type (nothing to read or write); 0 with entries is refused."""
    shape = tuple(cai["shape"])
    address, readonly = cai["data"]
    if not address:
        if math.prod(shape):
            raise BufferSpecError(f"{what}: __cuda_array_interface__ of shape {shape!r} at address 0; "
                                  "expected the address of its memory")
        a = np.empty(shape, np.dtype(cai["typestr"]))
        a.flags.writeable = not readonly
        return a
    return np.asarray(_Interface(cai))


def array_of(buf: Any, what: str, readonly: bool = True, typed: bool = False) -> np.ndarray:
    """`buf` as a flat numpy array over the same memory (never a copy); `typed`: a datatype comes with it,
    so its own dtype is not read (mpi4py moves the bytes of [big_endian_array, MPI.INT])."""
    if type(buf) is np.ndarray:
        a = buf
    elif isinstance(buf, np.ndarray):
        a = buf
    else:
        try:
            view = memoryview(buf)
        except TypeError:
            view = None
        if view is not None:
            a = np.asarray(view)
        elif hasattr(buf, "__dlpack__"):
            from ._dlpack import from_dlpack

            a = from_dlpack(buf)
        elif hasattr(buf, "__cuda_array_interface__"):
            a = _from_interface(buf.__cuda_array_interface__, what)
        else:
            raise TypeError(f"{what}: {type(buf).__name__!r} is not a buffer (expected an array, "
                            f"or [buffer, count, datatype]; Python objects go with the lowercase methods: "
                            f"send, recv, bcast, ...)")
    if not a.flags.c_contiguous:
        if not a.flags.f_contiguous:
            raise BufferSpecError(f"{what}: buffer of shape {a.shape!r} and strides {a.strides!r} is not "
                                  f"contiguous; MPI moves one block (np.ascontiguousarray makes one)")
        a = a.T  # Fortran order: one block too, sent in memory order as mpi4py sends it
    if not readonly and not a.flags.writeable:
        raise BufferSpecError(f"{what}: buffer is read-only")
    if not typed:
        check_dtype(a.dtype, what)
    return a if a.ndim == 1 else a.reshape(-1)


def check_dtype(dtype: np.dtype, what: str) -> None:
    """Refuse what mpi4py refuses: a dtype in the other byte order (BufferError), or of Python objects
    (KeyError: no MPI datatype; their bytes are pointers)."""
    if not dtype.isnative:
        raise BufferSpecError(f"{what}: dtype {dtype.str!r} is not in this machine's byte order; MPI moves "
                              f"native values (array.astype({dtype.newbyteorder('=').str!r}) converts)")
    if dtype.hasobject:
        raise DatatypeMapError(f"{what}: cannot map dtype {dtype.str!r} (Python objects) to an MPI datatype; "
                               f"send objects with the lowercase methods (send, bcast, ...)")


def _is_datatype(value: Any) -> bool:
    if isinstance(value, str):
        return True
    mpi = mpi_module()
    return mpi is not None and isinstance(value, mpi.Datatype)


def as_bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of a contiguous array (a view)."""
    return a.view(np.uint8) if a.dtype.itemsize != 1 or a.dtype != np.uint8 else a


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[:] = src, as bytes when the two dtypes differ (MPI moves a type signature's bytes)."""
    if dst.dtype == src.dtype:
        dst[...] = src
    else:
        as_bytes(dst)[...] = as_bytes(src)
