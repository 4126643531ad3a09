"""Rows moved along one tensor dim between two layouts: a slice of a split dim, and its gradient (pure).

A `Shift` says ``after[..., i, ...] = before[..., i + offset, ...]`` along
`dim`, rows outside `before` being zeros. `before` and `after` lie on one
device matrix and agree on every other dim and on their pending sums; only
`dim`'s entry differs (or not). ``narrow(x, dim, start, n)`` of a split dim is
the shift by ``start`` onto a layout of the shorter dim, and its gradient the
shift by ``-start`` back.

Each rank takes a row from the one rank that holds it among the ranks that
differ from it only on `before`'s axes of `dim` (those split the dim, so
exactly one of them holds each row; the others coordinates, pending sums
included, stay its own). So every rank receives exactly the rows of its new
block it does not hold already: the lower bound. All moves of one shift are
one Alltoallv over the mesh (`spmdsim.runtime.exchange`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from ..layout import TensorLayout

__all__ = ["Shift", "RankMoves"]

Index = tuple  # per tensor dim a slice


@dataclass(frozen=True)
class RankMoves:
    """One rank's part of a shift.

    Attributes:
        out_shape: its new block.
        own: (index into the new block, index into its old block) of the rows it keeps, or None.
        sends: (destination, index into its old block, box shape) per box it sends.
        places: (source, index into its new block, box shape) per box it receives.
    """

    out_shape: tuple[int, ...]
    own: Optional[tuple[Index, Index]]
    sends: tuple[tuple[int, Index, tuple[int, ...]], ...]
    places: tuple[tuple[int, Index, tuple[int, ...]], ...]


@dataclass(frozen=True)
class Shift:
    """``after[..., i, ...] = before[..., i + offset, ...]`` along `dim` (rows outside `before`: zeros)."""

    before: TensorLayout
    before_shape: tuple[int, ...]
    after: TensorLayout
    after_shape: tuple[int, ...]
    dim: int
    offset: int

    @property
    def moves_nothing(self) -> bool:
        """True when every rank holds every row it needs (then no collective runs; the same on every rank)."""
        return _moves_nothing(self)

    def moves(self, rank: int) -> RankMoves:
        """`rank`'s boxes (worked out once per shift and rank)."""
        return _moves(self, rank)

    def bytes_per_rank(self, itemsize: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(bytes each rank sends, bytes each rank receives): the dry run's per-rank report."""
        sent, received = [], []
        for rank in range(self.before.layout.num_devices):
            m = self.moves(rank)
            sent.append(sum(_size(shape) for _, _, shape in m.sends) * itemsize)
            received.append(sum(_size(shape) for _, _, shape in m.places) * itemsize)
        return tuple(sent), tuple(received)


@lru_cache(maxsize=1024)
def _moves_nothing(shift: Shift) -> bool:
    if shift.before.num_shards(shift.dim) == 1:
        return True
    return not any(_moves(shift, rank).places for rank in range(shift.before.layout.num_devices))


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _group(layout: TensorLayout, rank: int, axes: tuple[str, ...]) -> list[int]:
    """The ranks that differ from `rank` only on `axes` (`rank` among them)."""
    mesh = layout.layout
    coords = list(mesh.coords(rank))
    where = [mesh.axis_index(a) for a in axes]
    out = []
    for values in itertools.product(*(range(mesh.device_matrix[i]) for i in where)):
        for i, v in zip(where, values):
            coords[i] = v
        out.append(mesh.rank_of(coords))
    return out


@lru_cache(maxsize=4096)
def _moves(shift: Shift, rank: int) -> RankMoves:
    d, off = shift.dim, shift.offset
    before, after = shift.before, shift.after
    axes = before.tensor_map[d]
    b_lo, b_hi = before.bounds(rank, shift.before_shape)[d]
    a_lo, a_hi = after.bounds(rank, shift.after_shape)[d]
    out_shape = after.local_shape(shift.after_shape)
    in_shape = before.local_shape(shift.before_shape)

    def box(shape: tuple[int, ...], lo: int, hi: int) -> tuple[Index, tuple[int, ...]]:
        index = (slice(None),) * d + (slice(lo, hi),) + (slice(None),) * (len(shape) - d - 1)
        return index, shape[:d] + (hi - lo,) + shape[d + 1:]

    own, sends, places = None, [], []
    for member in _group(before, rank, axes):
        m_lo, m_hi = before.bounds(member, shift.before_shape)[d]
        # Rows this rank needs that `member` holds (in `before`'s numbering).
        lo, hi = max(a_lo + off, m_lo), min(a_hi + off, m_hi)
        if lo < hi:
            where, shape = box(out_shape, lo - off - a_lo, hi - off - a_lo)
            if member == rank:
                own = (where, box(in_shape, lo - b_lo, hi - b_lo)[0])
            else:
                places.append((member, where, shape))
        if member == rank:
            continue
        # Rows `member` needs that this rank holds.
        t_lo, t_hi = after.bounds(member, shift.after_shape)[d]
        lo, hi = max(t_lo + off, b_lo), min(t_hi + off, b_hi)
        if lo < hi:
            sends.append((member,) + box(in_shape, lo - b_lo, hi - b_lo))
    return RankMoves(out_shape, own, tuple(sends), tuple(places))
