"""The one body every collective runs: its MPI call, with the trace, check and watchdog around it.

`issue` is where runtime.collectives, runtime.exchange and runtime.prepared
reach MPI, by a plain way (the mesh's engine runs the call, nothing before
it) or through the layers of runtime/layers.py (debug hooks or an emulated
algorithm): docs/runtime.md, "One body per collective". The plain way is
kept bare because with 8 ranks on 2 cores each rank runs its pre-MPI Python
on cold caches, in turn, while the group waits. Also here: the argument checks the callers share, which raise
ShapeError or DTypeError before any MPI call.
"""
from __future__ import annotations

from time import perf_counter
from typing import Any, Callable

import numpy as np

from .. import buffers
from ..errors import DTypeError, ShapeError
from ..validate import SUPPORTED_DTYPES, counted
from . import debug
from . import layers
from .layers import Collective
from .mesh import Mesh, normalize_axes
from ..context import current as _context
from .trace import record, record_call

_empty = buffers.empty  # placed in the page for MPI's copies (spmdsim.buffers)
_HOOKS = debug.HOOKS
_ndarray = np.ndarray


def issue(mesh: Mesh, comm: Any, g: int, op: str, axes: Any, label: str | None, calls: Any, blocking: str,
          nonblocking: str, args: tuple, result: Any, x: Any, extra: tuple, nbytes: Any,
          copied: int = 0, t0: float | None = None, then: Callable[[], Any] | None = None,
          counts: tuple | None = None, emulate: bool = True) -> Any:
    """Run one collective over `comm` (g > 1 members) and return `result` (or `then()`).

    Plain (no debug hook on, no ``algorithms=``): the mesh's engine runs the call
    (`Engine.collective`); else the layers of runtime/layers.py do (check, emulated
    algorithm, watchdog). Either way one trace row follows for the rank's open traces.

    Args:
        calls, blocking, nonblocking, args: the object whose methods of those names make the
            call (`comm` with "Allreduce" and "Iallreduce") and their arguments.
        x, extra: what SPMDSIM_CHECK compares: the array (its dtype and shape;
            a dtype alone where shapes differ by rank) and the call's other arguments.
        nbytes: an int n (the trace records moved_bytes(op, g, n) both ways) or (sent, received).
        copied: the bytes packed and unpacked around the MPI call (the trace's bytes_copied).
        t0: when the traced time began (before packing); default: now.
        then: run after the MPI call, inside the traced time (unpacking); its value is returned.
        counts: an Alltoallv's (send, receive) counts: compared with SPMDSIM_CHECK, peers for the trace.
        emulate: False keeps MPI's call on a mesh made with ``algorithms=`` (prepared collectives).
    """
    context = _context()  # the running rank's: its open traces and call counter
    traces = context.traces
    if context.hooks.quiet and mesh.algorithms is None:
        if t0 is None and traces:
            t0 = perf_counter()
        try:  # costs nothing until mpi4py refuses the buffers
            mesh.engine.collective(calls, blocking, nonblocking, args, mesh.polite)
        except Exception:
            _check_dtype(op, x.dtype if type(x) is _ndarray else x)  # a clear error when the dtype is why
            raise
        context.seq += 1
        if then is None and not traces:
            return result
        name = op
    else:
        name, moved, t0 = layers.run(Collective(mesh, comm, op, axes, calls, blocking, nonblocking, args, x,
                                                extra, counts), emulate, t0)
        nbytes = nbytes if moved is None else moved
    if then is not None:
        result = then()
    if traces:
        now = perf_counter()
        record_call(traces, name, axes, g, nbytes, now - t0, label, copied, now, counts)
    return result


def _alone(op: str, axes: Any, label: str | None, dtype: Any) -> None:
    """A collective over a group of one rank: dtype checked (unless None), numbered, traced; nothing sent."""
    if dtype is not None:
        _check_dtype(op, np.dtype(dtype))
    _context().seq += 1
    record(op, normalize_axes(axes), 1, 0, 0, 0.0, label)


def _contig(local: Any) -> np.ndarray:
    # Copy only when MPI could not read the buffer as is.
    if type(local) is _ndarray and local.flags.c_contiguous:
        return local
    return np.ascontiguousarray(local)


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


# dtype kinds MPI moves (numbers, bool, and bytes/str as characters) and the ones it can sum.
_MOVABLE = "biufcSU"
_SUMMABLE = "iufc"


def _check_dtype(op: str, dtype: np.dtype) -> None:
    """Raise the DTypeError every member raises alike when MPI cannot move (or sum) `dtype`.

    The plain way calls it only after mpi4py refused its buffers (the common dtypes pay nothing).
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
