"""Prepared collectives: checked once, bound to fixed buffers, then run many times (docs/explanation/runtime.md).

A prepared collective validates shapes once and asks the engine for a
persistent request (MPI-4's `Allreduce_init`, ...); each `run()` is then
`Start`, the mesh's wait and one trace entry, sparing the ~2 us of per-call checks that 8 ranks on 2
cores amplify to 5-10% of a 1 MiB call. Without persistent collectives (and
for reduce_scatter, whose persistent form MPICH runs more slowly) `run()`
makes the blocking call instead, its checks already done.

    step = prepare_allreduce(mesh, grads, ("dp",), out=grads)   # in place
    for _ in range(steps):
        ...                     # refill `grads`
        step.run()
    step.free()
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

import numpy as np
from ..errors import ShapeError
from ..programs.plan.steps import moved_bytes
from .engines import DONE
from .axes import normalize_axes
from .arguments import _contig, _dim, _divisible, _result, _take
from .door import _alone, issue
from .mesh import Mesh
from .replay import unrecorded

__all__ = ["Prepared", "prepare_allreduce", "prepare_allgather", "prepare_reduce_scatter",
           "prepare_alltoall"]


class Prepared:
    """One collective on fixed buffers; `run()` performs it and returns the result array."""

    __slots__ = ("mesh", "op", "axes", "group_size", "result", "label", "_send", "_extra",
                 "_comm", "_request", "_transfer", "_args", "_bytes", "_copy")

    def __init__(self, mesh: Mesh, op: str, axes: tuple[str, ...], comm: Any, group_size: int,
                 send: np.ndarray, result: np.ndarray, extra: tuple, transfer: Callable[..., None],
                 persistent: bool, args: tuple, label: str | None) -> None:
        self.mesh, self.op, self.axes, self.label = mesh, op, axes, label
        self._comm, self.group_size = comm, group_size
        self._send, self.result, self._extra = send, result, extra
        # The engine's transfer (``mesh.engine.all_reduce``, ...) and its arguments.
        self._transfer, self._args = transfer, args
        moved = moved_bytes(op, group_size, send.nbytes)
        self._bytes = (moved, moved)
        # A group of one rank communicates nothing; the result is the input.
        self._copy = self.group_size == 1 and result is not send
        self._request = None
        _take(op, send.dtype)  # before MPI binds the buffers: the same error on every member
        if self.group_size > 1 and persistent:  # None where the engine has none (MPI older than 4.0)
            self._request = mesh.engine.persistent(transfer, comm, args)

    def run(self) -> np.ndarray:
        """Perform the collective on the bound buffers (every member calls it alike)."""
        unrecorded(f"a prepared {self.op}")
        g = self.group_size
        if g == 1:
            _alone(self.op, self.axes, self.label, self._send.dtype)
            if self._copy:
                self.result[...] = self._send
            return self.result
        # The blocking transfer with its checks done once, or the persistent request.
        return issue(self.mesh, self._comm, g, self.op, self.axes, self.label,
                     self._blocking if self._request is None else self._start, self._args,
                     self.result, self._send, self._extra, self._bytes, emulate=False)

    def _start(self, comm: Any, *args: Any) -> None:
        """Start the persistent request; `args[-1]`, the wait, completes it (None: its own Wait)."""
        self._request.Start()
        if args[-1] is None:
            self._request.Wait()
        else:
            args[-1](self._request)

    def _blocking(self, comm: Any, *args: Any) -> None:
        """The engine's blocking transfer (its nonblocking form runs a slower schedule in MPICH); a
        wait given (the watchdog's) sees a completed request."""
        self._transfer(comm, *args[:-1], None)
        if args[-1] is not None:
            args[-1](DONE)

    def free(self) -> None:
        """Release the persistent request (also on leaving a `with` block)."""
        if self._request is not None:
            self._request.Free()
            self._request = None

    def __enter__(self) -> "Prepared":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()


def _bind(mesh: Mesh, local: Any, axes: str | Iterable[str], tensor_dim: int, what: str,
          divisible: bool) -> tuple[tuple[str, ...], Any, int, np.ndarray, int]:
    """(axes, comm, group size, buffer, dim) for a collective along `tensor_dim`, checked."""
    axes = normalize_axes(axes)
    comm, g, _ = mesh.group_info(axes)
    x = _contig(local)
    d = _dim(tensor_dim, x.ndim, "tensor_dim")
    if divisible:
        _divisible(x.shape, d, g, what)
    # Prepared calls bind the caller's buffers as they are; blocks along a dim
    # with data before it would need a packing copy on every run.
    if d != 0 and int(np.prod(x.shape[:d])) != 1:
        raise ShapeError(f"prepared {what} needs tensor dim {d} of local shape "
                         f"{x.shape!r} to be the leading non-trivial dim; use collectives.{what}")
    return axes, comm, g, x, d


def prepare_allreduce(mesh: Mesh, local: Any, axes: str | Iterable[str], out: np.ndarray | None = None,
                      label: str | None = None) -> Prepared:
    """Sum of `local` over the group into `out` (a new array; ``out=local`` sums in place)."""
    axes = normalize_axes(axes)
    comm, g, _ = mesh.group_info(axes)
    x = _contig(local)
    in_place = out is x
    result = _result(out, x.shape, x.dtype, "allreduce")
    return Prepared(mesh, "allreduce", axes, comm, g, x, result, (), mesh.engine.all_reduce, True,
                    (result if in_place else x, result, "sum"), label)


def prepare_allgather(mesh: Mesh, local: Any, axes: str | Iterable[str], tensor_dim: int,
                      out: np.ndarray | None = None, label: str | None = None) -> Prepared:
    """Every member's `local` concatenated along `tensor_dim` in group order."""
    axes, comm, g, x, d = _bind(mesh, local, axes, tensor_dim, "allgather", divisible=False)
    result = _result(out, x.shape[:d] + (x.shape[d] * g,) + x.shape[d + 1:], x.dtype, "allgather")
    return Prepared(mesh, "allgather", axes, comm, g, x, result, (d,), mesh.engine.all_gather, True, (x, result), label)


def prepare_reduce_scatter(mesh: Mesh, local: Any, axes: str | Iterable[str], tensor_dim: int,
                           out: np.ndarray | None = None, label: str | None = None) -> Prepared:
    """Sum over the group, keeping this member's block along `tensor_dim`."""
    axes, comm, g, x, d = _bind(mesh, local, axes, tensor_dim, "reduce_scatter", divisible=True)
    result = _result(out, x.shape[:d] + (x.shape[d] // g,) + x.shape[d + 1:], x.dtype,
                     "reduce_scatter")
    # No persistent request: MPICH runs persistent (like nonblocking) Reduce_scatter_block with a slower
    # schedule than the blocking call (1.11x at 1 MiB, 8 ranks); the blocking call with checks done once wins.
    return Prepared(mesh, "reduce_scatter", axes, comm, g, x, result, (d,), mesh.engine.reduce_scatter, False,
                    (x, result, "sum"), label)


def prepare_alltoall(mesh: Mesh, local: Any, axes: str | Iterable[str], tensor_dim: int,
                     out: np.ndarray | None = None, label: str | None = None) -> Prepared:
    """Block j of `local` along `tensor_dim` to member j; received blocks joined along the same dim."""
    axes, comm, g, x, d = _bind(mesh, local, axes, tensor_dim, "alltoall", divisible=True)
    result = _result(out, x.shape, x.dtype, "alltoall")
    return Prepared(mesh, "alltoall", axes, comm, g, x, result, (d, d), mesh.engine.all_to_all,
                    True, (x, result), label)
