"""Steps on shards of unequal sizes (Layout cut "chunk" or "balanced"): which can run, and their bytes.

Pure numpy. Under an uneven cut the pieces of one split need not nest inside
the pieces of a coarser split of the same dim (7 rows in 2 chunks: [0, 4),
[4, 7); in 4 chunks: [0, 2), [2, 4), [4, 6), [6, 7): nested; 10 in 2 and 4
balanced pieces: [0, 5) and [0, 3), [3, 6): not). A collective step moves data
only inside its group, so it can serve a move only when the group's pieces
tile the block they make up: `check_fits` says so or raises ShapeError (the
planner then skips that candidate; the exchange, which moves any box to any
rank, always fits). Bytes per rank follow the variable-count collectives
(Allgatherv, Reduce_scatter with counts, Alltoallv) and equal the even
formulas of spmdsim.programs.plan.steps when the pieces are equal.

A `step` here is one of spmdsim.programs.plan.steps (which calls `sized_uneven` and so sits above this module):
read for its ``op``, ``before``/``after`` layouts, ``axes``, ``group_size``, ``moved`` and the dims it cuts.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from ...errors import ShapeError
from .volume import Box, box_size, intersect, rank_boxes

__all__ = ["is_uneven", "check_fits", "sized_uneven", "group_pieces"]


def is_uneven(step: Any, shape: tuple) -> bool:
    """Whether `step`'s shards differ in size between ranks for a tensor of `shape`."""
    return bool(step.before.uneven_dims(shape) or step.after.uneven_dims(shape))


def _within(inner: Box, outer: Box) -> bool:
    return all(a <= c and d <= b for (a, b), (c, d) in zip(outer, inner))


def _tiles(pieces: list, whole: tuple) -> bool:
    """Whether the ranges `pieces` (in group order) lie side by side and make up range `whole`."""
    at = whole[0]
    for lo, hi in pieces:
        if hi == lo:
            continue
        if lo != at:
            return False
        at = hi
    return at == whole[1]


@lru_cache(maxsize=1024)
def _groups(layout, axes: tuple) -> tuple:
    return layout.axis_groups(axes)


def _refuse(step: Any, shape: tuple, why: str) -> None:
    raise ShapeError(f"{step} cannot move shards of shape {shape!r} cut {step.before.layout.cut!r}: {why}")


def check_fits(step: Any, shape: tuple) -> None:
    """Raise ShapeError unless `step` can run on the (uneven) shards of `shape`."""
    if step.op == "allreduce":
        return  # the members of a group hold the same box
    before, after = rank_boxes(step.before, shape), rank_boxes(step.after, shape)
    if step.op == "local_slice":
        if not all(_within(a, b) for a, b in zip(after, before)):
            _refuse(step, shape, "a rank's new shard is not inside its old one")
        return
    groups = _groups(step.before.layout, tuple(a for a in step.axes if a in step.before.split_axes)
                     if step.op == "local_zero" else step.axes)
    for members in groups:
        for r in members:
            if step.op == "local_zero" or step.op == "allgather":
                # The members' old pieces make up each member's new block.
                if not all(_within(before[q], after[r]) for q in members) or \
                        sum(box_size(before[q]) for q in members) != box_size(after[r]):
                    _refuse(step, shape, "the group's shards do not make up the gathered block")
            elif step.op == "reduce_scatter":
                if not all(_within(after[q], before[r]) for q in members) or \
                        sum(box_size(after[q]) for q in members) != box_size(before[r]):
                    _refuse(step, shape, "the group's new shards do not cut up the summed block")
            elif step.op == "alltoall":
                i, j = step.concat_dim, step.split_dim
                if not _tiles([after[q][j] for q in members], before[r][j]) or \
                        not _tiles([before[q][i] for q in members], after[r][i]):
                    _refuse(step, shape, "the group's pieces do not line up along the split and joined dims")
            else:
                _refuse(step, shape, "no uneven form of this step")


def sized_uneven(step: Any, shape: tuple, itemsize: int) -> Any:
    """`step` with every rank's bytes for the uneven shards of `shape` (after `check_fits`)."""
    check_fits(step, shape)
    before, after = rank_boxes(step.before, shape), rank_boxes(step.after, shape)
    g = step.group_size
    sent, received = [], []
    for b, a in zip(before, after):
        nb, na = box_size(b), box_size(a)
        if step.op == "allgather":
            s, r = (g - 1) * nb, na - nb  # own piece to the g-1 others; the others' pieces
        elif step.op == "alltoall":
            common = intersect(a, b)
            kept = 0 if common is None else box_size(common)
            s, r = nb - kept, na - kept
        elif step.op == "reduce_scatter":
            s, r = nb - na, (g - 1) * na  # its addends of the others' pieces; g-1 addends of its own
        elif step.op == "allreduce":  # in bytes, as the even formula and the trace take it (not elements)
            sent.append(step.moved(g, nb * itemsize))
            received.append(sent[-1])
            continue
        else:
            s = r = 0
        sent.append(s * itemsize)
        received.append(r * itemsize)
    return replace(step, bytes_sent=tuple(sent), bytes_received=tuple(received))


def group_pieces(step: Any, shape: tuple, rank: int) -> tuple:
    """What `rank` runs `step` with on uneven shards: per member of its group (group order), the
    extent of that member's piece along the dim the step cuts or joins.

    Allgather: each member's old extent on `tensor_dim`; ReduceScatter: each member's new extent on
    `tensor_dim`; Alltoall: (each member's new extent on `split_dim`, its old extent on `concat_dim`).
    """
    members = next(m for m in _groups(step.before.layout, step.axes) if rank in m)
    before, after = rank_boxes(step.before, shape), rank_boxes(step.after, shape)

    def extent(box: Box, d: int) -> int:
        return box[d][1] - box[d][0]
    if step.op == "allgather":
        return tuple(extent(before[q], step.tensor_dim) for q in members)
    if step.op == "reduce_scatter":
        return tuple(extent(after[q], step.tensor_dim) for q in members)
    if step.op == "alltoall":
        return (tuple(extent(after[q], step.split_dim) for q in members),
                tuple(extent(before[q], step.concat_dim) for q in members))
    raise ShapeError(f"{step} has no pieces per member")
