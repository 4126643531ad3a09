"""The planner's candidate step sequences (spmdsim.programs.plan.planner keeps the best): each tensor dim's
axes as a stack whose minor end the collectives change (Allgather/Alltoall pop, LocalSlice/Alltoall/
ReduceScatter push), from the source as it is and from starts that first slice, for free, the axes the source
replicates and the target splits or sums; and the exchange of boxes, which always meets the lower bound.
"""
from __future__ import annotations

import itertools
import math
from functools import cache
from typing import Optional

from ...base.precision import sent_itemsize
from ...errors import ShapeError
from ...layouts.layout import Layout, TensorLayout
from .folded import foldable, folded_exchange
from .steps import Allgather, Allreduce, Alltoall, Exchange, LocalSlice, LocalZero, ReduceScatter, Step
from .uneven import sized_uneven
from .volume import exchange_received, exchange_transfers, rank_boxes
from ...base.tables import put

__all__ = ["Sizes", "stack_candidates", "cross_mesh", "sent_step", "with_map", "laid_out", "Map"]

Map = tuple[tuple[str, ...], ...]

_LAYOUTS: dict = {}  # (device matrix, tensor map, partial axes) -> the TensorLayout


class Sizes:
    """Byte counts of each step kind for one shape and dtype (its elements as each kind sends them:
    `itemsize` moved, `summed` in a sum; spmdsim.base.precision.sent_itemsize)."""

    def __init__(self, shape: tuple, dtype: str) -> None:
        self.shape = shape
        self.itemsize, self.summed = sent_itemsize(dtype, False), sent_itemsize(dtype, True)
        self._local: dict = {}

    def local(self, tl: TensorLayout) -> int:
        """The elements of a block under `tl`."""
        key = (tl.layout, tl.tensor_map)
        if key not in self._local:
            # math.prod: exact Python ints at any size (np.prod wraps past 2**63).
            self._local[key] = math.prod(tl.local_shape(self.shape))
        return self._local[key]

    def uniform(self, cls, before, after, axes, **extra) -> Step:
        """A collective or local step with its kind's bytes (`Step.moved`) on every rank.

        On shards of unequal sizes (an uneven cut): each rank's bytes, or ShapeError when the
        collective cannot serve the move (spmdsim.programs.plan.uneven).
        """
        itemsize = self.summed if cls.sums else self.itemsize
        if before.layout.cut != "even" and (before.uneven_dims(self.shape) or after.uneven_dims(self.shape)):
            return sized_uneven(cls(before, after, tuple(axes), **extra), self.shape, itemsize)
        self.local(after)  # raises ShapeError when `after` cannot split the shape
        n = cls.moved(before.layout.group_size(axes), self.local(before) * itemsize)
        per_rank = (n,) * before.layout.num_devices
        return cls(before, after, tuple(axes), per_rank, per_rank, **extra)


def with_map(tl: TensorLayout, tensor_map, partial) -> TensorLayout:
    """`tl`'s device matrix with `tensor_map` and `partial`: one object per distinct layout.

    Candidate plans build the same intermediate layouts over and over
    (hundreds of thousands while autoshard prices a network at 64 devices);
    each is validated once. An invalid one raises and is not kept.
    """
    return laid_out(tl.layout, tuple(tuple(e) for e in tensor_map), tuple(partial))


def laid_out(layout: Layout, tensor_map: Map, partial: tuple = ()) -> TensorLayout:
    """``TensorLayout(layout, tensor_map, partial)`` of a tensor map of tuples of axis names and a tuple of
    partial axes: one object per distinct layout (`with_map`'s), each validated once. The planner's refined
    meshes and each operator's choice of splits (spmdsim.programs.plan.meshes, spmdsim.programs.infer.assign)
    build the same few per call of a dry run's step."""
    key = (layout, tensor_map, partial)
    out = _LAYOUTS.get(key)
    if out is None:
        out = put(_LAYOUTS, key, TensorLayout(*key), 65536)
    return out


