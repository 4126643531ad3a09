"""Plan a redistribution: from one TensorLayout to another of the same global shape.

Pure (numpy only). Each tensor dim's axes behave like a stack: collectives
only change its minor end (Allgather/Alltoall pop, LocalSlice/Alltoall/
ReduceScatter push). The planner builds a few candidate step sequences from
that rule (also from starts that first slice, for free, the axes the source
replicates and the target splits or sums), plus a general exchange that
always meets the lower bound, and keeps the one whose maximum bytes received
per rank is smallest (ties: fewer received bytes in total, then collectives
over the exchange, then fewer steps).
Mesh axes of size 1 are first taken out of both layouts (they change no
rank's block: no step acts on them alone); different device matrices are then
rewritten on a common refined mesh.
"""
from __future__ import annotations

import itertools
import math
from functools import cache, lru_cache
from typing import Optional, Sequence

import numpy as np

from ...errors import PlanError, ShapeError
from ...layouts.layout import TensorLayout
from ...base.precision import sent_itemsize
from ...base.validate import counted, dtype_arg
from .folded import foldable, folded_exchange
from .meshes import common_refinement, translate
from .record import Plan
from .steps import Allgather, Allreduce, Alltoall, Exchange, LocalSlice, LocalZero, ReduceScatter, Step
from .uneven import sized_uneven
from .volume import exchange_received, exchange_transfers, lower_bound, rank_boxes

__all__ = ["plan_redistribution"]

Map = tuple[tuple[str, ...], ...]


def plan_redistribution(source: TensorLayout, target: TensorLayout, shape: Sequence[int],
                        dtype: str = "float32") -> Plan:
    """The least-communication plan from `source` to `target` for a tensor of `shape`.

    Plans are cached on their (hashable) inputs; a repeated call with the same
    arguments skips validation too (it depends on nothing else). `dtype` must be
    given: bool, integer, float or complex in native byte order.
    """
    # Only a shape of plain ints may hit the cache: (16.0, 8) and (True, 8)
    # hash and compare equal to (16, 8) but must be refused.
    if type(shape) is tuple and _INT_ONLY.issuperset(map(type, shape)):
        try:
            return _VALIDATED[(source, target, shape, dtype)]
        except (KeyError, TypeError):  # TypeError: an unhashable layout or dtype
            pass
    plan = _plan(*_validated(source, target, shape, dtype))
    if len(_VALIDATED) < _VALIDATED_MAX:
        try:
            _VALIDATED[(source, target, shape, dtype)] = plan
        except TypeError:
            pass
    return plan


_VALIDATED: dict = {}
_INT_ONLY = frozenset((int,))
_VALIDATED_MAX = 4096


def _validated(source: TensorLayout, target: TensorLayout, shape: Sequence[int], dtype: str) -> tuple:
    """(source, target, shape as a tuple, dtype name), or the PlanError every rank raises alike."""
    for name, tl in (("source", source), ("target", target)):
        if not isinstance(tl, TensorLayout):
            raise PlanError(f"{name} {tl!r} must be a TensorLayout")
    if source.layout.num_devices != target.layout.num_devices:
        raise PlanError(f"source device matrix {source.layout.device_matrix!r} has {source.layout.num_devices} "
                        f"devices but target {target.layout.device_matrix!r} has {target.layout.num_devices}; "
                        "expected the same count")
    if source.ndim != target.ndim:
        raise PlanError(f"source {source} has {counted(source.ndim, 'dim')} but target {target} has {target.ndim}")
    shape = source.check_shape(shape)
    target.check_shape(shape)
    dt = dtype_arg(dtype, error=PlanError)
    if dt.kind == "b" and (source.partial or target.partial):
        # MPI has no sum of bools, and a pending sum of bools is not a bool.
        raise PlanError(f"a bool tensor cannot be a pending sum ({source} -> {target}); use an integer dtype for sums")
    return source, target, shape, dt.name


