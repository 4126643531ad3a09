"""The fully sharded trainer's step (ZeRO-3: spmdsim.models.gpt.train with ``zero=3``) called as the pipeline's
trainer is (spmdsim.models.gpt.pipeline.train_pipelined's arguments and its runner's fields), so that the
estimate's dry run (spmdsim.tools.estimate.ledger.gpt_ledger) reads its ledger as it reads any stage's: one
stage, one microbatch in flight, the step's trace."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import SpmdsimError
from ...runtime.trace import collect_trace
from .memory import sharded_problem
from .mesh import model_mesh
from .train import train

__all__ = ["ShardedRun", "train_sharded"]


@dataclass
class ShardedRun:
    """What the estimate reads of a pipeline stage's runner, of the one stage a fully sharded step is."""

    params: dict
    trace: Any
    mesh: Any
    stage: int = 0
    in_flight: tuple = (1,)
    models: dict = field(default_factory=dict)  # the one model, as a stage's chunks (its FP8 scales: the ledger's)

    def close(self) -> None:
        self.mesh.close()


def train_sharded(cfg: Any, comm: Any, pp: int, dp: int, tp: int, steps: int, text_ids: np.ndarray, *,
                  sp: bool = False, schedule: str = "1f1b", microbatches: int = 1, virtual: int = 1,
                  recompute: str = "none", zero: int = 3, kept: str = "graph", memory: bool = False,
                  check: bool = True, ep: int = 1, split: Any = None,
                  reshard_after_forward: bool = True, prefetch: bool = False,
                  precision: Any = "fp64", shard_group: int = 0) -> tuple[ShardedRun, list]:
    """`train(..., zero=3)` on a (dp, tp) mesh over `comm`, its steps traced: (the runner, one StepResult a step).
    `schedule` and `split` have nothing to choose on one stage; the other pipeline arguments are refused where
    they ask for more than one stage, microbatch or expert rank (`sharded_problem`). `shard_group` N between 1
    and dp: hybrid sharding (HSDP) on the mesh (dp / N, N, tp), as examples/train_gpt.py's --shard-group."""
    problem = sharded_problem(pp, microbatches, ep, virtual)
    if problem:  # every rank alike, before any collective
        raise SpmdsimError(problem)
    mesh = model_mesh(cfg, comm, dp, tp, zero=zero, fs=shard_group) if 0 < shard_group < dp else None
    with collect_trace() as trace:
        model, results = train(cfg, comm, dp, tp, steps, text_ids, sp=sp, check=check, recompute=recompute, mesh=mesh,
                               zero=zero, memory=memory, kept=kept, reshard_after_forward=reshard_after_forward,
                               prefetch=prefetch, ep=ep, precision=precision)
    return ShardedRun(model.params, trace, model.mesh, models={0: model}), results
