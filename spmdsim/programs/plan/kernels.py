"""Per-rank local work of plan steps, shared by the emulator and the MPI executor.

Pure numpy: cutting, zero-padding, and packing/unpacking the boxes of an Exchange.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ...base import buffers
from .steps import Exchange, LocalSlice, LocalZero
from .volume import Box, box_shape, intersect, rank_boxes

__all__ = ["local_slice", "local_zero", "exchange_program", "ExchangeProgram", "box_in"]


def box_in(box: Box, origin: Box) -> tuple[slice, ...]:
    """Local index of global `box` inside an array whose global box is `origin`."""
    return tuple(slice(a - o, b - o) for (a, b), (o, _) in zip(box, origin))


def local_slice(step: LocalSlice, rank: int, local: np.ndarray, shape: tuple) -> np.ndarray:
    """The part of `local` this rank keeps (a contiguous copy)."""
    before = rank_boxes(step.before, shape)[rank]
    after = rank_boxes(step.after, shape)[rank]
    return buffers.placed_copy(local[box_in(after, before)])


def local_zero(step: LocalZero, rank: int, local: np.ndarray, shape: tuple) -> np.ndarray:
    """Zero-padded block: one replica per new partial group keeps its values."""
    before = rank_boxes(step.before, shape)[rank]
    after = rank_boxes(step.after, shape)[rank]
    out = buffers.zeros(box_shape(after), local.dtype)
    layout = step.before.layout
    # Axes that were split keep every rank's own block; replicated ones keep index 0 only.
    replicated = [a for a in step.axes if a not in step.before.split_axes]
    if layout.group_index(rank, replicated) == 0 and not (buffers.is_lazy(out) and buffers.is_lazy(local)):
        out[box_in(before, after)] = local  # (a dry run's zeros onto its zeros: nothing to write)
    return out


@dataclass(frozen=True, eq=False)
class ExchangeProgram:
    """One rank's part of an Exchange with its boxes worked out once (`exchange_program`).

    sends: (destination, index into the local block, box shape) per outgoing
    box; out_shape: the new block; own: (index in the new block, index in the
    old) of the overlap this rank keeps, or None; places: (source, index in the
    new block, box shape) per incoming box.
    """

    sends: tuple[tuple[int, tuple[slice, ...], tuple[int, ...]], ...]
    out_shape: tuple[int, ...]
    own: tuple[tuple[slice, ...], tuple[slice, ...]] | None
    places: tuple[tuple[int, tuple[slice, ...], tuple[int, ...]], ...]

    def send_views(self, local: np.ndarray) -> dict:
        """Per destination rank, the box of `local` it gets (a view: alltoallv packs it once)."""
        return {dst: local[index] for dst, index, _ in self.sends}

    def assemble(self, local: np.ndarray, pieces: Iterable[np.ndarray]) -> np.ndarray:
        """The new block: the overlap kept from `local`, then one received piece per place, in order."""
        out = buffers.empty(self.out_shape, local.dtype)
        lazy = buffers.is_lazy(out)  # a dry run's zeros copied onto its zeros: no page written (4 GiB took 10 s)
        if self.own is not None and not (lazy and buffers.is_lazy(local)):
            out[self.own[0]] = local[self.own[1]]
        for (_, index, extent), piece in zip(self.places, pieces):
            piece = np.asarray(piece)
            if not (lazy and buffers.is_lazy(piece)):
                out[index] = piece.reshape(extent)
        return out


def exchange_program(step: Exchange, rank: int, shape: tuple) -> ExchangeProgram:
    """`rank`'s sends, receives and assembly for `step` on a tensor of `shape`."""
    before = rank_boxes(step.before, shape)[rank]
    after = rank_boxes(step.after, shape)[rank]
    common = intersect(before, after)
    transfers = step.transfers
    if hasattr(transfers, "sends"):  # a folded exchange works out this rank's boxes alone
        sends, receives = transfers.sends(rank), transfers.receives(rank)
    else:
        sends = [t for t in transfers if t.src == rank]
        receives = [t for t in transfers if t.dst == rank]
    return ExchangeProgram(
        sends=tuple((dst, box_in(box, before), box_shape(box)) for _, dst, box, _, _ in sends),
        out_shape=box_shape(after),
        own=None if common is None else (box_in(common, after), box_in(common, before)),
        places=tuple((src, box_in(box, after), box_shape(box)) for src, _, box, _, _ in receives),
    )
