"""The argument checks the collectives share (runtime.door, runtime.collectives, runtime.prepared, ...):
each raises ShapeError or DTypeError, alike on every member, before any transfer; `_take` remembers the
dtypes an op took, so a call checks its dtype with one set lookup."""
from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ..base import buffers
from ..base.precision import is_low
from ..base.validate import SUPPORTED_DTYPES, counted, long_double
from ..errors import DTypeError, ShapeError

_empty = buffers.empty  # placed in the page for MPI's copies (spmdsim.base.buffers)
_ndarray = np.ndarray


def _contig(local: Any) -> np.ndarray:
    # Copy only when MPI could not read the buffer as is. Not np.ascontiguousarray: it makes a 0-d value
    # (np.float64(2.0), a Python float) 1-d, and a collective's result would be of shape (1,), not ().
    if type(local) is _ndarray and local.flags.c_contiguous:
        return local
    return np.asarray(local, order="C")


def _dim(tensor_dim: int, ndim: int, what: str) -> int:
    """`tensor_dim` as a dim of an array with `ndim` dims (negative counts from the end)."""
    if type(tensor_dim) is int and 0 <= tensor_dim < ndim:
        return tensor_dim
    if isinstance(tensor_dim, bool) or not isinstance(tensor_dim, (int, np.integer)):
        raise ShapeError(f"{what} {tensor_dim!r} must be an integer tensor dim (0 <= dim < {ndim})")
    if not -ndim <= tensor_dim < ndim:
        raise ShapeError(f"{what} {tensor_dim!r} is out of range for an array with {counted(ndim, 'dim')}")
    return int(tensor_dim) % ndim


def _divisible(shape: tuple[int, ...], tensor_dim: int, g: int, op: str) -> None:
    if shape[tensor_dim] % g:
        raise ShapeError(
            f"{op}: dim {tensor_dim} of local shape {shape!r} is not divisible by group size {g}"
        )


def _result(out: np.ndarray | None, shape: tuple, dtype: np.dtype, op: str) -> np.ndarray:
    """A new result array, or the caller's `out` after checking it can take the result."""
    if out is None:
        return _empty(shape, dtype)
    # `is`: numpy shares one dtype object per builtin type (an equal but distinct one is compared
    # next); `carray`: C-contiguous, aligned and writeable, in one flag read.
    if type(out) is _ndarray and out.shape == shape and out.dtype is dtype and out.flags.carray:
        return out
    if (type(out) is _ndarray and out.shape == shape and out.dtype == dtype
            and out.flags.c_contiguous and out.flags.writeable):
        return out
    got = (getattr(out, "shape", None), getattr(getattr(out, "dtype", None), "name", None))
    raise ShapeError(f"{op}: out {got!r} must be a writeable C-contiguous array of "
                     f"{(shape, np.dtype(dtype).name)!r}")


def _copy_into(out: np.ndarray, x: np.ndarray, op: str) -> np.ndarray:
    _result(out, x.shape, x.dtype, op)[...] = x
    return out


# dtype kinds MPI moves (numbers, bool, and bytes/str as their bytes: spmdsim.runtime.engines.mpi) and the
# ones it can sum.
_MOVABLE = "biufcSU"
_SUMMABLE = "iufc"
_ORDERED = "iuf"  # and the ones it can take the maximum or minimum of


#: op -> the dtypes (as the callers pass them: an array's, or a dtype where shapes differ) `_check_dtype` let it
#: take: `issue` and `_alone` check a dtype once per op, then look it up, on every engine: mpi4py refuses what
#: MPI cannot take, but the thread and dry engines never do.
_TAKEN: defaultdict[str, set] = defaultdict(set)


def _take(op: str, dtype: Any) -> None:
    """`_check_dtype` of `dtype` (or what np.dtype makes of it) for `op`; once it passes, remembered in `_TAKEN`."""
    _check_dtype(op, np.dtype(dtype))
    _TAKEN[op].add(dtype)


def _take_order(op: str, reduction: str, dtype: Any) -> None:
    """`_check_dtype` of `dtype` for `op`'s `reduction` ("max" or "min"), remembered in `_TAKEN` as `_take`."""
    taken = _TAKEN[f"{op} {reduction}"]
    if dtype not in taken:
        _check_dtype(op, np.dtype(dtype), reduction)
        taken.add(dtype)


def _check_dtype(op: str, dtype: np.dtype, reduction: str = "sum") -> None:
    """Raise the DTypeError every member raises alike when MPI cannot move (or reduce by `reduction`: "sum",
    "max" or "min") `dtype`, on every engine (the thread and dry engines would move it, and take numpy's
    maximum of complex numbers). Callers on a collective's path go through `_take`'s cache."""
    wide = long_double(dtype)  # a tensor's dtype refuses it alike
    if wide:
        raise DTypeError(f"{op}: {wide}")
    sums = op in ("allreduce", "reduce_scatter")
    if sums and reduction != "sum":  # MPI's MAX and MIN take integers and real floats only
        if dtype.kind in _ORDERED and dtype.isnative or is_low(dtype):  # bfloat16's: float32's
            return
    elif dtype.kind in (_SUMMABLE if sums else _MOVABLE) and dtype.isnative:
        return
    if is_low(dtype) and not sums:  # moved as its 16-bit words (spmdsim.runtime.engines.mpi; the sums of
        return  # bfloat16 are float32's, spmdsim.runtime.collectives)
    if not dtype.isnative:
        raise DTypeError(f"{op}: dtype {dtype.str!r} is not in native byte order; convert the array "
                         f"with .astype({dtype.newbyteorder('=').name!r}) first")
    if sums and reduction != "sum" and dtype.kind in _MOVABLE:
        raise DTypeError(f"{op}: cannot take the {reduction} of dtype {dtype.name!r}; expected an integer or "
                         "real float dtype (bool, complex and text can be moved, not ordered)")
    if sums and dtype.kind in _MOVABLE:
        raise DTypeError(f"{op}: cannot sum dtype {dtype.name!r}; expected an integer, float or "
                         "complex dtype (bool and text can be moved, not summed)")
    raise DTypeError(f"{op}: MPI cannot send dtype {dtype.str!r} ({dtype.name}); expected a numeric "
                     f"dtype: {SUPPORTED_DTYPES}" + ("" if sums else "; or text (numpy's S or U dtypes)"))
