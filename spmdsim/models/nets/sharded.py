"""A seed `Network`'s parameters fully sharded (ZeRO-3; PyTorch FSDP2's ``fully_shard``) over its data axis.

The data axis is the one mesh axis that splits the network input's batch (OneFlow's 2D SBP model: the axis
of its input's S(0)); each parameter, replicated over it, is a pending sum there in the backward. Under
``NetworkTrainer(..., zero=3)`` each stage with parameters is one unit (spmdsim.nn.fsdp.FullyShard.unit):
its parameters are held 1/n on each of the axis's n ranks (dim 0 split over it as well), gathered just
before the stage's operator reads them (one Allgather of them all), freed when its forward ends, gathered again
for its backward, and their gradients reduce-scattered onto the shards (one Reduce_scatter), which the optimizer
steps.
`zero_problem` says, in one line alike on every rank, why a network cannot be sharded so (no axis splits
its batch, a parameter on another device matrix, a dim 0 that does not divide). Pure: no collective.
"""
from __future__ import annotations

from typing import Any, Optional

from ...nn.fsdp import fully_shard, shard_problem
from .model import Network

__all__ = ["data_axis", "zero_problem", "shard_stages"]

#: Why rows a seed network's shards do not divide are refused: its layouts (its dialect's) cut evenly.
_EVEN = "; the network's layouts cut every dim evenly, as its dialect does, so --zero 3 shards dim 0 evenly too"


def data_axis(net: Network) -> Optional[str]:
    """The one mesh axis that splits `net`'s input batch (its first `batch_dims` dims), or None."""
    axes = [a for entry in net.input_layout.tensor_map[:net.batch_dims] for a in entry]
    return axes[0] if len(axes) == 1 else None


def zero_problem(net: Network) -> Optional[str]:
    """Why `net`'s parameters cannot be fully sharded over its data axis (`data_axis`), or None: one line."""
    split = [a for entry in net.input_layout.tensor_map[:net.batch_dims] for a in entry]
    if not split:
        return (f"{net.name}'s input is replicated over every rank: no axis splits its "
                "batch for --zero 3 to shard its parameters over")
    if len(split) > 1:
        return (f"{net.name}'s batch is split over {len(split)} axes {tuple(split)!r}; --zero 3 shards its "
                "parameters over the one axis that splits the batch")
    axis, matrix = split[0], net.input_layout.layout
    for stage in net.stages:
        for p in stage.params:
            name = f"{stage.name}.{p.name}"
            if p.layout.layout != matrix:
                return (f"{net.name}: parameter {name!r} lies on {p.layout.layout}, not on the input's device "
                        f"matrix {matrix} whose axis {axis!r} --zero 3 shards over")
            problem = shard_problem(name, p.layout, tuple(p.source.shape), axis, _EVEN)
            if problem:
                return f"{net.name}: {problem}"
    return None


def shard_stages(net: Network, params: list, mesh_of: Any) -> tuple:
    """(params, units): `params` (per stage, its parameters as DTensor leaves) with each stage's replaced by
    its shards, and per stage its `FullyShard` (None for a stage without parameters). `mesh_of(layout)`: the
    trainer's mesh of a device matrix. Call after `zero_problem(net)` said None."""
    axis = data_axis(net)
    sharded, units = [], []
    for stage, held in zip(net.stages, params):
        if not held:
            sharded.append(held)
            units.append(None)
            continue
        names = [p.name for p in stage.params]
        unit = fully_shard(dict(zip(names, held)), mesh_of(stage.params[0].layout.layout), axis=axis)
        sharded.append(tuple(unit.params[n] for n in names))
        units.append(unit)
    return sharded, units
