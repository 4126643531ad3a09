"""Box arithmetic, the communication lower bound and the exchange's box list.

Pure numpy. A box is a tuple of half-open ``(start, stop)`` pairs, one per
tensor dim, in global coordinates. Ranks are numbered as in DESIGN.md; a rank
keeps its number when the same ranks are viewed through another device matrix.
"""
from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np

from ..layout import TensorLayout
from ..slicing import shard_bounds
from .steps import Transfer

__all__ = ["Box", "box_shape", "box_size", "intersect", "rank_boxes", "lower_bound", "exchange_transfers"]

Box = tuple[tuple[int, int], ...]


def box_shape(box: Box) -> tuple[int, ...]:
    """Extent of a box along each dim (the shape of the array it cuts out)."""
    return tuple(b - a for a, b in box)


def box_size(box: Box) -> int:
    """Number of elements in a box."""
    return math.prod(b - a for a, b in box)


def intersect(first: Box, second: Box) -> Box | None:
    """The common box of two boxes, or None when they do not overlap."""
    out = []
    for (a, b), (c, d) in zip(first, second):
        lo, hi = (a if a > c else c), (b if b < d else d)
        if lo >= hi:
            return None
        out.append((lo, hi))
    return tuple(out)


@lru_cache(maxsize=16384)
def rank_boxes(tl: TensorLayout, shape: tuple[int, ...]) -> tuple[Box, ...]:
    """The box every rank holds under `tl`, indexed by rank (`tl.bounds` of each rank).

    Built per tensor dim from every rank's shard index at once: a `bounds` call
    per rank took seconds at tens of thousands of devices.
    """
    shape = tl.check_shape(shape)
    layout = tl.layout
    per_dim = []
    for size, axes in zip(shape, tl.tensor_map):
        n = layout.group_size(axes)
        bounds = [shard_bounds(size, n, i) for i in range(n)]
        per_dim.append([bounds[i] for i in layout.group_indices(axes).tolist()])
    if not per_dim:  # a 0-d tensor: every rank holds the empty box
        return ((),) * layout.num_devices
    return tuple(zip(*per_dim))


def _uncovered(region: Box, covers: list[Box]) -> int:
    """Elements of `region` that none of `covers` contains (coordinate compression)."""
    if not covers:
        return box_size(region)
    cuts = []
    for dim, (lo, hi) in enumerate(region):
        points = {lo, hi}
        for box in covers:
            a, b = box[dim]
            points.update(p for p in (a, b) if lo < p < hi)
        cuts.append(_coordinates(sorted(points)))
    covered = np.zeros(tuple(len(c) - 1 for c in cuts), dtype=bool)
    for box in covers:
        index = tuple(
            slice(np.searchsorted(c, max(a, c[0])), np.searchsorted(c, min(b, c[-1])))
            for c, (a, b) in zip(cuts, box)
        )
        covered[index] = True
    # int64 while the region's size fits (the usual case), exact Python ints past it.
    exact = box_size(region) >= _INT64_LIMIT
    widths = np.ones(covered.shape, dtype=object if exact else np.int64)
    for dim, c in enumerate(cuts):
        shape = [1] * len(cuts)
        shape[dim] = len(c) - 1
        step = np.diff(c.astype(object) if exact else c)
        widths = widths * step.reshape(shape)
    return int(widths[~covered].sum())


_INT64_LIMIT = 2 ** 63


def _coordinates(points: list[int]) -> np.ndarray:
    """Sorted cut points as an int64 array, or an object array of Python ints past int64."""
    return np.array(points, dtype=object if points[-1] >= _INT64_LIMIT else np.int64)


def _kept_and_new(source: TensorLayout, target: TensorLayout) -> tuple[set, tuple, bool]:
    """Partial axes kept, partial axes created, and whether a pending sum gets resolved."""
    same = source.layout == target.layout
    kept = set(source.partial) & set(target.partial) if same else set()
    resolved = [a for a in source.partial if a not in kept]
    new = tuple(a for a in target.partial if a not in kept)
    return kept, new, source.layout.group_size(resolved) > 1


