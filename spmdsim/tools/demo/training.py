"""Demo scenarios of training steps: a seed network's forward, backward and SGD step in one row.

Each row runs one step of `spmdsim.models.nets.train.NetworkTrainer` (cross-entropy
against seeded labels, SGD lr 1e-2) on the network's own seeded input, and
checks the gradient of its first weight (which the whole backward feeds)
against `spmdsim.models.nets.reference`; the row's collectives are the forward's and
the backward's together (docs/howto/train.md splits them). The check follows the
magnitudes that entered each gradient element (`ReferenceStep.grad_scales`,
as `NetworkTrainer.check`), not the gradient's largest entry: an element near
zero made of large terms keeps the rounding those terms can have.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...models.nets import (Network, mindspore_tutorial, needs_eight, oneflow_2d_sbp, oneflow_needs, paddle_needs,
                    paddle_tp)
from . import networks as _networks  # (imported first, so the operator and network rows are listed first)
from .jobs import short
from ...references.tolerances import sum_rtol
from .registry import Context, Job, scenario
from ...models.nets.reference import ReferenceTrainer
from ...models.nets.train import NetworkTrainer

__all__ = ["training_job"]


def training_job(net: Network, comm: Any) -> Job:
    """A Job running one training step; its output is the first weight's gradient."""
    trainer = NetworkTrainer(net, comm)
    x = net.source.full()
    classes = net.out_shape[-1]
    labels = np.random.default_rng(0).integers(0, classes, int(np.prod(net.out_shape[:-1])))
    weight = trainer.flat_params[0]
    ref = ReferenceTrainer(net).step(x, labels)
    # Each element within 2 k eps (two computations, each summing in its own order) x the magnitudes that
    # entered it, k the longest sum of the step (a batch's rows or a parameter's dimension): not x
    # max|grad|, which an element of large cancelling terms can exceed (docs/explanation/tolerances.md, "Tolerances").
    params = [p.source for stage in net.stages for p in stage.params]
    longest = max([int(np.prod(net.out_shape[:-1]))] + [d for p in params for d in p.shape])
    rtol, scale = 2 * sum_rtol(longest, params[0].dtype), ref.grad_scales[0]  # (an embedding's input is ids)

    def forward() -> Any:
        trainer.step(x, labels)
        trainer.close(keep=weight.mesh)  # run_job closes this one after the check
        return weight.grad

    stages = ">".join(s.name for s in net.stages)
    return Job(f"SGD step: {stages}", f"x{short(net.input_layout)} -> dW{short(weight.layout)}",
               weight.mesh, forward, lambda region: ref.grads[0][tuple(region)], {"W": weight}, (),
               atol=0.0, rtol=rtol, scale=lambda region: scale[tuple(region)])


def _build(make: Callable[..., Network]) -> Callable[[Context], Job]:
    return _networks.seed_network_builder(training_job, make)


scenario("train_mindspore_tutorial", "MindSpore tutorial net: one SGD step, gradient of MatMul1's weight",
         needs_eight)(_build(mindspore_tutorial))
scenario("train_paddle_tp", "Paddle split net: one SGD step, gradient of the embedding table",
         paddle_needs)(_build(paddle_tp))
scenario("train_oneflow_2d_sbp", "OneFlow 2D SBP net: one SGD step, gradient of Linear1's weight",
         oneflow_needs)(_build(oneflow_2d_sbp))
