"""Box arithmetic, the communication lower bound and the exchange's box list.

Pure numpy. A box is a tuple of half-open ``(start, stop)`` pairs, one per
tensor dim, in global coordinates. Ranks are numbered as in docs/explanation/semantics.md; a rank
keeps its number when the same ranks are viewed through another device matrix.
"""
from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np

from ...layouts.layout import TensorLayout
from ...layouts.slicing import all_bounds
from ..transfer import Transfer
from ...base.tables import put

__all__ = ["Box", "box_shape", "box_size", "intersect", "rank_boxes", "lower_bound", "exchange_transfers",
           "exchange_received"]

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
    for size, axes, counts in zip(shape, tl.tensor_map, tl.counts_per_dim):
        bounds = all_bounds(size, counts, layout.cut)
        per_dim.append([bounds[i] for i in layout.group_indices(axes).tolist()])
    if not per_dim:  # a 0-d tensor: every rank holds the empty box
        return ((),) * layout.num_devices
    return tuple(zip(*per_dim))


@lru_cache(maxsize=4096)
def _box_array(tl: TensorLayout, shape: tuple[int, ...]) -> np.ndarray | None:
    """`rank_boxes` as an int64 array (ranks, dims, 2); None for a 0-d tensor or past int64's range."""
    if not shape or math.prod(shape) >= _INT64_LIMIT:
        return None
    shape = tl.check_shape(shape)
    layout = tl.layout
    out = np.empty((layout.num_devices, len(shape), 2), dtype=np.int64)
    for d, (size, axes, counts) in enumerate(zip(shape, tl.tensor_map, tl.counts_per_dim)):
        n = layout.group_size(axes)
        if size % n == 0:  # every rule cuts a size that divides into [i * size//n, (i+1) * size//n)
            width = size // n
            out[:, d, 0] = layout.group_indices(axes) * width
            out[:, d, 1] = out[:, d, 0] + width
        else:
            bounds = np.array(all_bounds(size, counts, layout.cut), dtype=np.int64)
            out[:, d, :] = bounds[layout.group_indices(axes)]
    return out


def _held_of_new(before: TensorLayout, after: TensorLayout, shape: tuple[int, ...]) -> tuple[tuple, tuple]:
    """Per rank, its new block's elements and how many of them it already holds (two tuples of ints).

    The blocks follow from the device matrices and tensor maps alone (pending sums hold blocks of the same
    shape): kept by those (`_HELD`), as the planner asks again for layouts that differ in their sums only.
    """
    shape = tuple(shape)
    key = (before.layout, before.tensor_map, after.layout, after.tensor_map, shape)
    found = _HELD.get(key)
    if found is None:
        found = put(_HELD, key, _count_held(before, after, shape), 16384)
    return found


_HELD: dict = {}  # (device matrices, tensor maps, shape) -> `_held_of_new`


def _count_held(before: TensorLayout, after: TensorLayout, shape: tuple[int, ...]) -> tuple[tuple, tuple]:
    """`_held_of_new`, worked out: one numpy pass over every rank's two boxes where int64 holds the sizes (a
    Python intersection per rank is most of the planner's time at 64 devices and more); exact Python ints
    past that (and for a 0-d tensor)."""
    old, new = _box_array(before, shape), _box_array(after, shape)
    if old is not None and new is not None:
        extent = np.minimum(old[:, :, 1], new[:, :, 1]) - np.maximum(old[:, :, 0], new[:, :, 0])
        held = np.where((extent > 0).all(axis=1), np.clip(extent, 0, None).prod(axis=1), 0)
        return tuple((new[:, :, 1] - new[:, :, 0]).prod(axis=1).tolist()), tuple(held.tolist())
    wanted, held = [], []
    for own, want in zip(rank_boxes(before, shape), rank_boxes(after, shape)):
        common = intersect(own, want)
        wanted.append(box_size(want))
        held.append(0 if common is None else box_size(common))
    return tuple(wanted), tuple(held)


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