def _set_dim(tensor_map: Map, tensor_dim: int, axes: tuple) -> list:
    out = list(tensor_map)
    out[tensor_dim] = tuple(axes)
    return out


# -- single moves --------------------------------------------------------------------
def _local_slice(cur, d, axes, sz: Sizes) -> Step:
    after = with_map(cur, _set_dim(cur.tensor_map, d, cur.tensor_map[d] + axes), cur.partial)
    return sz.uniform(LocalSlice, cur, after, axes)


def _reduce_scatter(cur, d, axes, sz: Sizes) -> Step:
    partial = [a for a in cur.partial if a not in axes]
    after = with_map(cur, _set_dim(cur.tensor_map, d, cur.tensor_map[d] + axes), partial)
    return sz.uniform(ReduceScatter, cur, after, axes, tensor_dim=d)


def _allreduce(cur, axes, sz: Sizes) -> Step:
    after = with_map(cur, cur.tensor_map, [a for a in cur.partial if a not in axes])
    return sz.uniform(Allreduce, cur, after, axes)


def _allgather(cur, d, k, sz: Sizes) -> Step:
    axes = cur.tensor_map[d][-k:]
    after = with_map(cur, _set_dim(cur.tensor_map, d, cur.tensor_map[d][:-k]), cur.partial)
    return sz.uniform(Allgather, cur, after, axes, tensor_dim=d)


def _alltoall(cur, i, j, k, sz: Sizes) -> Step:
    axes = cur.tensor_map[i][-k:]
    tensor_map = _set_dim(cur.tensor_map, i, cur.tensor_map[i][:-k])
    tensor_map[j] = tensor_map[j] + axes
    after = with_map(cur, tensor_map, cur.partial)
    return sz.uniform(Alltoall, cur, after, axes, split_dim=j, concat_dim=i)


def _local_zero(cur, after, sz: Sizes) -> Step:
    axes = tuple(a for a in after.partial if a not in cur.partial)
    return sz.uniform(LocalZero, cur, after, axes)


class _Unsent(Exchange):
    """An exchange candidate with its bytes received only: who sends each box is chosen
    (`exchange_transfers`, the costly part) only for the plan that wins (`_sent`)."""


def _exchange(cur, after, sz: Sizes) -> Step:
    received = tuple(n * sz.itemsize for n in exchange_received(cur, after, sz.shape))
    return _Unsent(cur, after, (), bytes_received=received)


def sent_step(step: Step, sz: Sizes) -> Step:
    """`step`, an exchange candidate made whole: its transfers and the bytes each rank sends."""
    if type(step) is not _Unsent:
        return step
    if foldable(step.before, step.after, sz.shape):
        return folded_exchange(step.before, step.after, sz.shape, sz.itemsize)
    transfers = exchange_transfers(step.before, step.after, sz.shape)
    return Exchange(step.before, step.after, (), transfers=transfers).sized(sz.shape, sz.itemsize)


# -- the stack rule ---------------------------------------------------------------------
def _push(cur: TensorLayout, tmap: Map, resolve: frozenset, sz: Sizes) -> Optional[Step]:
    """A move that only grows a dim toward its target: slice, reduce-scatter or alltoall."""
    free = set(cur.replicated_axes)
    for d, (have, want) in enumerate(zip(cur.tensor_map, tmap)):
        if want[: len(have)] != have or len(want) == len(have):
            continue
        nxt = want[len(have):]
        run = tuple(itertools.takewhile(lambda a: a in free, nxt))
        if run:
            return _local_slice(cur, d, run, sz)
        run = tuple(itertools.takewhile(lambda a: a in resolve and a in cur.partial, nxt))
        if run:
            return _reduce_scatter(cur, d, run, sz)
        for i, axes in enumerate(cur.tensor_map):
            if i != d and nxt[0] in axes:
                # Longest shared run: the top k axes of dim i are the next k of dim d.
                k = next((k for k in range(min(len(axes), len(nxt)), 0, -1)
                          if axes[-k:] == nxt[:k]), 0)
                if k:
                    return _alltoall(cur, i, d, k, sz)
    return None


