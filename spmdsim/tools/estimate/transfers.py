"""A dry run's trace read as the step time's Calls rows (spmdsim.tools.estimate.records): each collective's
buffer as the cost model counts it, the link level of its group and the phase it belongs to.
"""
from __future__ import annotations

import itertools
import math
from fractions import Fraction
from functools import lru_cache
from typing import Any

from ...base.precision import named_dtype
from ...errors import SpmdsimError
from ...models.axes import CONTEXT, DATA, EXPERT, PIPELINE, SHARD
from ...nn.fsdp_flat import GATHER_LABEL, REDUCE_LABEL, SUM_LABEL
from ...programs.plan.steps import KINDS
from .held import _RUN
from .records import Calls

__all__ = ["GRADIENT_LABELS", "PARAMETER_LABELS", "placed", "trace_calls", "trace_transfers", "uneven_on_nodes"]


def _members(mesh: Any, rank: int, axes: tuple) -> tuple:
    """The ranks of `rank`'s group over `axes` of `mesh`."""
    layout = mesh.layout
    mine = layout.coords(rank)
    names = layout.alias_name
    free = [i for i, a in enumerate(names) if a in axes]
    members = []
    for values in itertools.product(*(range(layout.device_matrix[i]) for i in free)):
        coords = list(mine)
        for i, v in zip(free, values):
            coords[i] = v
        members.append(layout.rank_of(tuple(coords)))
    return tuple(members)


#: The trace labels of the sums of gradients (spmdsim.nn.autograd's buckets; ZeRO-1's and ZeRO-2's Reduce_scatter of
#: the gradients and Allgather of the updated parameters): over a data-parallel axis (dp, or ep for the dense
#: layers of an MoE GPT, or cp: each rank saw part of every sequence), a Calls row of phase "gradients". Every other
#: collective a stage runs is its layers' (tensor parallelism's, sequence parallelism's sums of replicated gradients
#: over tp, the experts' dispatch and combine, the router's statistics, the loss's mean), a message between stages the
#: pipeline's, and context parallelism's attention traffic over cp (the ring's messages, the gathers or all-to-alls)
#: "context". ZeRO-3's Reduce_scatter of a unit's gradients (spmdsim.nn.fsdp_flat's REDUCE_LABEL) is a sum, and so is
#: HSDP's Allreduce of its result across the shard groups (SUM_LABEL); its gathers (GATHER_LABEL) are
#: phase "parameters".
GRADIENT_LABELS = ("gradient bucket", "zero-1 gradient bucket", "zero-1 parameter bucket", "zero-2 gradient bucket",
                   "zero-2 parameter bucket", SUM_LABEL)
#: Of those, the gathers of the updated parameters: their elements are the parameters' (Calls.role).
PARAMETER_LABELS = ("zero-1 parameter bucket", "zero-2 parameter bucket")


def trace_transfers(trace: Any, mesh: Any, rank: int, gpus_per_node: int) -> tuple[Calls, ...]:
    """The trace's rows as Calls rows (the cost model's n), equal rows merged into counts; each in its phase
    (GRADIENT_LABELS) and at its group's level on nodes of `gpus_per_node`: `placed(trace_calls(...))`."""
    return placed(*trace_calls(trace, mesh, rank), rank, gpus_per_node)


def trace_calls(trace: Any, mesh: Any, rank: int) -> tuple[tuple, dict]:
    """`trace_transfers`' rows before they are placed on nodes, and the groups they ran on: ((kind, group, nbytes,
    axes, phase, count, sent, width, role, to), ...: Calls' fields, `_widths`, PARAMETER_LABELS; `to`: a pipeline
    message's peers, `_messages`) and {axes: the ranks of `rank`'s group over them} (a message's: the axes it
    crosses). A dry run's rows do not depend on the machine's node size, which
    `placed` applies: a search or an estimate that asks for the same run on nodes of another size places them
    again (spmdsim.tools.estimate.ledger.gpt_ledger)."""
    merged: dict = {}
    groups: dict = {}  # axes -> this rank's group over them
    sizes: dict = {}  # (op, group size, bytes sent) -> the cost model's n: one answer per kind of row
    for e, times in trace.weighted():
        if e.group_size <= 1:
            continue
        axes = tuple(e.axes)
        if axes not in groups:
            groups[axes] = _members(mesh, rank, axes)
        width, scale = _widths(e.dtype)
        role = "parameters" if (e.label or "").startswith(PARAMETER_LABELS) else ""
        if e.op in ("send", "recv", "sendrecv"):
            phase = "context" if CONTEXT in axes else "pipeline"
            rows = _messages(e, groups[axes] if phase == "pipeline" else ())
        else:
            sent = e.bytes_sent * scale
            n = sizes.get((e.op, e.group_size, sent))
            if n is None:
                n = sizes[e.op, e.group_size, sent] = _buffer_bytes(e.op, e.group_size, sent)
            rows = [(e.op, n, sent, ())]
            phase = _phase(e.op, e.label or "", axes)
        for op, n, sent, to in rows:
            key = (op, e.group_size if op not in ("send", "recv") else 2, n, axes, phase, sent, width, role, to)
            merged[key] = merged.get(key, 0) + times
    return tuple((op, g, n, axes, phase, count, sent, width, role, to)
                 for (op, g, n, axes, phase, sent, width, role, to), count in merged.items()), groups


