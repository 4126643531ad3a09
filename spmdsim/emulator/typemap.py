"""The MPI datatype mpi4py finds for a buffer passed without one, refused where mpi4py finds none.

mpi4py reads a message without a datatype (``Send(a, ...)``, ``Bcast([a, count])``) by the buffer's
PEP 3118 format, looked up in its table of typecodes (``MPI._typedict``): a numpy text or void array
(``'2w'`` for ``<U2``, ``'2s'`` for ``S2``, ``'3x'`` for ``V3``, ``'T{...}'`` for a structured dtype) maps to
none, and mpi4py raises ``KeyError: "cannot map '2w' to MPI datatype"``; an array without a buffer format
(datetime, timedelta, ml_dtypes' bfloat16) falls back to DLPack, which numpy refuses for those dtypes with
``BufferError``. The shared reader of messages (spmdsim.runtime.sim._buffers.message) moves their bytes, as the
runtime's own point-to-point needs (bfloat16, text); the emulator's entry points refuse them first, here.
"""
from __future__ import annotations

from typing import Any

from ..runtime.sim import _buffers
from ..runtime.sim._datatypes import _is_datatype
from ..runtime.sim._mpi import BufferSpecError, DatatypeMapError, _numpy_type, mpi_module

__all__ = ["mapped", "message", "vector"]

#: numpy kinds every dtype of which has a format in mpi4py's table (bool, integers, floats, complex numbers;
#: objects are refused by the shared reader: spmdsim.runtime.sim._datatypes.check_dtype).
_MAPPED_KINDS = frozenset("biufcO")

#: mpi4py's typecodes of numpy's text dtypes when mpi4py is not loaded (one character: MPI.CHAR, MPI.WCHAR).
_TEXT_CODES = frozenset(("1s", "1w", "s", "w"))

_FOUND: dict = {}  # numpy dtype -> None (mapped) or the exception to raise (its text without the call's name)


def mapped(spec: Any, what: str) -> None:
    """Refuse, as mpi4py does, a message `spec` without a datatype whose buffer is a numpy array (or a
    memoryview of one) of a dtype mpi4py maps to no MPI datatype. `what`: the call's name for the message."""
    buf = spec
    if type(spec) in (list, tuple):
        if not 2 <= len(spec) <= 4:
            return  # malformed: the shared reader refuses it with mpi4py's ValueError
        if _is_datatype(spec[-1]) if len(spec) == 2 else spec[-1] is not None:
            return  # a datatype given (the last item of [buf, count, datatype] and longer forms)
        buf = spec[0]
    ndarray = _numpy_type("ndarray")
    if ndarray is None:  # numpy not loaded: no numpy array among the arguments
        return
    if isinstance(buf, ndarray):
        dtype = buf.dtype
    elif isinstance(buf, memoryview) and isinstance(buf.obj, ndarray):
        try:
            dtype = _numpy_type("asarray")(buf).dtype
        except (TypeError, ValueError):
            return
    else:
        return
    if dtype.kind in _MAPPED_KINDS:
        return
    found = _FOUND.get(dtype, False)
    if found is False:
        found = _FOUND[dtype] = _refusal(dtype)
    if found is not None:
        raise type(found)(f"{what}: {found.args[0]}")


def _refusal(dtype: Any) -> Any:
    """None if mpi4py maps `dtype` to an MPI datatype, else the exception it raises for it (its text)."""
    empty = _numpy_type("empty")
    hint = "name a datatype to move its bytes, e.g. [buffer, MPI.BYTE]"
    try:
        code = memoryview(empty(0, dtype)).format
    except (TypeError, ValueError, BufferError):  # no buffer format: mpi4py asks DLPack, which numpy refuses
        return BufferSpecError(f"dtype {dtype.str!r} ({dtype.name}) has no buffer format, and DLPack only supports "
                               f"signed/unsigned integers, float and complex dtypes; {hint}")
    mpi = mpi_module()
    if (code in mpi._typedict) if mpi is not None else (code in _TEXT_CODES):
        return None
    return DatatypeMapError(f"cannot map {code!r} to MPI datatype (numpy dtype {dtype.str!r}: mpi4py has no MPI "
                            f"datatype for it); {hint}")


def message(spec: Any, what: str, blocks: int = 1, readonly: bool = True) -> tuple:
    """spmdsim.runtime.sim._buffers.message, after `mapped`."""
    mapped(spec, what)
    return _buffers.message(spec, what, blocks, readonly)


def vector(spec: Any, what: str, blocks: int, readonly: bool = True) -> tuple:
    """spmdsim.runtime.sim._buffers.vector, after `mapped`."""
    mapped(spec, what)
    return _buffers.vector(spec, what, blocks, readonly)
