"""Collectives on pieces of unequal sizes: Allgatherv, Reduce_scatter with counts, Alltoallv along dims.

The forms of runtime.collectives' allgather, reduce_scatter and alltoall that
the executor runs when a Layout's uneven cut ("chunk", "balanced") leaves the
members of a group with pieces of different extents along the dim a step cuts
or joins (spmdsim.programs.plan.uneven says which). Each is one engine transfer,
``all_to_allv`` (counts and offsets per member), through runtime.door.issue:
Allgatherv sends the one block to every member (every send offset 0); a
Reduce_scatter with counts sends member j its addend of member j's piece and
sums the g addends that arrive (the direct algorithm: each rank receives g - 1
addends of its own piece). The trace names them after the step kinds
("allgather", "reduce_scatter", "alltoall") with the bytes each rank really
sends and receives; SPMDSIM_CHECK compares their counts over the group.
"""
from __future__ import annotations

import math
from itertools import accumulate
from time import perf_counter
from typing import Any, Sequence

import numpy as np

from ..errors import ShapeError
from ..base.precision import is_low
from ..base.buffers import is_lazy
from .arguments import _contig, _empty
from .door import _alone, issue
from .collectives import _narrowed, _wide32
from .mesh import Mesh

__all__ = ["allgatherv", "reduce_scatterv", "alltoallv_dims"]


def _placed(a: np.ndarray) -> np.ndarray:
    """`a` C-contiguous; a view of a dry run's lazy zeros as new lazy zeros of its shape (its copy wrote every
    page: a --cut chunk redistribution of 16 GiB held 12 GB of this machine's memory)."""
    return _empty(a.shape, a.dtype) if is_lazy(a) else np.ascontiguousarray(a)


def _front(x: np.ndarray, d: int) -> np.ndarray:
    """`x` with dim `d` first, C-contiguous (no copy when nothing of size above one precedes `d`)."""
    return x if d == 0 else _placed(np.moveaxis(x, d, 0))


def _laid(x: np.ndarray, d: int) -> tuple[float, np.ndarray, tuple, int]:
    """(when the traced time begins, `x` with dim `d` first, the other dims, their product)."""
    t0 = perf_counter()
    send = _front(x, d)
    return t0, send, send.shape[1:], math.prod(send.shape[1:])


def _back(front: np.ndarray, d: int) -> np.ndarray:
    return front if d == 0 else _placed(np.moveaxis(front, 0, d))


def _offsets(counts: list[int]) -> list[int]:
    return [0, *accumulate(counts[:-1])]


