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
import math
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from ...layouts.layout import TensorLayout
from ...layouts.slicing import all_bounds

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
        counts = {}  # a rank's bytes follow its coordinates on the dim's axes: worked out once per kind
        for key, rank in _kinds(self).items():
            m = self.moves(rank)
            counts[key] = (sum(math.prod(shape) for _, _, shape in m.sends) * itemsize,
                           sum(math.prod(shape) for _, _, shape in m.places) * itemsize)
        mesh, where = self.before.layout, _dim_axes(self)
        each = [counts[tuple(c[i] for i in where)] for c in map(mesh.coords, range(mesh.num_devices))]
        return tuple(c[0] for c in each), tuple(c[1] for c in each)


def _dim_axes(shift: Shift) -> tuple[int, ...]:
    """Mesh axis indices (of size above one) that split `dim` in `before` or `after`: what a rank's moves
    depend on (its coordinates on the other axes only choose which copy it is)."""
    mesh = shift.before.layout
    named = set(shift.before.tensor_map[shift.dim]) | set(shift.after.tensor_map[shift.dim])
    # An uneven cut of another dim makes the boxes' extents there follow those axes too.
    for tl, shape in ((shift.before, shift.before_shape), (shift.after, shift.after_shape)):
        for k in tl.uneven_dims(shape):
            named |= set(tl.tensor_map[k])
    return tuple(i for i, a in enumerate(mesh.alias_name) if a in named and mesh.device_matrix[i] > 1)


@lru_cache(maxsize=1024)
def _kinds(shift: Shift) -> dict:
    """One rank per combination of coordinates on `_dim_axes` (the others 0): coordinates -> rank."""
    mesh, where = shift.before.layout, _dim_axes(shift)
    out = {}
    for values in itertools.product(*(range(mesh.device_matrix[i]) for i in where)):
        coords = [0] * mesh.ndim
        for i, v in zip(where, values):
            coords[i] = v
        out[values] = mesh.rank_of(coords)
    return out


@lru_cache(maxsize=1024)
def _moves_nothing(shift: Shift) -> bool:
    if shift.before.num_shards(shift.dim) == 1:
        return True
    return not any(_moves(shift, rank).places for rank in _kinds(shift).values())


def _digits(k: int, sizes: list[int]) -> list[int]:
    """`k` in mixed radix over `sizes`, the first major."""
    out = []
    for n in reversed(sizes):
        out.append(k % n)
        k //= n
    return out[::-1]


@lru_cache(maxsize=1024)
def _starts(layout: TensorLayout, size: int, d: int) -> tuple[int, ...]:
    """Where each block of dim `d` (of `size` rows) starts under `layout`, then `size`: the layout's cut."""
    return tuple(a for a, _ in all_bounds(size, layout.counts_per_dim[d], layout.layout.cut)) + (size,)


def _index(mesh, where: list[int], c: list[int]) -> int:
    """The block index of coordinates `c` over the mesh axes `where` (mixed radix, the first major)."""
    index = 0
    for i in where:
        index = index * mesh.device_matrix[i] + c[i]
    return index


@lru_cache(maxsize=4096)
def _moves(shift: Shift, rank: int) -> RankMoves:
    d, off = shift.dim, shift.offset
    before, after = shift.before, shift.after
    mesh = before.layout
    out_shape = after.local_shape(shift.after_shape, rank)
    in_shape = before.local_shape(shift.before_shape, rank)
    coords = list(mesh.coords(rank))
    b_where = [mesh.axis_index(a) for a in before.tensor_map[d]]
    b_sizes = [mesh.device_matrix[i] for i in b_where]
    a_where = [mesh.axis_index(a) for a in after.tensor_map[d]]
    size = shift.before_shape[d]
    # The rows each block holds, before and after: equal blocks, or an uneven cut's (Layout.cut).
    b_starts, a_starts = _starts(before, size, d), _starts(after, shift.after_shape[d], d)

    def member(k: int) -> tuple[int, list[int]]:  # the group's k-th rank (rows b_starts[k]:b_starts[k + 1])
        c = list(coords)
        for i, v in zip(b_where, _digits(k, b_sizes)):
            c[i] = v
        return mesh.rank_of(c), c

    def box(shape: tuple[int, ...], lo: int, hi: int) -> tuple[Index, tuple[int, ...]]:
        index = (slice(None),) * d + (slice(lo, hi),) + (slice(None),) * (len(shape) - d - 1)
        return index, shape[:d] + (hi - lo,) + shape[d + 1:]

    own, sends, places = None, [], []
    mine = _index(mesh, b_where, coords)
    b_lo, b_hi = b_starts[mine], b_starts[mine + 1]
    start, stop = (a_starts[k] for k in (_index(mesh, a_where, coords), _index(mesh, a_where, coords) + 1))
    # Rows this rank needs (before's numbering), from the members that hold them.
    lo, hi = max(start + off, 0), min(stop + off, size)
    for k in range(max(bisect_right(b_starts, lo) - 1, 0), len(b_starts) - 1) if lo < hi else ():
        r_lo, r_hi = max(lo, b_starts[k]), min(hi, b_starts[k + 1])
        if b_starts[k] >= hi:
            break
        if r_lo >= r_hi:
            continue
        where, shape = box(out_shape, r_lo - off - start, r_hi - off - start)
        if k == mine:
            own = (where, box(in_shape, r_lo - b_lo, r_hi - b_lo)[0])
        else:
            places.append((member(k)[0], where, shape))
    # Rows the other members need that this rank holds: the blocks j of `after` that overlap them, and
    # the members whose coordinates give block j (after's axes outside the group are this rank's own).
    a_sizes = [mesh.device_matrix[i] for i in a_where]
    free = [i for i in b_where if i not in a_where]
    first = max(bisect_right(a_starts, b_lo - off) - 1, 0)
    for j in range(first, len(a_starts) - 1) if b_lo < b_hi else ():
        if a_starts[j] + off >= b_hi:
            break
        r_lo, r_hi = max(a_starts[j] + off, b_lo), min(a_starts[j + 1] + off, b_hi)
        if r_lo >= r_hi:
            continue
        c = list(coords)
        for i, v in zip(a_where, _digits(j, a_sizes)):
            if i in b_where:
                c[i] = v
            elif c[i] != v:
                break
        else:
            for values in itertools.product(*(range(mesh.device_matrix[i]) for i in free)):
                for i, v in zip(free, values):
                    c[i] = v
                other = mesh.rank_of(c)
                if other != rank:
                    sends.append((other,) + box(in_shape, r_lo - b_lo, r_hi - b_lo))
    return RankMoves(out_shape, own, tuple(sorted(sends, key=lambda s: s[0])), tuple(places))