def received_per_rank(source: TensorLayout, target: TensorLayout, shape: Sequence[int],
                      dtype: str = "float32") -> tuple[int, ...]:
    """Per rank, the bytes the plan from `source` to `target` delivers: the Plan's `bytes_received`,
    without choosing which replica sends each box of an exchange (what pricing many moves needs)."""
    steps, _ = _choice(*_validated(source, target, shape, dtype))
    return _received(list(steps)) or (0,) * source.layout.num_devices


@lru_cache(maxsize=4096)
def _plan(source: TensorLayout, target: TensorLayout, shape: tuple, dtype: str) -> Plan:
    steps, bound = _choice(source, target, shape, dtype)
    sz = _Sizes(shape, dtype)
    return Plan(source, target, shape, dtype, tuple(_sent(step, sz) for step in steps), bound)


@lru_cache(maxsize=4096)
def _choice(source: TensorLayout, target: TensorLayout, shape: tuple, dtype: str) -> tuple:
    """(the least-communication steps, exchanges still unsent; the lower bound per rank)."""
    # An axis of size 1 cuts nothing and sums one addend: every rank's block is the same without it, and a
    # step on it alone would be a call that moves nothing. Planned without such axes, a move between
    # layouts that differ only on them is no step at all.
    source, target = _without_unit_axes(source), _without_unit_axes(target)
    refinement = common_refinement(source.layout, target.layout)
    if refinement is not None and source.layout.cut == "chunk" and source.layout != target.layout:
        # The chunk rule cuts a dim axis by axis (DTensor's nested Shard), so an axis cut into refined
        # axes may cut a size that does not divide otherwise: refine only where every rank's block stays.
        mesh, first, second = refinement
        if rank_boxes(translate(source, mesh, first), shape) != rank_boxes(source, shape) or \
                rank_boxes(translate(target, mesh, second), shape) != rank_boxes(target, shape):
            refinement = None
    if refinement is None:
        if _same_blocks(source, target, shape):
            # Every rank already holds its new block, pending the same sum: no step, nothing to deliver (the
            # bound below would count a resolved sum: the meshes' axes differ, so none is kept by name).
            return (), (0,) * source.layout.num_devices
        src, tgt = source, target
        candidates = (lambda: [_cross_mesh(source, target, shape, dtype)],)
    else:
        mesh, first, second = refinement
        src, tgt = translate(source, mesh, first), translate(target, mesh, second)
        candidates = _candidates(src, tgt, _Sizes(shape, dtype))
    # At the dtype's own itemsize: every element of a resolved sum arrives at least once, summed as float32
    # or moved as bfloat16 after (a bound a bfloat16 sum's float32 messages do not reach).
    bound = lower_bound(src, tgt, shape, np.dtype(dtype).itemsize)
    # Tiers, cheapest to plan first: the stack-rule collectives, the same from
    # pre-sliced starts, then exchanges. A later tier only when none so far meets
    # the bound (then nothing can beat it: ties go to collectives and earlier plans).
    best, best_score = None, None
    for tier in candidates:
        for plan in tier():
            score = _score(plan)
            if best is None or score < best_score:  # the first of the least scores
                best, best_score = plan, score
        if best is not None and (_received(best) or (0,) * len(bound)) == bound:
            break
    if best is None:
        raise PlanError(f"no plan found from {src} to {tgt}")
    return tuple(best), bound


def _without_unit_axes(tl: TensorLayout) -> TensorLayout:
    """`tl` with the mesh axes of size 1 taken out of its tensor map and partial axes (the same block on
    every rank: such an axis splits a dim into one piece and pends a sum of one addend)."""
    size = tl.layout.axis_size
    if all(size(a) > 1 for a in tl.split_axes + tl.partial):
        return tl
    return _with(tl, [tuple(a for a in axes if size(a) > 1) for axes in tl.tensor_map],
                 [a for a in tl.partial if size(a) > 1])


