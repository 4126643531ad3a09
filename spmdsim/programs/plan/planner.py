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

from functools import lru_cache
from typing import Sequence

import numpy as np

from ...errors import PlanError
from ...layouts.layout import TensorLayout
from ...base.tables import put
from ...base.validate import counted, dtype_arg
from .candidates import Sizes, cross_mesh, sent_step, stack_candidates, with_map
from .meshes import common_refinement, translate
from .record import Plan
from .steps import Exchange, Step
from .volume import lower_bound, rank_boxes

__all__ = ["plan_redistribution"]


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
    try:
        put(_VALIDATED, (source, target, shape, dtype), plan, 4096, starts_over=False)
    except TypeError:
        pass
    return plan


_VALIDATED: dict = {}  # a full table adds nothing more: a new key plans again
_INT_ONLY = frozenset((int,))


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
    sz = Sizes(shape, dtype)
    return Plan(source, target, shape, dtype, tuple(sent_step(step, sz) for step in steps), bound)


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
        candidates = (lambda: [cross_mesh(source, target, shape, dtype)],)
    else:
        mesh, first, second = refinement
        src, tgt = translate(source, mesh, first), translate(target, mesh, second)
        candidates = stack_candidates(src, tgt, Sizes(shape, dtype))
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
    return with_map(tl, [tuple(a for a in axes if size(a) > 1) for axes in tl.tensor_map],
                 [a for a in tl.partial if size(a) > 1])


def _received(steps: list[Step]) -> tuple:
    """Per rank, the bytes every step of a plan delivers to it (summed column by column)."""
    return tuple(map(sum, zip(*[s.bytes_received for s in steps])))


def _score(steps: list[Step]) -> tuple:
    received = _received(steps)
    exchanges = sum(isinstance(s, Exchange) for s in steps)
    return (max(received, default=0), sum(received), exchanges, len(steps))


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
