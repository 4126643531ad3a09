"""The pipelined training's check (spmdsim.models.gpt.pipeline): every stage's blocks gathered into one table,
and each step's largest differences from the reference step run from them."""
from __future__ import annotations

from typing import Any, Optional
import numpy as np
from .config import GPTConfig
from .params import param_specs
from .train import all_rows
from .wholes import Regions, stage_regions
from ...runtime.executor import pending, resolve
from ...runtime.shared_reference import shared_once
from ...runtime.sim import once
from .train import _optimizer_start
from .stage_program import PipelineRun
from .step_check import _summed_grads, resolved_errors, step_errors
from .tolerances import flip_tolerance, rounding_tolerance
from .buckets import anchored_start, anchored_updates
from .reference_step import _checked_mixed, _checked_reference, _resumed_moments, _zero_moments
from .context import checked_order, ring_core
from ...runtime.door import all_gather_object


def _held(run: PipelineRun, cfg: GPTConfig) -> list:
    """The names of the parameters each stage holds, in param_specs' order (every rank knows each stage's)."""
    pp, parts = run.mesh.layout.device_matrix[0], run.parts
    return [[s.name for s in param_specs(cfg)
             if any(parts[c].holds(s.name, cfg.tied) for c in range(stage, len(parts), pp))]
            for stage in range(pp)]


def _stage_regions(run: PipelineRun, cfg: GPTConfig) -> Regions:
    """Where each rank's blocks lie in `_table`'s rows (spmdsim.models.gpt.wholes.stage_regions): worked out once a run."""
    layouts = next(iter(run.models.values())).layouts  # every parameter's, alike on every stage
    return stage_regions(_held(run, cfg), layouts, {s.name: s.shape for s in param_specs(cfg)},
                         run.stage_mesh.size)


def _tables(run: PipelineRun, cfg: GPTConfig, where: Regions, tables: list, label: str) -> np.ndarray:
    """`_table` of several tables (name -> this rank's block, of the parameters its stage holds), table after
    table in each row (spmdsim.models.gpt.wholes.assemble reads them so), from one Allgather over the whole mesh (on
    simulated ranks one table they share: spmdsim.models.gpt.train.all_rows)."""

    mesh = run.mesh
    flat = np.zeros(where.width * len(tables))
    for k, table in enumerate(tables):
        at = k * where.width
        for name in _held(run, cfg)[run.stage]:
            block = np.asarray(table[name], np.float64).reshape(-1)
            flat[at:at + block.size] = block
            at += block.size
    return all_rows(mesh, flat, label).reshape(mesh.size, -1)


def _table(run: PipelineRun, cfg: GPTConfig, where: Optional[Regions] = None) -> np.ndarray:
    """Every rank's blocks of the parameters its stage holds, a row per rank (float64, padded to the largest
    stage's), from one Allgather over the whole mesh."""
    return _tables(run, cfg, where or _stage_regions(run, cfg), [{name: t.local for name, t in run.params.items()}],
                   "check.params")


def _scales(run: PipelineRun) -> Optional[dict]:
    """Under FP8 every stage's scales of this step (key -> scale: each chunk's GPT's `Scales.snapshot`), on every
    rank (one gather of objects over the whole mesh, the check's own traffic); None without FP8."""
    models = [m for m in run.models.values() if m.fp8 is not None]
    if not models:
        return None
    mine: dict = {}
    for model in models:
        mine.update(model.fp8.snapshot())
    every: dict = {}
    for theirs in all_gather_object(run.mesh.comm, mine)[::run.stage_mesh.size]:  # (a stage's ranks agree)
        every.update(theirs)
    return dict(sorted(every.items()))