def lower_bound(
    source: TensorLayout, target: TensorLayout, shape: tuple[int, ...], itemsize: int
) -> tuple[int, ...]:
    """Per rank, the fewest bytes any plan must deliver to it.

    Without partial sums: the part of its target block it does not hold. When a
    pending sum is resolved, every element of its target block must arrive
    (already summed) at least once. When the target creates partial axes, a
    group of ranks over them shares the work, so each rank is credited its
    group's need divided by the group size (a bound on the maximum only).
    """
    src, tgt = rank_boxes(source, shape), rank_boxes(target, shape)
    _, new, resolved = _kept_and_new(source, target)
    if not new:
        need = []
        for s, t in zip(src, tgt):
            common = intersect(s, t)
            held = 0 if resolved or common is None else box_size(common)
            need.append(box_size(t) - held)
        return tuple(n * itemsize for n in need)
    out = [0] * len(tgt)
    for group in target.layout.axis_groups(new):
        region = tgt[group[0]]
        covers = [] if resolved else [c for c in (intersect(src[q], region) for q in group) if c]
        share = -(-_uncovered(region, covers) // len(group))
        for r in group:
            out[r] = share * itemsize
    return tuple(out)


def exchange_transfers(
    before: TensorLayout, after: TensorLayout, shape: tuple[int, ...]
) -> tuple[Transfer, ...]:
    """Boxes to move so every rank ends with its `after` block, receiving only what it lacks.

    The holder of each missing box is chosen among the ranks that hold it (and
    share the destination's coordinates on partial axes, whose addends differ),
    least-loaded first, so replicas share the sending.
    """
    src, tgt = rank_boxes(before, shape), rank_boxes(after, shape)
    layout = before.layout
    holders: dict[Box, list[int]] = {}
    for r, box in enumerate(src):
        holders.setdefault(box, []).append(r)
    keys = layout.group_indices(before.partial).tolist()
    load = [0] * len(src)
    out: list[Transfer] = []
    overlapping = _grid_lookup(holders, src[0])
    for dst, want in enumerate(tgt):
        if src[dst] == want:
            continue
        for box in overlapping(want):
            ranks = holders[box]
            if box == src[dst]:
                continue  # the part it already holds is copied locally
            part = intersect(box, want)
            if part is None:
                continue
            eligible = [h for h in ranks if keys[h] == keys[dst]]
            chosen = min(eligible, key=lambda h: (load[h], (h - dst) % len(src)))
            load[chosen] += box_size(part)
            out.append((chosen, dst, part))
    return tuple(out)


def _grid_lookup(holders: dict[Box, list[int]], first: Box):
    """A function: target box -> the source boxes that may overlap it, in `holders` order.

    Even splits cut every dim into equal blocks, so the held boxes form a grid
    and the candidates of a box are found per dim by division: O(overlaps)
    per target instead of a scan of every held box (O(ranks^2) for a whole
    plan, 17 s at 4,096 devices). Falls back to the scan for anything else.
    """
    order = {box: i for i, box in enumerate(holders)}
    widths = tuple(b - a for a, b in first)
    on_grid = all(w > 0 for w in widths) and all(
        b - a == w and a % w == 0 for box in holders for (a, b), w in zip(box, widths))
    if not on_grid:
        return lambda want: holders
    def overlapping(want: Box) -> list[Box]:
        ranges = [range(a // w, -(-b // w)) for (a, b), w in zip(want, widths)]
        found = []
        for index in itertools.product(*ranges):
            box = tuple((i * w, (i + 1) * w) for i, w in zip(index, widths))
            if box in order:
                found.append(box)
        # The scan's order: the least-loaded choice among holders depends on it.
        return sorted(found, key=order.__getitem__)
    return overlapping
