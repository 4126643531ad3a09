"""Demo scenarios of whole seed networks (`spmdsim.models.nets`, docs/reference/networks.md).

Each runs the full forward pass, redistributing wherever one operator's output
layout differs from what the next requires, and checks the output against a
numpy reference of the whole network; its row gives the collectives of the pass.
"""
from __future__ import annotations

from typing import Any, Callable

from ...models.nets import (
    Network, NetworkRunner, mindspore_layout, mindspore_tutorial, needs_eight, network_atol,
    oneflow_2d_sbp, oneflow_2d_signature, oneflow_needs, paddle_needs, paddle_tp, reference_rows,
)
from . import ops as _ops  # noqa: F401  (the single-operator seed scenarios are listed first)
from .jobs import short
from .registry import Context, Job, scenario

__all__ = ["network_job", "seed_network_builder"]


def network_job(net: Network, comm: Any) -> Job:
    """A Job running the whole network; its mesh is the output's (the others close after the pass)."""
    runner = NetworkRunner(net, comm)
    x = runner.input()

    def forward() -> Any:
        out = runner.forward(x).output
        runner.close(keep=runner.out_mesh)  # run_job closes the output mesh after the check
        return out

    ops = ">".join(s.name for s in net.stages)
    upto = len(net.stages)
    # The layouts of the network's input and output, as the operator rows write theirs.
    return Job(
        ops, f"x{short(net.input_layout)} -> {short(net.out)}",
        runner.out_mesh, forward, lambda region: reference_rows(net, upto, region),
        {"x": x}, (), network_atol(net),
    )


def seed_network_builder(job: Callable[[Network, Any], Job],
                         make: Callable[..., Network]) -> Callable[[Context], Job]:
    """A scenario's build: `make` the seed network for the context, then `job(net, comm)` (also training's)."""
    def build(ctx: Context) -> Job:
        return job(make(ctx.world_size, dtype=ctx.dtype, seed=ctx.seed), ctx.comm)

    return build


def _build(make: Callable[..., Network]) -> Callable[[Context], Job]:
    return seed_network_builder(network_job, make)


scenario("net_mindspore_tutorial", "MindSpore tutorial net: flatten > 3 MatMul.shard, 2 ReLU",
         needs_eight)(_build(mindspore_tutorial))
scenario("net_mindspore_layout", "MindSpore tutorial net with Layout((2,2,2)) / Layout((8,))",
         needs_eight)(_build(mindspore_layout))
scenario("net_paddle_tp", "Paddle split net: Embedding > column Linear > row Linear",
         paddle_needs)(_build(paddle_tp))
scenario("net_oneflow_2d_sbp", "OneFlow 2D SBP net: Linear > ReLU > Linear, x (B, S(0))",
         oneflow_needs)(_build(oneflow_2d_sbp))
scenario("net_oneflow_2d_signature", "OneFlow 2D SBP net, Linear1 w (S(1), B): y (S(2), S(0))",
         oneflow_needs)(_build(oneflow_2d_signature))