class _PipelineChecker:
    """`train_pipelined`'s check of each step (`st`: its stage, spmdsim.models.gpt.pipeline._Pipelined): the
    reference step from every stage's parameters at the step's start (`start`), then each rank's largest
    differences from it, the worst over the whole mesh (`errors`)."""

    def __init__(self, st: Any, cfg: GPTConfig, policy: Any, zero: int, kept: str, microbatches: int,
                 first: int) -> None:
        self.st, self.cfg, self.policy, self.zero, self.kept, self.microbatches = st, cfg, policy, zero, kept, \
            microbatches
        self.low = low = policy.activation != "float64"
        self.flip = flip_tolerance(policy, cfg)  # FP8's flips (step_check.flip_ratio)
        self.rounding = rounding_tolerance(policy, cfg)  # each gradient's own (step_check.rounding_ratio)
        run, optimizer, params, mesh = st.run, st.optimizer, st.params, st.run.mesh
        # where every rank's blocks lie, and this rank's, asked once (not per step)
        self.where = where = _stage_regions(run, cfg)
        self.slices = {name: t.slices for name, t in params.items()}
        # a context-parallel run's order of the sequence (the reference reads its dropout masks in it), or None
        model = next(iter(st.models.values()))
        self.laid, self.ring = checked_order(model), ring_core(model)
        self.moments = None
        if not low and first:  # the reference's moments: the run's at the checkpoint, whole (collective)
            self.moments = shared_once(mesh, ("gpt-resumed", cfg, microbatches, first), _resumed_moments, where,
                                       where.used(_tables(run, cfg, where, _optimizer_start(optimizer, params),
                                                          "check.start")))
        elif not low:
            self.moments = once(("gpt-reference", cfg, 0), _zero_moments, cfg)

    def start(self) -> None:
        st, cfg, where = self.st, self.cfg, self.where
        self.own = None
        self.scales = _scales(st.run)  # FP8: the scales every stage's casts use this step, all of them
        if self.low:  # the optimizer's view of the step's start: master copies and moments, every rank's
            self.begun = where.used(_tables(st.run, cfg, where, _optimizer_start(st.optimizer, st.params),
                                            "check.start"))
        else:
            self.begun = where.used(_table(st.run, cfg, where))  # the step's start, every rank's
            self.own = anchored_start(st.optimizer, st.params)  # this rank's start (train.py's)

    def errors(self, value: float, x: np.ndarray, y: np.ndarray, step: int) -> tuple:
        st, cfg, where, zero, policy, microbatches = self.st, self.cfg, self.where, self.zero, self.policy, \
            self.microbatches
        optimizer, params, mesh, start, own = st.optimizer, st.params, st.run.mesh, self.begun, self.own
        if self.low:  # as train.py's: the optimizer on the run's own gradients, the rest on the policy's
            summed, masters = _summed_grads(optimizer, params, zero)
            run_grads = where.used(_tables(st.run, cfg, where, [summed], "check.grads"))
            ref_loss, grads, updated, top = shared_once(
                mesh, ("gpt-mixed", cfg, policy.name, microbatches, step), _checked_mixed, where, start, run_grads,
                x, y, cfg, step, policy, microbatches, None, self.kept, self.laid, self.scales, self.ring)
            local = step_errors(value, ref_loss, grads, updated, params, optimizer if zero else None, masters, top,
                                self.slices, flip=self.flip, rounding=self.rounding)
        else:
            # The wholes, the reference step and its peaks: computed once for all the ranks (rank 0's under MPI).
            self.moments, ref_loss, grads, updated, top = shared_once(
                mesh, ("gpt-reference", cfg, microbatches, step + 1), _checked_reference, where, start, self.moments,
                x, y, cfg, step, microbatches, None, self.laid)
            local = step_errors(value, ref_loss, grads, updated, params, optimizer if zero else None, None, top,
                                self.slices, None if own is None else anchored_updates(own, params, cfg, optimizer))
        worst = resolve(mesh, local, pending(mesh.layout, 1, tuple(mesh.layout.alias_name)), "check", reduction="max",
                        owned=True)
        return resolved_errors(worst)
