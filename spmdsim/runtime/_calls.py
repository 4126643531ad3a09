"""What every collective call does around its MPI call: argument checks, numbering, the wait.

Shared by the regular collectives (runtime.collectives), the whole-mesh
exchanges (runtime.exchange) and the prepared collectives (runtime.prepared):
checks of tensor dims and result buffers that raise `ShapeError` before any
MPI call, the per-rank byte figures the trace records, the call's sequence
number with runtime.debug's divergence guard, and the mesh's wait mode
(with the watchdog when it is on).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import buffers
from ..errors import DTypeError, ShapeError
from ..validate import SUPPORTED_DTYPES, counted
from . import debug
from .mesh import Mesh, normalize_axes
from .wait import polite_wait

__all__ = ["moved_bytes", "normalize_axes"]

_empty = buffers.empty  # placed in the page for MPI's copies (spmdsim.buffers)
# debug's settings and call counter, read without a call on the hot paths
# (what debug.quiet() and debug.next_seq() read and advance).
_DEBUG = debug._State

def _contig(local: Any) -> np.ndarray:
    # Copy only when MPI could not read the buffer as is.
    if type(local) is np.ndarray and local.flags.c_contiguous:
        return local
    return np.ascontiguousarray(local)


def _dim(tensor_dim: int, ndim: int, what: str) -> int:
    if isinstance(tensor_dim, bool) or not isinstance(tensor_dim, (int, np.integer)):
        raise ShapeError(f"{what} {tensor_dim!r} must be an integer tensor dim (0 <= dim < {ndim})")
    if not -ndim <= tensor_dim < ndim:
        raise ShapeError(f"{what} {tensor_dim!r} is out of range for an array with {counted(ndim, 'dim')}")
    return tensor_dim % ndim


def _divisible(shape: tuple[int, ...], tensor_dim: int, g: int, op: str) -> None:
    if shape[tensor_dim] % g:
        raise ShapeError(
            f"{op}: dim {tensor_dim} of local shape {shape!r} is not divisible by group size {g}"
        )


def moved_bytes(op: str, group_size: int, local_nbytes: int) -> int:
    """Bytes one member sends (and receives) in `op` over a group, as the trace records them.

    Ring-algorithm figures (docs/runtime.md): allgather (g-1)*n of an n-byte
    input; alltoall and reduce_scatter (g-1)/g of the input; allreduce twice that.
    """
    g, n = group_size, local_nbytes
    if op == "allgather":
        return (g - 1) * n
    if op in ("alltoall", "reduce_scatter"):
        return (g - 1) * n // g
    if op == "allreduce":
        return 2 * (g - 1) * n // g
    raise ValueError(f"no byte formula for {op!r}")


def _result(out: np.ndarray | None, shape: tuple, dtype: np.dtype, op: str) -> np.ndarray:
    """A new result array, or the caller's `out` after checking it can take the result."""
    if out is None:
        return _empty(shape, dtype)
    if not (type(out) is np.ndarray and out.shape == shape and out.dtype == dtype
            and out.flags.c_contiguous and out.flags.writeable):
        got = (getattr(out, "shape", None), getattr(getattr(out, "dtype", None), "name", None))
        raise ShapeError(f"{op}: out {got!r} must be a writeable C-contiguous array of "
                         f"{(shape, np.dtype(dtype).name)!r}")
    return out


def _copy_into(out: np.ndarray, x: np.ndarray, op: str) -> np.ndarray:
    _result(out, x.shape, x.dtype, op)[...] = x
    return out


# dtype kinds MPI moves (numbers, bool, and bytes/str as characters) and the ones it can sum.
_MOVABLE = "biufcSU"
_SUMMABLE = "iufc"


def _check_dtype(op: str, dtype: np.dtype) -> None:
    """Raise the ShapeError every member raises alike when MPI cannot move (or sum) `dtype`.

    Called before the generic paths' MPI call, and by the lean paths only after
    mpi4py refused their buffers (the common dtypes pay nothing for it).
    """
    sums = op in ("allreduce", "reduce_scatter")
    if dtype.kind in (_SUMMABLE if sums else _MOVABLE) and dtype.isnative:
        return
    if not dtype.isnative:
        raise DTypeError(f"{op}: dtype {dtype.str!r} is not in native byte order; convert the array "
                         f"with .astype({dtype.newbyteorder('=').name!r}) first")
    if sums and dtype.kind in _MOVABLE:
        raise DTypeError(f"{op}: cannot sum dtype {dtype.name!r}; expected an integer, float or "
                         "complex dtype (bool and text can be moved, not summed)")
    raise DTypeError(f"{op}: MPI cannot send dtype {dtype.str!r} ({dtype.name}); expected a numeric "
                     f"dtype: {SUPPORTED_DTYPES}")


def _begin(mesh: Mesh, comm: Any, g: int, op: str, axes: Any, x: Any, extra: tuple,
           dtype: Any = None) -> int:
    """Number this call; with SPMDSIM_CHECK, compare it with the group's before communicating.

    Refuses a dtype MPI cannot take first, on every member alike.
    """
    if type(x) is np.ndarray:
        _check_dtype(op, x.dtype)
    elif dtype is not None:
        _check_dtype(op, np.dtype(dtype))
    _DEBUG.seq += 1  # what debug.next_seq() does, without the call (see the lean paths)
    seq = _DEBUG.seq
    if _DEBUG.quiet:
        return seq
    if g > 1 and debug.check_enabled():
        shape = None if x is None else np.shape(x)
        debug.verify(comm, op, normalize_axes(axes), dtype if x is None else np.asarray(x).dtype,
                     shape, extra, seq, mesh.polite)
    return seq


def _run(mesh: Mesh, seq: int, op: str, axes: Any, blocking: Any, nonblocking: Any, *args: Any) -> None:
    """Run one collective with the mesh's wait mode (and the watchdog when it is on)."""
    if not _DEBUG.quiet and debug.watchdog_seconds() is not None:
        # The bound method's communicator: the watchdog asks that group who is missing.
        debug.wait(nonblocking(*args), op, normalize_axes(axes), seq, mesh.polite,
                   comm=getattr(nonblocking, "__self__", None))
    elif mesh.polite:
        polite_wait(nonblocking(*args))
    else:
        blocking(*args)