def _received(steps: list[Step]) -> tuple:
    """Per rank, the bytes every step of a plan delivers to it (summed column by column)."""
    return tuple(map(sum, zip(*[s.bytes_received for s in steps])))


def _score(steps: list[Step]) -> tuple:
    received = _received(steps)
    exchanges = sum(isinstance(s, Exchange) for s in steps)
    return (max(received, default=0), sum(received), exchanges, len(steps))


class _Sizes:
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


def _with(tl: TensorLayout, tensor_map, partial) -> TensorLayout:
    """`tl`'s device matrix with `tensor_map` and `partial`: one object per distinct layout.

    Candidate plans build the same intermediate layouts over and over
    (hundreds of thousands while autoshard prices a network at 64 devices);
    each is validated once. An invalid one raises and is not kept.
    """
    key = (tl.layout, tuple(tuple(e) for e in tensor_map), tuple(partial))
    out = _LAYOUTS.get(key)
    if out is None:
        if len(_LAYOUTS) >= 65536:  # a long run over many meshes: start over
            _LAYOUTS.clear()
        out = _LAYOUTS[key] = TensorLayout(*key)
    return out


_LAYOUTS: dict = {}  # (device matrix, tensor map, partial axes) -> the TensorLayout


def _set_dim(tensor_map: Map, tensor_dim: int, axes: tuple) -> list:
    out = list(tensor_map)
    out[tensor_dim] = tuple(axes)
    return out


# -- single moves --------------------------------------------------------------------
def _local_slice(cur, d, axes, sz: _Sizes) -> Step:
    after = _with(cur, _set_dim(cur.tensor_map, d, cur.tensor_map[d] + axes), cur.partial)
    return sz.uniform(LocalSlice, cur, after, axes)


def _reduce_scatter(cur, d, axes, sz: _Sizes) -> Step:
    partial = [a for a in cur.partial if a not in axes]
    after = _with(cur, _set_dim(cur.tensor_map, d, cur.tensor_map[d] + axes), partial)
    return sz.uniform(ReduceScatter, cur, after, axes, tensor_dim=d)


def _allreduce(cur, axes, sz: _Sizes) -> Step:
    after = _with(cur, cur.tensor_map, [a for a in cur.partial if a not in axes])
    return sz.uniform(Allreduce, cur, after, axes)


def _allgather(cur, d, k, sz: _Sizes) -> Step:
    axes = cur.tensor_map[d][-k:]
    after = _with(cur, _set_dim(cur.tensor_map, d, cur.tensor_map[d][:-k]), cur.partial)
    return sz.uniform(Allgather, cur, after, axes, tensor_dim=d)


def _alltoall(cur, i, j, k, sz: _Sizes) -> Step:
    axes = cur.tensor_map[i][-k:]
    tensor_map = _set_dim(cur.tensor_map, i, cur.tensor_map[i][:-k])
    tensor_map[j] = tensor_map[j] + axes
    after = _with(cur, tensor_map, cur.partial)
    return sz.uniform(Alltoall, cur, after, axes, split_dim=j, concat_dim=i)


def _local_zero(cur, after, sz: _Sizes) -> Step:
    axes = tuple(a for a in after.partial if a not in cur.partial)
    return sz.uniform(LocalZero, cur, after, axes)


class _Unsent(Exchange):
    """An exchange candidate with its bytes received only: who sends each box is chosen
    (`exchange_transfers`, the costly part) only for the plan that wins (`_sent`)."""


def _exchange(cur, after, sz: _Sizes) -> Step:
    received = tuple(n * sz.itemsize for n in exchange_received(cur, after, sz.shape))
    return _Unsent(cur, after, (), bytes_received=received)


def _sent(step: Step, sz: _Sizes) -> Step:
    """`step`, an exchange candidate made whole: its transfers and the bytes each rank sends."""
    if type(step) is not _Unsent:
        return step
    if foldable(step.before, step.after, sz.shape):
        return folded_exchange(step.before, step.after, sz.shape, sz.itemsize)
    transfers = exchange_transfers(step.before, step.after, sz.shape)
    return Exchange(step.before, step.after, (), transfers=transfers).sized(sz.shape, sz.itemsize)