def _messages(e: Any, members: tuple) -> list:
    """The (kind, n, sent, to) rows of a trace's group of messages `e`: its sends, then its receives, each one
    row; `to`: the bytes each way by peer, (the peer's rank, bytes), where `members` (the ranks of the
    group, in its order) names them and the entry says its partners (a pipeline's), else ()."""
    partners = e.partners if members else ()
    rows = []
    for way, kind, total in ((1, "send", e.bytes_sent), (2, "recv", e.bytes_received)):
        if total:
            to = tuple((members[p[0]], p[way]) for p in partners if p[way])
            rows.append((kind, total, total if kind == "send" else 0, to))
    return rows


@lru_cache(maxsize=None)
def _widths(dtype: str) -> tuple[int, int]:
    """(Calls.width, the factor to the run's bytes) of a trace row whose elements are `dtype` (TraceEntry.dtype):
    the run's floats (float64, or a float32 the program keeps at any precision, as the sums of FP8 products
    that TransformerEngine moves in bfloat16) priced at the precision's width, counted at the run's 8 bytes an
    element; a message's (no dtype: the run's activations) likewise; other elements (bytes: FP8 values;
    integers) at their own width."""
    if not dtype:
        return 0, 1
    kind = named_dtype(dtype)
    if kind.kind == "f" and kind.itemsize > 1:
        return 0, _RUN // kind.itemsize
    return kind.itemsize, 1


def _phase(op: str, label: str, axes: tuple) -> str:
    """The phase of a collective `op` (not a message) labelled `label` over `axes` (GRADIENT_LABELS)."""
    # (a redistribution's Reduce_scatter over dp: ZeRO-3's gradients onto their shards, spmdsim.nn.fsdp)
    # (a gradient bucket over cp alone, dp 1: each rank saw part of every sequence, its sums are the
    # gradients' too, not context parallelism's messages)
    # (ZeRO-3's over cp too, with or without dp: FSDP shards over the context-parallel ranks, which hold the same
    # parameters; by its labels, not context parallelism's own gathers of keys and values over cp)
    summed = (label.startswith(GRADIENT_LABELS) and (DATA in axes or EXPERT in axes or CONTEXT in axes)
              or op == "reduce_scatter" and label.startswith(("redistribute", REDUCE_LABEL))
              and (DATA in axes or EXPERT in axes or SHARD in axes)
              or op == "reduce_scatter" and label.startswith(REDUCE_LABEL) and CONTEXT in axes)
    gathered = op == "allgather" and (label.startswith(("redistribute", GATHER_LABEL)) and (
        DATA in axes or SHARD in axes) or label.startswith(GATHER_LABEL) and CONTEXT in axes)
    return "pipeline" if PIPELINE in axes else ("gradients" if summed else "parameters" if gathered
                                                else "context" if CONTEXT in axes else "layers")


