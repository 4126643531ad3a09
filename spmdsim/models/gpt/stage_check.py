"""The pipelined training's check (spmdsim.models.gpt.pipeline): every stage's blocks gathered into one table,
and each step's largest differences from the reference step run from them."""
from __future__ import annotations

from typing import Any, Optional
import numpy as np
from .config import GPTConfig
from .params import param_specs
from .train import all_rows
from .wholes import Regions, row, stage_regions
from .checker import StepChecker
from .stage_program import PipelineRun
from .context import checked_order, ring_core
from ...runtime.door import all_gather_object


def _held(run: PipelineRun, cfg: GPTConfig) -> list:
    """The names of the parameters each stage holds, in param_specs' order (every rank knows each stage's)."""
    pp, parts = run.mesh.layout.device_matrix[0], run.parts
    return [[s.name for s in param_specs(cfg)
             if any(parts[c].holds(s.name, cfg.tied) for c in range(stage, len(parts), pp))]
            for stage in range(pp)]


def _stage_regions(run: PipelineRun, cfg: GPTConfig) -> Regions:
    """Where each rank's blocks lie in `_table`'s rows (spmdsim.models.gpt.wholes.stage_regions): worked out once a
    run."""
    layouts = next(iter(run.models.values())).layouts  # every parameter's, alike on every stage
    return stage_regions(_held(run, cfg), layouts, {s.name: s.shape for s in param_specs(cfg)},
                         run.stage_mesh.size)


def _tables(run: PipelineRun, cfg: GPTConfig, where: Regions, tables: list, label: str) -> np.ndarray:
    """`_table` of several tables (name -> this rank's block, of the parameters its stage holds), table after
    table in each row (spmdsim.models.gpt.wholes.assemble reads them so), from one Allgather over the whole mesh (on
    simulated ranks one table they share: spmdsim.models.gpt.train.all_rows)."""
    mesh = run.mesh
    return all_rows(mesh, row(tables, _held(run, cfg)[run.stage], where.width), label).reshape(mesh.size, -1)


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


class _PipelineChecker(StepChecker):
    """`train_pipelined`'s check of each step (`st`: its stage, spmdsim.models.gpt.pipeline._Pipelined;
    spmdsim.models.gpt.checker): the parameters its stage holds, every stage's blocks in one table from one
    Allgather over the whole mesh (`_tables`), every stage's FP8 scales."""

    def __init__(self, st: Any, cfg: GPTConfig, policy: Any, zero: int, kept: str, microbatches: int,
                 first: int) -> None:
        self.st = st
        model = next(iter(st.models.values()))
        # where every rank's blocks lie, and this rank's, asked once (not per step); a context-parallel run's
        # order of the sequence (the reference reads its dropout masks in it), or None
        super().__init__(cfg, st.run.mesh, st.optimizer, policy, zero, kept, microbatches, first,
                         _stage_regions(st.run, cfg), {name: t.slices for name, t in st.params.items()},
                         checked_order(model), ring_core(model))

    def tensors(self) -> dict:
        return self.st.params

    def rows(self, tables: list, label: str) -> np.ndarray:
        return _tables(self.st.run, self.cfg, self.where, tables, label)

    def scales(self) -> Optional[dict]:
        return _scales(self.st.run)