# -- the stack rule ---------------------------------------------------------------------
def _push(cur: TensorLayout, tmap: Map, resolve: frozenset, sz: _Sizes) -> Optional[Step]:
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


def _pop(cur: TensorLayout, tmap: Map, sz: _Sizes) -> Optional[Step]:
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


def _stack(cur: TensorLayout, tmap: Map, resolve: frozenset, sz: _Sizes) -> Optional[list]:
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


def _resolve_first(src: TensorLayout, tmap: Map, resolve: frozenset, sz: _Sizes):
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


def _candidates(src: TensorLayout, tgt: TensorLayout, sz: _Sizes) -> tuple:
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


def _from(src: TensorLayout, tgt: TensorLayout, sz: _Sizes) -> list:
    """Stack-rule candidates from `src`, plus exchange builders (functions)."""
    kept = [a for a in src.partial if a in tgt.partial]
    resolve = frozenset(a for a in src.partial if a not in kept)
    new = [a for a in tgt.partial if a not in kept]
    plain = _with(tgt, tgt.tensor_map, kept)  # the target before new partial axes appear
    ends = [(plain.tensor_map, plain)]
    if set(new) & set(src.split_axes):
        # Keep an S axis that becomes P where it is and zero-pad around it: no traffic.
        pad = tuple(want + tuple(a for a in have if a in new)
                    for have, want in zip(src.tensor_map, tgt.tensor_map))
        ends.append((pad, _with(tgt, pad, kept)))
    starts = [(src, [], resolve)]
    if resolve:
        first = _attempt(_resolve_first, src, tgt.tensor_map, resolve, sz)
        if first is not None:
            starts.append((first[1], first[0], frozenset()))
        if src.uneven_dims(sz.shape) or tgt.uneven_dims(sz.shape):
            # Uneven shards a Reduce_scatter cannot cut: sum whole, then exchange (always fits).
            summed = _allreduce(src, tuple(resolve), sz)
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


def _preslices(src: TensorLayout, tgt: TensorLayout, sz: _Sizes) -> list[list[Step]]:
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


def _slices(src: TensorLayout, order: list, choice: tuple, sz: _Sizes) -> list[Step]:
    steps, cur = [], src
    for d in range(src.ndim):
        axes = tuple(a for a, c in zip(order, choice) if c == d)
        if axes:
            steps.append(_local_slice(cur, d, axes, sz))
            cur = steps[-1].after
    return steps


def _same_blocks(source: TensorLayout, target: TensorLayout, shape: tuple) -> bool:
    """Whether every rank holds the same box under both layouts and their pending sums group the ranks alike
    (whatever the meshes: the move is then no step)."""
    if rank_boxes(source, shape) != rank_boxes(target, shape):
        return False
    if not (source.partial or target.partial):
        return True
    return _sum_groups(source) == _sum_groups(target)


def _sum_groups(tl: TensorLayout) -> frozenset:
    return frozenset(frozenset(g) for g in tl.layout.axis_groups(tl.partial))


def _cross_mesh(source: TensorLayout, target: TensorLayout, shape: tuple, dtype: str):
    """Meshes without a common refinement: sum on the source mesh, then exchange boxes (no exchange where
    every rank holds its new box already: it would be a call that moves nothing)."""
    sz = _Sizes(shape, dtype)
    steps, cur = [], source
    if source.partial:
        steps.append(_allreduce(cur, source.partial, sz))
        cur = steps[-1].after
    plain = _with(target, target.tensor_map, ())
    if rank_boxes(cur, shape) != rank_boxes(plain, shape):
        steps.append(_exchange(cur, plain, sz))
    if target.partial:
        steps.append(_local_zero(plain, target, sz))
    return steps