def placed(calls: tuple, groups: dict, rank: int, gpus_per_node: int, ranks: tuple = ()) -> tuple[Calls, ...]:
    """`trace_calls`' rows and groups of `rank` as Calls rows on nodes of `gpus_per_node`: "node" where every member
    of the row's group shares `rank`'s node, else "cluster", its lanes the fewest members any node holds of the
    groups of that axis among `ranks` (its stage's; `rank`'s group alone where not given) that cross nodes; a
    message that names its peers (a pipeline's: its `to`) by its peers instead, "node" where the peer shares
    `rank`'s node (a group of messages to peers of both kinds: a row of each, the bytes of its peers); rows then
    equal merged into counts (in the trace's order)."""
    node = rank // gpus_per_node
    here = {axes: sum(m // gpus_per_node == node for m in members) for axes, members in groups.items()}
    levels = {axes: ("node", 1) if here[axes] == len(groups[axes]) else
              ("cluster", _fewest_lanes(tuple(sorted(groups[axes])), tuple(ranks), gpus_per_node)) for axes in groups}
    merged: dict = {}
    for op, g, n, axes, phase, count, sent, width, role, to in calls:
        level, lanes = levels[axes]
        lanes = min(lanes, g)  # a message's group is its 2 ranks, its axes' the whole pipeline (pp 8 x dp 2: 4)
        for level, n, sent in _by_level(to, node, gpus_per_node, op) if to else ((level, n, sent),):
            key = (op, g, n, level, phase, sent, width, role, lanes if level == "cluster" else 1)
            merged[key] = merged.get(key, 0) + count
    return tuple(Calls(op, g, n, level, phase, count, sent, width, role, lanes)
                 for (op, g, n, level, phase, sent, width, role, lanes), count in merged.items())


@lru_cache(maxsize=1024)
def _fewest_lanes(members: tuple, ranks: tuple, gpus_per_node: int) -> int:
    """The fewest of a group's members on one node, where the group crosses nodes: a ring across them runs at that
    many ports' bandwidth (spmdsim.tools.estimate.links.lane_model), the side with fewer its bottleneck (--tp 12 on
    8-GPU nodes: ranks 0-11 are 8 on node 0 and 4 on node 1, 4 lanes). Over the groups of the same axes among
    `ranks` (those of `members`' stage, in order) where every member is one of them: the slowest group's (--tp 10:
    ranks 0-9 are 8 + 2, ranks 10-19 6 + 4; 2), each group `members`' offsets from its first rank."""
    def fewest(group: Any) -> int:  # (a group within one node: len(group), more than any crossing group's)
        per_node: dict = {}
        for m in group:
            per_node[m // gpus_per_node] = per_node.get(m // gpus_per_node, 0) + 1
        return min(per_node.values()) if len(per_node) > 1 else len(members)

    least = fewest(members)
    if not ranks or not set(members) <= set(ranks):  # (a pipeline's group: its members are other stages')
        return least
    offsets, left, own = [m - members[0] for m in members], set(ranks), least
    for first in ranks:
        if first in left:
            group = [first + o for o in offsets]
            if not left.issuperset(group):  # not the translates of one group: its own alone
                return own
            left.difference_update(group)
            least = min(least, fewest(group))
    return least


def _by_level(to: tuple, node: int, gpus_per_node: int, op: str) -> tuple:
    """(level, n, sent) of the messages `to` ((peer, bytes), ...) of kind `op` a rank on `node` posts together:
    the bytes to (or from) peers on its node, then to others, each a message of its level."""
    near = sum(n for peer, n in to if peer // gpus_per_node == node)
    far = sum(n for _, n in to) - near
    return tuple((level, n, n if op == "send" else 0) for level, n in (("node", near), ("cluster", far)) if n)


def _buffer_bytes(op: str, group_size: int, sent: int) -> int:
    """The cost model's n of a collective `op` on a group of `group_size` that sent `sent` bytes a rank."""
    kind = KINDS.get("alltoall" if op == "alltoallv" else op)  # (an Alltoallv's buffer: an Alltoall's)
    if kind is None:
        raise SpmdsimError(f"internal: the ledger has no cost model name for the collective {op!r}")
    return int(kind.buffer_bytes(group_size, Fraction(sent)))


def uneven_on_nodes(axes: tuple, pp: int, gpus_per_node: int) -> tuple | None:
    """Where a mesh's groups do not fall alike on nodes of `gpus_per_node` (its ranks in order, `axes` its
    ((name, size), ...) innermost first, the pipeline's `pp` stages outermost, "pp"): (name, size, the sizes' product
    up to it, a rank whose group of that axis is within its node, a rank of the same stage whose group is not),
    else None.

    `placed` prices a stage's transfers from one rank's groups, as every rank of the stage: tp 6 on 8-GPU nodes
    puts ranks 0-5 on one node and ranks 6-11 on two, whose collectives cross the cluster's links."""
    stride, world = 1, pp
    for _, size in axes:
        world *= size
    for name, size in (*axes, (PIPELINE, pp)):  # (the pipeline's too: a stage's messages to its neighbours')
        block = stride * size
        # (within a node from every rank where blocks of them fill nodes; across nodes from every rank where the
        # members are nodes apart or a group spans more ranks than a node holds)
        if size > 1 and gpus_per_node % block and stride % gpus_per_node and (size - 1) * stride < gpus_per_node:
            per_stage = world // pp
            for first in range(0, world, per_stage):
                seen: dict = {}
                # (the placements repeat every lcm(node, block) ranks)
                for rank in range(first, first + min(per_stage, math.lcm(gpus_per_node, block))):
                    base = rank - (rank // stride) % size * stride  # the group's first member
                    node = rank // gpus_per_node
                    low = max(0, -((base - node * gpus_per_node) // stride))
                    high = min(size, -((base - (node + 1) * gpus_per_node) // stride))
                    seen.setdefault(high - low == size, rank)  # its level: "node", or "cluster"
                    if len(seen) > 1:
                        return name, size, block, seen[True], seen[False]
        stride = block
    return None
