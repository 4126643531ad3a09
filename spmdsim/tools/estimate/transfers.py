"""A dry run's trace read as the step time's Calls rows (spmdsim.tools.estimate.records): each collective's
buffer as the cost model counts it, the link level of its group and the phase it belongs to.
"""
from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

from ...errors import SpmdsimError
from ...models.axes import CONTEXT, DATA, EXPERT, PIPELINE, SHARD
from ...nn.fsdp_flat import GATHER_LABEL, REDUCE_LABEL, SUM_LABEL
from ...programs.plan.steps import KINDS
from .records import Calls

__all__ = ["GRADIENT_LABELS", "trace_transfers"]


def _level(mesh: Any, rank: int, axes: tuple, gpus_per_node: int) -> str:
    """"node" when every member of `rank`'s group over `axes` of `mesh` shares its node, else "cluster"."""
    layout = mesh.layout
    mine = layout.coords(rank)
    names = layout.alias_name
    free = [i for i, a in enumerate(names) if a in axes]
    node = rank // gpus_per_node
    for values in itertools.product(*(range(layout.device_matrix[i]) for i in free)):
        coords = list(mine)
        for i, v in zip(free, values):
            coords[i] = v
        if layout.rank_of(tuple(coords)) // gpus_per_node != node:
            return "cluster"
    return "node"


#: The trace labels of the sums of gradients (spmdsim.nn.autograd's buckets; ZeRO-1's and ZeRO-2's Reduce_scatter of
#: the gradients and Allgather of the updated parameters): over a data-parallel axis (dp, or ep for the dense
#: layers of an MoE GPT, or cp: each rank saw part of every sequence), a Calls row of phase "gradients". Every other collective a stage runs is its layers'
#: (tensor parallelism's, sequence parallelism's sums of replicated gradients over tp, the experts' dispatch
#: and combine, the router's statistics, the loss's mean), a message between stages the pipeline's, and
#: context parallelism's attention traffic over cp (the ring's messages, the gathers or all-to-alls) "context".
#: ZeRO-3's Reduce_scatter of a unit's gradients (spmdsim.nn.fsdp_flat's REDUCE_LABEL) is a sum, and so is HSDP's
#: Allreduce of its result across the shard groups (SUM_LABEL); its gathers (GATHER_LABEL) are phase "parameters".
GRADIENT_LABELS = ("gradient bucket", "zero-1 gradient bucket", "zero-1 parameter bucket", "zero-2 gradient bucket",
                   "zero-2 parameter bucket", SUM_LABEL)


def trace_transfers(trace: Any, mesh: Any, rank: int, gpus_per_node: int) -> tuple[Calls, ...]:
    """The trace's rows as Calls rows (the cost model's n), equal rows merged into counts; each in its phase
    (GRADIENT_LABELS)."""
    merged: dict = {}
    levels: dict = {}  # axes -> level: one answer per group this rank is in
    sizes: dict = {}  # (op, group size, bytes sent) -> the cost model's n: one answer per kind of row
    for e, times in trace.weighted():
        if e.group_size <= 1:
            continue
        axes = tuple(e.axes)
        level = levels.get(axes)
        if level is None:
            level = levels[axes] = _level(mesh, rank, axes, gpus_per_node)
        if e.op in ("send", "recv", "sendrecv"):
            rows = [("send", e.bytes_sent, e.bytes_sent)] if e.bytes_sent else []
            rows += [("recv", e.bytes_received, 0)] if e.bytes_received else []
            phase = "context" if CONTEXT in axes else "pipeline"
        else:
            n = sizes.get((e.op, e.group_size, e.bytes_sent))
            if n is None:
                n = sizes[e.op, e.group_size, e.bytes_sent] = _buffer_bytes(e.op, e.group_size, e.bytes_sent)
            rows = [(e.op, n, e.bytes_sent)]
            label = e.label or ""
            # (a redistribution's Reduce_scatter over dp: ZeRO-3's gradients onto their shards, spmdsim.nn.fsdp)
            # (a gradient bucket over cp alone, dp 1: each rank saw part of every sequence, its sums are the
            # gradients' too, not context parallelism's messages)
            summed = (label.startswith(GRADIENT_LABELS) and (DATA in axes or EXPERT in axes or CONTEXT in axes)
                      or e.op == "reduce_scatter" and label.startswith(("redistribute", REDUCE_LABEL))
                      and (DATA in axes or EXPERT in axes or SHARD in axes))
            gathered = e.op == "allgather" and label.startswith(("redistribute", GATHER_LABEL)) and (
                DATA in axes or SHARD in axes)
            phase = "pipeline" if PIPELINE in axes else ("gradients" if summed else "parameters" if gathered
                                                         else "context" if CONTEXT in axes else "layers")
        for op, n, sent in rows:
            key = (op, e.group_size if op not in ("send", "recv") else 2, n, level, phase, sent)
            merged[key] = merged.get(key, 0) + times
    return tuple(Calls(op, g, n, level, phase, count, sent) for (op, g, n, level, phase, sent), count
                 in merged.items())


def _buffer_bytes(op: str, group_size: int, sent: int) -> int:
    """The cost model's n of a collective `op` on a group of `group_size` that sent `sent` bytes a rank."""
    kind = KINDS.get("alltoall" if op == "alltoallv" else op)  # (an Alltoallv's buffer: an Alltoall's)
    if kind is None:
        raise SpmdsimError(f"internal: the ledger has no cost model name for the collective {op!r}")
    return int(kind.buffer_bytes(group_size, Fraction(sent)))
