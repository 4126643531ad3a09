"""Prepared collectives: checked once, bound to fixed buffers, then run many times (docs/runtime.md).

A prepared collective validates shapes once and builds an MPI-4 persistent
request (`Allreduce_init`, ...); each `run()` is then `Start`, the mesh's wait
and one trace entry, sparing the ~2 us of per-call checks that 8 ranks on 2
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

from typing import Any, Iterable

import numpy as np
from mpi4py import MPI

from ..errors import ShapeError
from ..plan.steps import moved_bytes
from ._calls import _alone, _check_dtype, _contig, _dim, _divisible, _result, issue, normalize_axes
from .mesh import Mesh

__all__ = ["Prepared", "prepare_allreduce", "prepare_allgather", "prepare_reduce_scatter",
           "prepare_alltoall"]


class _Done:
    """The request of a call that already completed (a blocking call in place of a persistent one)."""

    __slots__ = ()

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        return True

    def Wait(self) -> None:  # noqa: N802 - mpi4py's name
        return None


_DONE = _Done()


class Prepared:
    """One collective on fixed buffers; `run()` performs it and returns the result array."""

    __slots__ = ("mesh", "op", "axes", "group_size", "result", "label", "_send", "_extra",
                 "_comm", "_request", "_blocking", "_args", "_bytes", "_copy")

    def __init__(self, mesh: Mesh, op: str, axes: tuple[str, ...], comm: Any, group_size: int,
                 send: np.ndarray, result: np.ndarray, extra: tuple, blocking: Any, persistent: Any,
                 args: tuple, label: str | None) -> None:
        self.mesh, self.op, self.axes, self.label = mesh, op, axes, label
        self._comm, self.group_size = comm, group_size
        self._send, self.result, self._extra = send, result, extra
        # MPI's blocking call and its three arguments (the third None for a call of two).
        self._blocking, self._args = blocking, args
        moved = moved_bytes(op, group_size, send.nbytes)
        self._bytes = (moved, moved)
        # A group of one rank communicates nothing; the result is the input.
        self._copy = self.group_size == 1 and result is not send
        self._request = None
        _check_dtype(op, send.dtype)  # before MPI binds the buffers: the same error on every member
        if self.group_size > 1 and persistent is not None:
            try:
                self._request = persistent(*args)
            except NotImplementedError:  # MPI older than 4.0: no persistent collectives
                self._request = None

    def run(self) -> np.ndarray:
        """Perform the collective on the bound buffers (every member calls it alike)."""
        g = self.group_size
        if g == 1:
            _alone(self.op, self.axes, self.label, self._send.dtype)
            if self._copy:
                self.result[...] = self._send
            return self.result
        # The blocking call with its checks done once, or the persistent request.
        calls = ("_blocking", "_blocking_done") if self._request is None else ("_start_wait", "_start")
        return issue(self.mesh, self._comm, g, self.op, self.axes, self.label, self, *calls,
                     self._args, self.result, self._send, self._extra, self._bytes, emulate=False)

    def _start(self, *args: Any) -> Any:
        self._request.Start()
        return self._request

    def _start_wait(self, *args: Any) -> None:
        self._request.Start()
        self._request.Wait()

    def _blocking_done(self, *args: Any) -> _Done:
        self._blocking(*args)
        return _DONE

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
    send = MPI.IN_PLACE if in_place else x
    return Prepared(mesh, "allreduce", axes, comm, g, x, result, (), comm.Allreduce, comm.Allreduce_init,
                    (send, result, MPI.SUM), label)


def prepare_allgather(mesh: Mesh, local: Any, axes: str | Iterable[str], tensor_dim: int,
                      out: np.ndarray | None = None, label: str | None = None) -> Prepared:
    """Every member's `local` concatenated along `tensor_dim` in group order."""
    axes, comm, g, x, d = _bind(mesh, local, axes, tensor_dim, "allgather", divisible=False)
    result = _result(out, x.shape[:d] + (x.shape[d] * g,) + x.shape[d + 1:], x.dtype, "allgather")
    return Prepared(mesh, "allgather", axes, comm, g, x, result, (d,), comm.Allgather, comm.Allgather_init,
                    (x, result), label)


def prepare_reduce_scatter(mesh: Mesh, local: Any, axes: str | Iterable[str], tensor_dim: int,
                           out: np.ndarray | None = None, label: str | None = None) -> Prepared:
    """Sum over the group, keeping this member's block along `tensor_dim`."""
    axes, comm, g, x, d = _bind(mesh, local, axes, tensor_dim, "reduce_scatter", divisible=True)
    result = _result(out, x.shape[:d] + (x.shape[d] // g,) + x.shape[d + 1:], x.dtype,
                     "reduce_scatter")
    # No persistent request: MPICH runs persistent (like nonblocking) Reduce_scatter_block with a slower
    # schedule than the blocking call (1.11x at 1 MiB, 8 ranks); the blocking call with checks done once wins.
    return Prepared(mesh, "reduce_scatter", axes, comm, g, x, result, (d,), comm.Reduce_scatter_block, None,
                    (x, result, MPI.SUM), label)


def prepare_alltoall(mesh: Mesh, local: Any, axes: str | Iterable[str], tensor_dim: int,
                     out: np.ndarray | None = None, label: str | None = None) -> Prepared:
    """Block j of `local` along `tensor_dim` to member j; received blocks joined along the same dim."""
    axes, comm, g, x, d = _bind(mesh, local, axes, tensor_dim, "alltoall", divisible=True)
    result = _result(out, x.shape, x.dtype, "alltoall")
    return Prepared(mesh, "alltoall", axes, comm, g, x, result, (d, d), comm.Alltoall, comm.Alltoall_init,
                    (x, result), label)
