"""The links a step's transfers cross, as spmdsim.programs.cost's alpha-beta models: a machine file's level
(`level_model`), a ring collective's several ports across nodes (`lane_model`), one call's seconds
(`link_seconds`)."""
from __future__ import annotations

from dataclasses import replace

from ...programs.cost.model import CostModel
from .machine_records import Machine

__all__ = ["P2P", "RINGS", "level_model", "lane_model", "link_seconds"]

#: Point-to-point messages (a Calls row's kind), priced alpha + n beta.
P2P = ("send", "recv")
#: The collectives whose rings take every member's network port across nodes (`lane_model`).
RINGS = ("allreduce", "allgather", "reduce_scatter")


def level_model(machine: Machine, level: str) -> CostModel:
    """spmdsim.programs.cost's model of one level's link: alpha = latency, beta = 1 / (bandwidth * efficiency), gamma =
    1 / reduction rate."""
    link = machine.link(level)
    gamma = 0.0 if machine.reduction_rate is None else 1.0 / machine.reduction_rate
    return CostModel(alpha_s=link.latency, beta_s_per_byte=1.0 / link.achieved, gamma_s_per_byte=gamma,
                     algorithm=machine.algorithm, source=f"machine {machine.name} {level} link")


def lane_model(models: dict[str, CostModel], level: str, lanes: int, kind: str) -> CostModel:
    """The link model of a `kind` call at `level` whose group has `lanes` members on a node (`level_model`'s, by
    level): a ring collective across nodes (allreduce, allgather, reduce_scatter) runs a ring a member's port,
    side by side, so its bytes cross at `lanes` ports' bandwidth, no faster than the node's links its ring also
    takes (the NCCL maintainers: a node's 400 Gb/s NICs, about 48 GB/s each, aggregate to about 396 GB/s
    with the ring, and an alltoall does not aggregate them: NVIDIA/nccl-tests issues 319 and 267)."""
    model = models[level]
    if level != "cluster" or lanes <= 1 or kind not in RINGS:
        return model
    return replace(model, beta_s_per_byte=max(model.beta_s_per_byte / lanes, models["node"].beta_s_per_byte))


def link_seconds(model: CostModel, kind: str, group: int, nbytes: int) -> float:
    """Seconds of one call of `kind` over `group` ranks moving `nbytes` (the cost model's n) on a level's link
    model (`level_model`): a message ("send", "recv") alpha + n beta, a collective the model's formula."""
    if kind in P2P:
        return model.alpha_s + nbytes * model.beta_s_per_byte
    return model.predict(kind, group, nbytes)
