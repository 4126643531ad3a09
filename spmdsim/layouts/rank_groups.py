"""A device matrix's ranks: rank <-> device coordinates, and the groups of ranks over mesh axes.

The mixin RankGroups is part of spmdsim.layouts.layout.Layout, whose sizes it reads (`device_matrix`,
`num_devices`, `ndim`, `strides`, `axis_index`) and whose `_coords` it fills. Ranks are numbered row-major
over the device matrix (last axis fastest); a group over several axes is in mixed-radix order of them,
the first listed major. Pure numpy; never imports mpi4py.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import LayoutError
from ..base.validate import as_int

__all__ = ["RankGroups"]


class RankGroups:
    """Layout's rank arithmetic: coordinates of a rank, the rank at coordinates, and groups over mesh axes."""

    # -- rank <-> coordinates --------------------------------------------------
    def _check_rank(self, rank: int) -> int:
        """`rank` as an int rank of this device matrix (a float rank would give float coords)."""
        if type(rank) is not int:
            n = as_int(rank)
            if n is None:
                raise LayoutError(f"rank {rank!r} must be an integer (expected 0 <= rank < {self.num_devices})")
            rank = n
        if not 0 <= rank < self.num_devices:
            raise LayoutError(f"rank {rank!r} is outside device matrix {self.device_matrix!r} "
                              f"(expected 0 <= rank < {self.num_devices})")
        return rank

    def coords(self, rank: int) -> tuple[int, ...]:
        """Device coordinates of `rank`, one per mesh axis."""
        # Kept per rank (bounded): every shard's bounds, group and member query asks for them again.
        known = self._coords.get(rank) if type(rank) is int else None
        if known is not None:
            return known
        rank = self._check_rank(rank)
        out = tuple((rank // s) % n for s, n in zip(self.strides, self.device_matrix))
        if len(self._coords) < 4096:
            self._coords[rank] = out
        return out

    def rank_of(self, coords: Sequence[int]) -> int:
        """Rank at the given device coordinates."""
        coords = tuple(coords)
        if len(coords) != self.ndim or any(
            as_int(c) is None or not 0 <= c < n for c, n in zip(coords, self.device_matrix)
        ):
            raise LayoutError(f"coordinates {coords!r} do not fit device matrix {self.device_matrix!r}")
        return sum(int(c) * s for c, s in zip(coords, self.strides))

    def group_index(self, rank: int, axes: Sequence[str]) -> int:
        """Mixed-radix index of `rank` along `axes` (first listed major)."""
        coords = self.coords(rank)
        index = 0
        for alias in axes:
            i = self.axis_index(alias)
            index = index * self.device_matrix[i] + coords[i]
        return index

    def group_indices(self, axes: Sequence[str]) -> np.ndarray:
        """`group_index(rank, axes)` of every rank at once, as an int64 array in rank order.

        For whole-mesh work (the planner at thousands of devices), where a call
        per rank would dominate.
        """
        axes = tuple(axes)
        self._check_axes(axes)
        ranks = np.arange(self.num_devices, dtype=np.int64)
        index = np.zeros(self.num_devices, dtype=np.int64)
        for alias in axes:
            i = self.axis_index(alias)
            index = index * self.device_matrix[i] + (ranks // self.strides[i]) % self.device_matrix[i]
        return index

    def split_color_key(self, rank: int, axes: Sequence[str]) -> tuple[int, int]:
        """(color, key) for Comm.Split building the group over `axes` that holds `rank`.

        Ranks share a color when they agree on every axis outside `axes`; the key
        orders each group in mixed-radix order of `axes`, so Allgather output is in
        shard order.
        """
        axes = tuple(axes)
        self._check_axes(axes)
        coords = list(self.coords(rank))
        for alias in axes:
            coords[self.axis_index(alias)] = 0
        return self.rank_of(coords), self.group_index(rank, axes)

    def group_members(self, rank: int, axes: Sequence[str]) -> tuple[int, ...]:
        """The ranks of the group over `axes` that holds `rank`, in mixed-radix order of `axes` (first listed
        major): the group `split_color_key(rank, axes)` names, its `axis_groups` entry, worked out from
        `rank`'s coordinates without visiting the other ranks."""
        axes = tuple(axes)
        self._check_axes(axes)
        coords, strides = self.coords(rank), self.strides
        first, offsets = rank, [0]
        for alias in axes:
            i = self.axis_index(alias)
            first -= coords[i] * strides[i]
            offsets = [o + c * strides[i] for o in offsets for c in range(self.device_matrix[i])]
        return tuple(first + o for o in offsets)

    def axis_groups(self, axes: Sequence[str]) -> tuple[tuple[int, ...], ...]:
        """All groups of ranks over `axes`, each in mixed-radix order of `axes`.

        Groups are listed by their smallest rank. An empty `axes` gives one
        group per rank.
        """
        axes = tuple(axes)
        self._check_axes(axes)
        # Every rank's split_color_key at once: the color (the group's smallest rank, its coordinates on `axes`
        # zeroed) sorts the groups, the key the members; every group has the same size.
        ranks = np.arange(self.num_devices, dtype=np.int64)
        color = ranks.copy()
        for alias in axes:
            i = self.axis_index(alias)
            color -= (ranks // self.strides[i]) % self.device_matrix[i] * self.strides[i]
        order = np.lexsort((self.group_indices(axes), color))
        return tuple(map(tuple, ranks[order].reshape(-1, self.group_size(axes)).tolist()))

    def _check_axes(self, axes: tuple[str, ...]) -> None:
        for alias in axes:
            self.axis_index(alias)
        if len(set(axes)) != len(axes):
            raise LayoutError(f"axis group {axes!r} repeats an axis")
