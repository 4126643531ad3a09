"""Per-rank local work of plan steps, shared by the emulator and the MPI executor.

Pure numpy: cutting, zero-padding, and packing/unpacking the boxes of an Exchange.
"""
from __future__ import annotations

import numpy as np

from .steps import Exchange, LocalSlice, LocalZero
from .volume import Box, box_size, intersect, rank_boxes

__all__ = [
    "local_slice",
    "local_zero",
    "exchange_sends",
    "exchange_recv_shapes",
    "exchange_assemble",
    "box_in",
]


def box_in(box: Box, origin: Box) -> tuple[slice, ...]:
    """Local index of global `box` inside an array whose global box is `origin`."""
    return tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(box, origin))


def local_slice(step: LocalSlice, rank: int, local: np.ndarray, shape: tuple) -> np.ndarray:
    """The part of `local` this rank keeps (a contiguous copy)."""
    before = rank_boxes(step.before, shape)[rank]
    after = rank_boxes(step.after, shape)[rank]
    return np.ascontiguousarray(local[box_in(after, before)])


def local_zero(step: LocalZero, rank: int, local: np.ndarray, shape: tuple) -> np.ndarray:
    """Zero-padded block: one replica per new partial group keeps its values."""
    before = rank_boxes(step.before, shape)[rank]
    after = rank_boxes(step.after, shape)[rank]
    out = np.zeros(tuple(b - a for a, b in after), dtype=local.dtype)
    layout = step.before.layout
    # Axes that were split keep every rank's own block; replicated ones keep index 0 only.
    replicated = [a for a in step.axes if a not in step.before.split_axes]
    if layout.group_index(rank, replicated) == 0:
        out[box_in(before, after)] = local
    return out


def exchange_sends(step: Exchange, rank: int, local: np.ndarray, shape: tuple) -> dict:
    """Per destination rank, the box of `local` this rank sends it (a view: alltoallv packs it once)."""
    origin = rank_boxes(step.before, shape)[rank]
    return {dst: local[box_in(box, origin)] for src, dst, box in step.transfers if src == rank}


def exchange_recv_shapes(step: Exchange, rank: int) -> dict:
    """Per source rank, the flat shape of the buffer this rank receives from it."""
    return {src: (box_size(box),) for src, dst, box in step.transfers if dst == rank}


def exchange_assemble(
    step: Exchange, rank: int, local: np.ndarray, received: dict, shape: tuple
) -> np.ndarray:
    """This rank's new block: its own overlap copied, the rest from `received` (by source)."""
    before = rank_boxes(step.before, shape)[rank]
    after = rank_boxes(step.after, shape)[rank]
    out = np.empty(tuple(b - a for a, b in after), dtype=local.dtype)
    common = intersect(before, after)
    if common is not None:
        out[box_in(common, after)] = local[box_in(common, before)]
    for src, dst, box in step.transfers:
        if dst == rank:
            out[box_in(box, after)] = np.asarray(received[src]).reshape(
                tuple(b - a for a, b in box)
            )
    return out
