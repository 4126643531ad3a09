"""Demo scenario: one AdamW training step of a small GPT (spmdsim.models.gpt) on a dp x tp mesh.

The row runs the step on the mesh (every operator a general rule) and checks
the token embedding's gradient, which the whole backward feeds (the tied head
and the lookup), against the same step in one numpy process
(spmdsim.models.gpt.reference). The model is float64 whatever ``--dtype`` says.
"""
from __future__ import annotations

from math import gcd
from typing import Any, Optional

from . import training as _training  # (imported first, so this row is listed after the others)
from .registry import Context, Job, scenario
from ...models.axes import DATA, TENSOR, roles_of
from ...layouts.layout import Layout
from ...models.gpt import GPTConfig, batch, encode, load_text
from ...models.gpt.parallel import mesh_problem
from ...models.gpt.reference import init_params, loss_and_grads
from ...models.gpt.train import train
from ...runtime import Mesh

__all__ = ["gpt_job", "gpt_needs"]

del _training


def _config() -> Any:
    return GPTConfig(layers=1, d_model=16, heads=4, seq=8, batch=4, dropout=0.1)


def _mesh_shape(world: int) -> tuple[int, int]:
    tp = gcd(world, 4)  # the heads (4) split over tp
    return world // tp, tp


def gpt_needs(world_size: int) -> Optional[str]:
    """Reason to skip: the mesh the row would use cannot split the model."""
    dp, tp = _mesh_shape(world_size)
    problem = mesh_problem(_config(), dp, tp, True)
    return None if problem is None else f"dp {dp} x tp {tp}: {problem}"


def gpt_job(ctx: Context) -> Job:
    """A Job running one training step; its output is the token embedding's gradient."""
    cfg = _config()
    dp, tp = _mesh_shape(ctx.world_size)
    ids = encode(load_text(20_000))
    x, y = batch(ids, cfg, 0)
    ref = loss_and_grads(init_params(cfg), x, y, cfg, 0)[1]["wte"]

    mesh = Mesh(Layout((dp, tp), (DATA, TENSOR)), ctx.comm, roles=roles_of((DATA, TENSOR)))

    def forward() -> Any:
        model, _ = train(cfg, ctx.comm, dp, tp, 1, ids, sp=True, check=False, mesh=mesh)
        return model.params["wte"].grad

    return Job("AdamW step: GPT", f"dp {dp} x tp {tp}, sp -> dwte(\"tp\", None)", mesh, forward,
               lambda region: ref[tuple(region)], {}, (), 1e-10 * float(abs(ref).max()))


scenario("train_gpt", "A 1-layer GPT: one AdamW step with sequence parallelism, gradient of the token "
         "embedding", gpt_needs)(gpt_job)
