"""Run a plan for all ranks at once in one process (numpy), to prove plans correct.

The emulator plays every collective exactly as MPI defines it on the groups of
`Layout.axis_groups` (mixed-radix order of the listed axes), so a plan that
passes here moves the same data under mpiexec.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from ...layouts.layout import TensorLayout
from .kernels import exchange_program, local_slice, local_zero
from .record import Plan
from .uneven import check_fits, group_pieces, is_uneven
from .volume import rank_boxes
from .steps import Allgather, Allreduce, Alltoall, Exchange, LocalSlice, LocalZero, ReduceScatter, Step

__all__ = ["emulate", "run_step", "shards_of", "partial_addends", "sum_partials"]

Locals = dict[int, np.ndarray]


def shards_of(tl: TensorLayout, full: np.ndarray) -> Locals:
    """Every rank's block of a (non-partial) global array."""
    return {r: np.ascontiguousarray(full[tuple(slice(a, b) for a, b in box)])
            for r, box in enumerate(rank_boxes(tl, tuple(full.shape)))}


def partial_addends(tl: TensorLayout, full: np.ndarray, seed: int = 0) -> Locals:
    """Every rank's block when `tl` is partial: addends over the partial axes sum to `full`.

    Addends are small integers (exact in float64), so any summation order gives
    the same bits.
    """
    if not tl.partial:
        return shards_of(tl, full)
    rng = np.random.default_rng(seed)
    g = tl.layout.group_size(tl.partial)
    addends = [rng.integers(-8, 8, size=full.shape).astype(full.dtype) for _ in range(g - 1)]
    first = full - sum(addends) if addends else full
    parts = [first] + addends
    index = tl.layout.group_indices(tl.partial).tolist()
    return {r: np.ascontiguousarray(parts[index[r]][tuple(slice(a, b) for a, b in box)])
            for r, box in enumerate(rank_boxes(tl, tuple(full.shape)))}


def sum_partials(tl: TensorLayout, locals_: Locals) -> Locals:
    """Every rank's block with the pending sums over `tl.partial` added up (the value it stands for)."""
    if not tl.partial:
        return dict(locals_)
    out: Locals = {}
    for group in tl.layout.axis_groups(tl.partial):
        total = _sum([locals_[m] for m in group])
        out.update({m: total for m in group})
    return out


@lru_cache(maxsize=1024)
def _axis_groups(layout, axes: tuple) -> tuple:
    return layout.axis_groups(axes)


def run_step(step: Step, locals_: Locals, shape: tuple) -> Locals:
    """Apply one step to every rank's block."""
    out: Locals = {}
    if isinstance(step, LocalSlice):
        return {r: local_slice(step, r, x, shape) for r, x in locals_.items()}
    if isinstance(step, LocalZero):
        return {r: local_zero(step, r, x, shape) for r, x in locals_.items()}
    if isinstance(step, Exchange):
        programs = {r: exchange_program(step, r, shape) for r in locals_}
        sends = {r: programs[r].send_views(x) for r, x in locals_.items()}
        for r, x in locals_.items():
            out[r] = programs[r].assemble(x, (sends[src][r] for src, _, _ in programs[r].places))
        return out
    uneven = step.before.layout.cut != "even" and is_uneven(step, shape)
    for group in _axis_groups(step.before.layout, step.axes):
        blocks = [locals_[m] for m in group]
        g = len(group)
        if uneven and not isinstance(step, (Allgather, Allreduce)):
            check_fits(step, shape)
            sizes = group_pieces(step, shape, group[0])
            g = list(np.cumsum(sizes[0] if isinstance(step, Alltoall) else sizes)[:-1])  # where np.split cuts
        if isinstance(step, Allgather):
            joined = np.concatenate(blocks, axis=step.tensor_dim)
            out.update({m: joined.copy() for m in group})
        elif isinstance(step, Alltoall):
            pieces = [np.split(b, g, axis=step.split_dim) for b in blocks]
            for k, m in enumerate(group):
                out[m] = np.concatenate([p[k] for p in pieces], axis=step.concat_dim)
        elif isinstance(step, Allreduce):
            total = _sum(blocks)
            out.update({m: total.copy() for m in group})
        elif isinstance(step, ReduceScatter):
            pieces = np.split(_sum(blocks), g, axis=step.tensor_dim)
            out.update({m: np.ascontiguousarray(p) for m, p in zip(group, pieces)})
        else:
            raise TypeError(f"unknown step {step!r}")
    return out


def _sum(blocks: list) -> np.ndarray:
    return sum(blocks[1:], blocks[0].copy())


def emulate(plan: Plan, locals_: Locals) -> Locals:
    """Run every step of `plan` on all ranks' blocks; returns the target blocks."""
    for step in plan.steps:
        locals_ = run_step(step, locals_, plan.shape)
    return locals_