def _peers(scounts: list[int], rcounts: list[int], me: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The counts SPMDSIM_CHECK compares and the trace counts peers by: a member is not its own peer."""
    return (tuple(0 if j == me else n for j, n in enumerate(scounts)),
            tuple(0 if j == me else n for j, n in enumerate(rcounts)))


def _transfer(mesh: Mesh, axes: Any, label: str | None, op: str, x: np.ndarray, send: np.ndarray,
              counts: tuple[list[int], list[int], list[int], list[int]], recv: np.ndarray, extra: tuple,
              moved: tuple[int, int], t0: float, then: Any) -> np.ndarray:
    """One engine `all_to_allv` on the group over `axes` (send and receive counts and offsets in `counts`),
    traced as `op` with this member's bytes `moved`; `then()` makes the result."""
    comm, g, me = mesh.group_info(axes)
    scounts, sdispls, rcounts, rdispls = counts
    return issue(mesh, comm, g, op, axes, label, mesh.engine.all_to_allv,
                 (send, scounts, sdispls, recv, rcounts, rdispls), None, x.dtype, extra, moved,
                 0 if send is x else x.nbytes, t0, then, _peers(scounts, rcounts, me), emulate=False)


def _checked(x: np.ndarray, d: int, extent: int, op: str) -> None:
    if x.shape[d] != extent:
        raise ShapeError(f"{op}: dim {d} of local shape {x.shape!r} is {x.shape[d]}, expected this member's "
                         f"piece of {extent}")


def allgatherv(mesh: Mesh, local: Any, axes: Any, tensor_dim: int, sizes: Sequence[int],
               label: str | None = None) -> np.ndarray:
    """Every member's `local` joined along `tensor_dim` in group order; member j's piece has extent `sizes[j]`."""
    _, g, me = mesh.group_info(axes)
    x = _contig(local)
    _checked(x, tensor_dim, sizes[me], "allgatherv")
    if g == 1:
        _alone("allgather", axes, label, x.dtype)
        return x
    t0, send, rest, row = _laid(x, tensor_dim)
    rcounts = [int(s) * row for s in sizes]
    recv = _empty((sum(rcounts),), x.dtype)
    scounts = [send.size] * g

    def joined() -> np.ndarray:
        return _back(recv.reshape((sum(sizes),) + rest), tensor_dim)
    return _transfer(mesh, axes, label, "allgather", x, send, (scounts, [0] * g, rcounts, _offsets(rcounts)),
                     recv, (tensor_dim, tuple(sizes)), ((g - 1) * x.nbytes, recv.nbytes - x.nbytes), t0, joined)


def reduce_scatterv(mesh: Mesh, local: Any, axes: Any, tensor_dim: int, sizes: Sequence[int],
                    label: str | None = None) -> np.ndarray:
    """The sum over the group of `local`, keeping this member's piece along `tensor_dim` (member j's: `sizes[j]`)."""
    _, g, me = mesh.group_info(axes)
    x = _contig(local)
    _checked(x, tensor_dim, sum(sizes), "reduce_scatterv")
    if is_low(x.dtype):  # no bfloat16 sum in MPI: summed in float32, rounded once
        total = reduce_scatterv(mesh, _wide32(mesh, x), axes, tensor_dim, sizes, label)
        return _narrowed(mesh, total, x.dtype, None, "reduce_scatterv")
    if g == 1:
        _alone("reduce_scatter", axes, label, x.dtype)
        return x
    t0, send, rest, row = _laid(x, tensor_dim)
    scounts = [int(s) * row for s in sizes]
    own = scounts[me]
    recv = _empty((g * own,), x.dtype)

    def summed() -> np.ndarray:  # in the operands' dtype, as MPI sums (numpy's sum widens int32 to int64)
        return _back(recv.reshape((g, sizes[me]) + rest).sum(axis=0, dtype=x.dtype), tensor_dim)
    itemsize = x.dtype.itemsize
    moved = ((send.size - own) * itemsize, (g - 1) * own * itemsize)
    return _transfer(mesh, axes, label, "reduce_scatter", x, send,
                     (scounts, _offsets(scounts), [own] * g, [j * own for j in range(g)]), recv,
                     (tensor_dim, tuple(sizes)), moved, t0, summed)


def alltoallv_dims(mesh: Mesh, local: Any, axes: Any, split_dim: int, concat_dim: int,
                   split_sizes: Sequence[int], concat_sizes: Sequence[int], label: str | None = None) -> np.ndarray:
    """Cut `local` along `split_dim` into pieces of `split_sizes` (member order), send piece j to member j, and
    join what arrives along `concat_dim` (member j's has extent `concat_sizes[j]` there)."""
    _, g, me = mesh.group_info(axes)
    x = _contig(local)
    _checked(x, split_dim, sum(split_sizes), "alltoallv")
    _checked(x, concat_dim, concat_sizes[me], "alltoallv")
    if g == 1:
        _alone("alltoall", axes, label, x.dtype)
        return x
    t0, send, _, row = _laid(x, split_dim)
    scounts = [int(s) * row for s in split_sizes]
    # Member j's piece: this member's split extent, member j's extent along concat_dim.
    shapes = []
    for j in range(g):
        shape = list(x.shape)
        shape[split_dim], shape[concat_dim] = split_sizes[me], concat_sizes[j]
        shapes.append(tuple(shape))
    rcounts = [math.prod(s) for s in shapes]
    rdispls = _offsets(rcounts)
    recv = _empty((sum(rcounts),), x.dtype)

    def joined() -> np.ndarray:
        if is_lazy(recv):  # a dry run's zeros: lazy zeros of the joined shape (the join wrote every page)
            return _empty(shapes[me][:concat_dim] + (sum(concat_sizes),) + shapes[me][concat_dim + 1:], x.dtype)
        pieces = []
        for shape, lo, n in zip(shapes, rdispls, rcounts):
            front = (shape[split_dim],) + shape[:split_dim] + shape[split_dim + 1:]
            pieces.append(np.moveaxis(recv[lo:lo + n].reshape(front), 0, split_dim))
        return np.ascontiguousarray(np.concatenate(pieces, axis=concat_dim))
    kept = scounts[me] * x.dtype.itemsize
    return _transfer(mesh, axes, label, "alltoall", x, send, (scounts, _offsets(scounts), rcounts, rdispls), recv,
                     (split_dim, concat_dim, tuple(split_sizes), tuple(concat_sizes)),
                     (x.nbytes - kept, recv.nbytes - kept), t0, joined)


# Each is one recorded call when a rank captures a step (spmdsim.runtime.replay), as runtime.collectives' are.
from .replay import kernel as _kernel  # noqa: E402

allgatherv, reduce_scatterv, alltoallv_dims = (_kernel(f) for f in (allgatherv, reduce_scatterv, alltoallv_dims))
