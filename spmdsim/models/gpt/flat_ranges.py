"""Which elements of a block's flattened (C-order) elements a box within it spans, from the bounds alone: resuming
under ZeRO (spmdsim.models.gpt.reshard) asks, of each saved region that overlaps a rank's block, the range of the
region's flattened block that holds the overlap's elements this rank's slice wants, without a mask of the block.

C order keeps the order of a box's points in any block that holds the box (both flatten first dim major), so the
first and the last point wanted, found dim by dim, give the range."""
from __future__ import annotations

import math
from typing import Any, Optional

__all__ = ["wanted_range"]


def wanted_range(region: tuple, overlap: tuple, mine: tuple, need: Any) -> list:
    """[(start, stop)] of `region`'s flattened block: from the first to the last element of `overlap` (this
    rank's block `mine` and `region`'s, each [start, stop) per dim) wanted: all where `need` is True, else those
    at [start, stop) of this rank's flattened block (ZeRO's slice); [] where none."""
    shape = tuple(b - a for a, b in mine)
    size = math.prod(shape)
    start, stop = (0, size) if need is True else slice(*need).indices(size)[:2]
    box = tuple((lo - a, hi - a) for (lo, hi), (a, _) in zip(overlap, mine))  # the overlap within `mine`
    if start >= stop or any(lo >= hi for lo, hi in box):
        return []
    first = _first_from(_unravel(start, shape), box)
    # the last point at or before stop - 1: the first from its mirror image, each coordinate negated
    last = _first_from(tuple(-i for i in _unravel(stop - 1, shape)), tuple((1 - hi, 1 - lo) for lo, hi in box))
    if last is not None:
        last = tuple(-i for i in last)
    if first is None or last is None or first > last:
        return []
    sizes = tuple(b - a for a, b in region)
    at = [_ravel(tuple(i + a - r for i, (a, _), (r, _) in zip(point, mine, region)), sizes) for point in (first, last)]
    return [(at[0], at[1] + 1)]


def _first_from(point: tuple, box: tuple) -> Optional[tuple]:
    """The first point of `box` ([lo, hi) per dim) at or after `point` in C order, or None where none is."""
    for d, (x, (lo, hi)) in enumerate(zip(point, box)):
        if x < lo:  # every point of the box with the same leading coordinates comes after: the first of them
            return tuple(point[:d]) + tuple(lo for lo, _ in box[d:])
        if x >= hi:  # none with these leading coordinates: the next value of the last one that has one
            for j in range(d - 1, -1, -1):
                if point[j] + 1 < box[j][1]:
                    return tuple(point[:j]) + (point[j] + 1,) + tuple(lo for lo, _ in box[j + 1:])
            return None
    return tuple(point)  # `point` is in the box


def _unravel(index: int, shape: tuple) -> tuple:
    """The point of flat (C-order) `index` in a block of `shape`."""
    out = []
    for n in reversed(shape):
        index, i = divmod(index, n)
        out.append(i)
    return tuple(reversed(out))


def _ravel(point: tuple, shape: tuple) -> int:
    """The flat (C-order) index of `point` in a block of `shape`."""
    flat = 0
    for i, n in zip(point, shape):
        flat = flat * n + i
    return flat