def _pop(cur: TensorLayout, tmap: Map, sz: Sizes) -> Optional[Step]:
    """Allgather the top of a dim that is not on its way to the target, freest axes first."""
    placed = {a for axes in tmap for a in axes}
    fallback = None
    for d, (have, want) in enumerate(zip(cur.tensor_map, tmap)):
        if want[: len(have)] == have:
            continue
        k = 0
        while k < len(have) and have[len(have) - 1 - k] not in placed and \
                want[: len(have) - k] != have[: len(have) - k]:
            k += 1
        if k:
            return _allgather(cur, d, k, sz)
        fallback = fallback or _allgather(cur, d, 1, sz)
    return fallback


def _stack(cur: TensorLayout, tmap: Map, resolve: frozenset, sz: Sizes) -> Optional[list]:
    """Steps from `cur` to map `tmap`, resolving the partial axes in `resolve`."""
    steps: list[Step] = []
    for _ in range(4 * (cur.layout.ndim + 2)):
        pending = [a for a in cur.partial if a in resolve]
        if cur.tensor_map == tmap and not pending:
            return steps
        step = _push(cur, tmap, resolve, sz)
        placed = {a for axes in tmap for a in axes}
        loose = tuple(a for a in pending if a not in placed)
        if step is None and loose:
            # Before any Allgather: the block to sum is smallest now.
            step = _allreduce(cur, loose, sz)
        if step is None:
            step = _pop(cur, tmap, sz)
        if step is None:
            return None
        steps.append(step)
        cur = step.after
    return None


def _resolve_first(src: TensorLayout, tmap: Map, resolve: frozenset, sz: Sizes):
    """Reduce-scatter each resolved axis onto its target dim at once; Allreduce the rest."""
    cur, steps = src, []
    for d, want in enumerate(tmap):
        run = tuple(a for a in want if a in resolve)
        if run:
            steps.append(_reduce_scatter(cur, d, run, sz))
            cur = steps[-1].after
    loose = tuple(a for a in cur.partial if a in resolve)
    if loose:
        steps.append(_allreduce(cur, loose, sz))
        cur = steps[-1].after
    return steps, cur


def _attempt(build, *args):
    """A candidate, or None when one of its intermediate layouts cannot split the shape.

    Stacking axes onto a dim in another order than the target's can ask a small
    dim for more shards than it has; the exchange never does, so skip those.
    """
    try:
        return build(*args)
    except ShapeError:
        return None


def stack_candidates(src: TensorLayout, tgt: TensorLayout, sz: Sizes) -> tuple:
    """Three functions, each building one tier of candidate step lists (see `_plan`)."""
    base = _from(src, tgt, sz)

    @cache  # built once, for the second tier and (its exchanges) the third
    def presliced() -> list:
        # Sums and gathers then run on blocks already cut over the pre-sliced axes.
        return [(pre, c) for pre in _preslices(src, tgt, sz) for c in _from(pre[-1].after, tgt, sz)]

    return (
        lambda: [c for c in base if not callable(c)],
        lambda: [pre + c for pre, c in presliced() if not callable(c)],
        lambda: [c() for c in base if callable(c)]
        + [pre + c() for pre, c in presliced() if callable(c)],
    )