def lower_bound(source: TensorLayout, target: TensorLayout, shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """Per rank, the fewest bytes any plan must deliver to it.

    Without partial sums: the part of its target block it does not hold. When a
    pending sum is resolved, every element of its target block must arrive
    (already summed) at least once. When the target creates partial axes, a
    group of ranks over them shares the work, so each rank is credited its
    group's need divided by the group size (a bound on the maximum only).
    """
    _, new, resolved = _kept_and_new(source, target)
    if not new:
        wanted, held = _held_of_new(source, target, shape)
        return tuple((w if resolved else w - h) * itemsize for w, h in zip(wanted, held))
    src, tgt = rank_boxes(source, shape), rank_boxes(target, shape)
    out = [0] * len(tgt)
    known: dict[tuple, int] = {}  # _uncovered by the covers' place in the region: groups alike repeat it
    for group in target.layout.axis_groups(new):
        region = tgt[group[0]]
        covers = [] if resolved else [c for c in (intersect(src[q], region) for q in group) if c]
        key = tuple(tuple((a - lo, b - lo) for (a, b), (lo, _) in zip(box, region)) for box in [region, *covers])
        if key not in known:
            known[key] = _uncovered(region, covers)
        share = -(-known[key] // len(group))
        for r in group:
            out[r] = share * itemsize
    return tuple(out)


def exchange_received(before: TensorLayout, after: TensorLayout, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Per rank, the elements `exchange_transfers` delivers to it, without choosing the senders.

    The held boxes tile the tensor, so a rank receives its new block less the
    part of it that it already holds, whichever replica sends each piece.
    """
    wanted, held = _held_of_new(before, after, shape)
    return tuple(w - h for w, h in zip(wanted, held))


def exchange_transfers(before: TensorLayout, after: TensorLayout, shape: tuple[int, ...]) -> tuple[Transfer, ...]:
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
    n = len(src)
    load = [0] * n
    out: list[Transfer] = []
    overlapping = _grid_lookup(holders, src[0])
    eligible: dict = {}  # (box, partial-axes key) -> its holders with that key, rank order
    for dst, want in enumerate(tgt):
        own = src[dst]
        if own == want:
            continue
        key = keys[dst]
        for box, part, size in overlapping(want):
            if box == own:
                continue  # the part it already holds is copied locally
            ranks = eligible.get((box, key))
            if ranks is None:
                ranks = eligible[box, key] = [h for h in holders[box] if keys[h] == key]
            # The least loaded, then the nearest after dst: min() over (load, distance), by hand.
            chosen, best = -1, None
            for h in ranks:
                score = (load[h], (h - dst) % n)
                if best is None or score < best:
                    chosen, best = h, score
            load[chosen] += size
            out.append(Transfer(chosen, dst, part))
    return tuple(out)


def _grid_lookup(holders: dict[Box, list[int]], first: Box):
    """A function: target box -> (held box, its overlap with the target, the overlap's size), in
    `holders` order, for every held box that overlaps the target.

    Even splits cut every dim into equal blocks, so the held boxes form a grid
    and the candidates of a box are found per dim by division: O(overlaps)
    per target instead of a scan of every held box (O(ranks^2) for a whole
    plan, 17 s at 4,096 devices), and each overlap is the product of its
    dims' clipped ranges. Falls back to the scan for anything else.
    """
    order = {box: i for i, box in enumerate(holders)}
    widths = tuple(b - a for a, b in first)
    on_grid = all(w > 0 for w in widths) and all(
        b - a == w and a % w == 0 for box in holders for (a, b), w in zip(box, widths))
    if not on_grid:
        def scan(want: Box) -> list[tuple]:
            parts = ((box, intersect(box, want)) for box in holders)
            return [(box, part, box_size(part)) for box, part in parts if part is not None]
        return scan

    def overlapping(want: Box) -> list[tuple]:
        # Per dim: (the held block, its overlap with the target's range) for each block it meets.
        per_dim = [[((i * w, (i + 1) * w), (max(a, i * w), min(b, (i + 1) * w)))
                    for i in range(a // w, -(-b // w))]
                   for (a, b), w in zip(want, widths)]
        found = []
        for combo in itertools.product(*per_dim):
            box = tuple([c[0] for c in combo])
            index = order.get(box)
            if index is not None:
                part = tuple([c[1] for c in combo])
                found.append((index, box, part, math.prod([hi - lo for lo, hi in part])))
        # The scan's order: the least-loaded choice among holders depends on it.
        found.sort()
        return [(box, part, size) for _, box, part, size in found]
    return overlapping