def _from(src: TensorLayout, tgt: TensorLayout, sz: Sizes) -> list:
    """Stack-rule candidates from `src`, plus exchange builders (functions)."""
    kept = [a for a in src.partial if a in tgt.partial]
    resolve = frozenset(a for a in src.partial if a not in kept)
    new = [a for a in tgt.partial if a not in kept]
    plain = with_map(tgt, tgt.tensor_map, kept)  # the target before new partial axes appear
    ends = [(plain.tensor_map, plain)]
    if set(new) & set(src.split_axes):
        # Keep an S axis that becomes P where it is and zero-pad around it: no traffic.
        pad = tuple(want + tuple(a for a in have if a in new)
                    for have, want in zip(src.tensor_map, tgt.tensor_map))
        ends.append((pad, with_map(tgt, pad, kept)))
    starts = [(src, [], resolve)]
    if resolve:
        first = _attempt(_resolve_first, src, tgt.tensor_map, resolve, sz)
        if first is not None:
            starts.append((first[1], first[0], frozenset()))
        if src.uneven_dims(sz.shape) or tgt.uneven_dims(sz.shape):
            # Uneven shards a Reduce_scatter cannot cut: sum whole, then exchange (always fits).
            # In the source's order of its partial axes: a frozenset's order is the process's string hashes',
            # which differ between MPI ranks (PYTHONHASHSEED), and so would the group every rank builds.
            summed = _allreduce(src, tuple(a for a in src.partial if a in resolve), sz)
            starts.append((summed.after, [summed], frozenset()))
    out = []
    for start, pre, todo in starts:
        for tmap, before_zero in ends:
            steps = _attempt(_stack, start, tmap, todo, sz)
            tail = _attempt(lambda b=before_zero: [_local_zero(b, tgt, sz)] if new else [])
            if steps is None or tail is None:
                continue
            out.append(pre + steps + tail)
        if not todo and start.tensor_map != tgt.tensor_map:
            tail = [_local_zero(plain, tgt, sz)] if new else []
            out.append(lambda pre=pre, start=start, tail=tail:
                       pre + [_exchange(start, plain, sz)] + tail)
    return out


_PRESLICE_MAX = 27  # above this many placements of the pre-sliced axes, try the plainest few


def _preslices(src: TensorLayout, tgt: TensorLayout, sz: Sizes) -> list[list[Step]]:
    """Local slices, before anything else, of the axes `src` replicates and `tgt` splits or sums.

    Such an axis costs nothing to cut first, and every Allreduce, Reduce_scatter
    or Allgather after it moves 1/g of the bytes: (R,P) -> (P,R) on (dp, tp)
    slices dp, Allreduces half the tensor over tp, then zero-pads dp (S -> P).
    Each axis goes on some dim or stays whole; the stack rule does the rest.
    """
    free = set(src.replicated_axes)
    order = [a for a in tgt.split_axes + tgt.partial if a in free and src.layout.axis_size(a) > 1]
    if not order or not src.ndim:
        return []
    where = range(-1, src.ndim)  # -1: not pre-sliced
    if (src.ndim + 1) ** len(order) <= _PRESLICE_MAX:
        choices = list(itertools.product(where, repeat=len(order)))
    else:
        home = tuple(next((d for d, axes in enumerate(tgt.tensor_map) if a in axes), -1) for a in order)
        choices = [home] + [(d,) * len(order) for d in where]
    # All -1 is the plain start, already planned; None: a dim too small to cut.
    return [s for s in (_attempt(_slices, src, order, c, sz) for c in choices) if s]


def _slices(src: TensorLayout, order: list, choice: tuple, sz: Sizes) -> list[Step]:
    steps, cur = [], src
    for d in range(src.ndim):
        axes = tuple(a for a, c in zip(order, choice) if c == d)
        if axes:
            steps.append(_local_slice(cur, d, axes, sz))
            cur = steps[-1].after
    return steps


def cross_mesh(source: TensorLayout, target: TensorLayout, shape: tuple, dtype: str):
    """Meshes without a common refinement: sum on the source mesh, then exchange boxes (no exchange where
    every rank holds its new box already: it would be a call that moves nothing)."""
    sz = Sizes(shape, dtype)
    steps, cur = [], source
    if source.partial:
        steps.append(_allreduce(cur, source.partial, sz))
        cur = steps[-1].after
    plain = with_map(target, target.tensor_map, ())
    if rank_boxes(cur, shape) != rank_boxes(plain, shape):
        steps.append(_exchange(cur, plain, sz))
    if target.partial:
        steps.append(_local_zero(plain, target, sz))
    return steps
