"""A fully sharded unit's flat collectives: one Allgather of its parameters, one Reduce_scatter of its gradients.

PyTorch FSDP2's ``foreach_all_gather`` and ``foreach_reduce``, on numpy blocks. The parameters of a unit
(spmdsim.nn.fsdp.FullyShard.unit) that share their sharding axes and dtype form a `FlatGroup` (one a unit;
with experts two: the experts' shard over the data axis, the dense ones over data x expert). Its gather packs
this rank's shards end to end into one buffer, runs one `BlockAllgather` (a step record the executor runs:
spmdsim.runtime.executor.run_block), and copies each parameter's rows out of the gathered buffer, which holds
the members' packs one after the other in group order, into the parameter's own block (FSDP2's
``split_with_sizes_copy``). The gathered buffer and the copied-out blocks coexist until the copy-out ends, so
a group of more than one parameter holds twice its gathered bytes for that moment (`gather_blocks` says how
many bytes; spmdsim.nn.fsdp counts them); a group of one parameter is its gathered buffer, no copy. Where the
shards do not divide a parameter's rows (a mesh whose Layout cuts by "chunk", spmdsim.nn.fsdp.CUT) each rank's
piece is packed padded with zeros to the first piece's rows, as FSDP2 pads, and each rank's rows are copied
out of its padded piece (`Member.pieces`); the Reduce_scatter packs and unpacks the same way.

Its backward waits for every member's gradient, packs them member-major (member i's rows of each gradient
end to end, then member i + 1's: the layout the gather made, read backwards) into one float32 (the gradients')
buffer and runs one `BlockReduceScatter`, the gather's conjugate. Where every member's gradient is still pending
over axes its leaf is replicated on (HSDP's data axis: the sum across the shard groups), one `BlockAllreduce` of
the whole result over those axes sums them in place (FSDP2's ``foreach_reduce``: reduce_scatter, then all_reduce
of its flat output over the replicate group). Each parameter's gradient shard is then a view of the result, or,
where it is pending over more axes still (sequence parallelism's tensor axis, for a parameter replicated there),
a block of its own copied out of it, which the leaf's sum then sums in place.

In the recorded graph a group is a node whose inputs are the members' leaves and whose output is a token
(no block), and each gathered parameter a node reading that token: its backward stashes the parameter's
gradient, and the walk, which runs a node after every node recorded later, reaches the group's node once every
gathered parameter's gradient has arrived. Neither kind of node keeps a block (`kept_bytes`: nothing).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ..base import buffers
from ..base.precision import is_low
from ..layouts.layout import TensorLayout
from ..programs.plan.messages import BlockAllgather, BlockAllreduce, BlockReduceScatter
from ..runtime.dtensor import DTensor
from ..runtime.executor import pending, redistribute, run_block
from .autograd.graph import attach, is_grad_enabled, with_partial
from .autograd.kept import nothing

__all__ = ["FlatGroup", "Member", "flat_groups", "gather_blocks", "gathered", "GATHER_LABEL", "REDUCE_LABEL",
           "SUM_LABEL"]

#: The start of the trace label of a unit's Allgather, of its Reduce_scatter and of the Allreduce that sums the
#: Reduce_scatter's result across the shard groups (HSDP; the estimate's phases read them).
GATHER_LABEL = "fsdp all-gather"
REDUCE_LABEL = "fsdp reduce-scatter"
SUM_LABEL = "fsdp all-reduce"

_F32 = np.dtype(np.float32)
_TOKEN_SHAPE = (1,)


@dataclass(frozen=True)
class Member:
    """One parameter of a group: its place [start, stop) in a rank's pack, its shard's and its gathered block's
    shapes, the layouts (gathered, `layout`; the leaf's, `sharded`), its global shape, and the axes of its leaf's
    sharding (of every size: a pending sum over one of size 1 is dropped, not kept at the leaf)."""

    name: str
    start: int
    stop: int
    shard_shape: tuple
    block_shape: tuple
    layout: TensorLayout
    sharded: TensorLayout
    shape: tuple
    axes: tuple
    # Under an uneven cut of dim 0 (a Layout cut "chunk": FSDP2's): each rank's piece padded to the first's
    # (`padded`) in the pack, and per rank of the group in group order (its first row in this rank's gathered
    # block, its rows); None under an even cut.
    padded: Optional[tuple] = None
    pieces: Optional[tuple] = None


@dataclass(frozen=True)
class FlatGroup:
    """A unit's parameters gathered by one Allgather over `axes` (those of size above one; a group of `size`
    ranks) and reduce-scattered by one Reduce_scatter: `dtype` the parameters', `wide` their gradients'
    (float32 for bfloat16), `total` the elements of a rank's pack."""

    axes: tuple
    size: int
    dtype: Any
    wide: Any
    members: tuple
    total: int
    gather: BlockAllgather
    reduce: BlockReduceScatter
    labels: tuple  # (the Allgather's trace label, the Reduce_scatter's, the Allreduce's across the groups)


def flat_groups(fs: Any, names: list) -> tuple:
    """The groups of parameters `names` of `fs` (a FullyShard): by their sharding axes and dtype, in the order
    of their first parameter, each its parameters in `names`' order. Pure."""
    keyed: dict = {}
    for name in names:
        leaf = fs.params[name]
        keyed.setdefault((fs.axes[name], leaf.local.dtype), []).append(name)
    size = fs.mesh.layout.axis_size
    groups = []
    for (axes, dtype), members in keyed.items():
        moving = tuple(a for a in axes if size(a) > 1)
        g = 1
        for a in moving:
            g *= size(a)
        placed, at = [], 0
        for name in members:
            member = _member(fs, name, axes, moving, g, at)
            placed.append(member)
            at = member.stop
        unit = _unit_name(members)
        labels = tuple(f"{kind} {unit} ({len(members)} parameters)"
                       for kind in (GATHER_LABEL, REDUCE_LABEL, SUM_LABEL))
        wide = _F32 if is_low(dtype) else np.dtype(dtype)
        groups.append(FlatGroup(moving, g, dtype, wide, tuple(placed), at, BlockAllgather(moving),
                                BlockReduceScatter(moving), labels))
    return tuple(groups)


def _member(fs: Any, name: str, axes: tuple, moving: tuple, g: int, at: int) -> Member:
    """Parameter `name` of `fs` placed at `at` in a rank's pack of a group of `g` ranks over `moving`."""
    leaf, layout = fs.params[name], fs.layouts[name]
    shape, shard = tuple(leaf.global_shape), tuple(leaf.local.shape)
    if 0 not in leaf.layout.uneven_dims(shape):
        n = math.prod(shard)
        return Member(name, at, at + n, shard, (shard[0] * g,) + shard[1:], layout, leaf.layout, shape, axes)
    padded = leaf.layout.max_local_shape(shape)
    rank = fs.mesh.rank
    first = layout.bounds(rank, shape)[0][0]
    pieces = tuple((a - first, b - a) for (a, b), *_ in
                   (leaf.layout.bounds(r, shape) for r in fs.mesh.group_ranks(moving)))
    n = math.prod(padded)
    return Member(name, at, at + n, shard, layout.local_shape(shape, rank), layout, leaf.layout, shape, axes,
                  padded, pieces)


def _unit_name(names: list) -> str:
    """The prefix before the first dot every name shares ("h0"), or "root" where they share none."""
    heads = {n.split(".", 1)[0] for n in names}
    return heads.pop() if len(heads) == 1 and all("." in n for n in names) else "root"


def gather_blocks(mesh: Any, group: FlatGroup, shards: list) -> tuple[list, int]:
    """(the members' gathered blocks, the bytes of the gathered buffer held beside them while they are copied
    out: 0 for a group of one, whose block is that buffer): `shards` this rank's blocks of the members, packed
    and gathered by one Allgather. A dry run copies nothing (its blocks are zeros of their shapes)."""
    dry = mesh.engine.dry
    send = buffers.empty((group.total,), group.dtype)
    if not dry:
        for m, shard in zip(group.members, shards):
            if m.pieces is None:
                send[m.start:m.stop] = shard.reshape(-1)
            else:  # its piece, then zeros to the first piece's size (FSDP2's padding)
                send[m.start:m.start + shard.size] = shard.reshape(-1)
                send[m.start + shard.size:m.stop] = 0
    got = run_block(mesh, group.gather, send, group.labels[0])
    del send
    if len(group.members) == 1 and group.members[0].pieces is None:
        return [got.reshape(group.members[0].block_shape)], 0
    rows = got.reshape(group.size, group.total)
    blocks = []
    for m in group.members:
        if dry:
            blocks.append(mesh.engine.blank(m.block_shape, group.dtype, placed=True))  # (as `block` below)
            continue
        block = buffers.empty(m.block_shape, group.dtype)
        if m.pieces is None:
            parts = (group.size,) + m.shard_shape
            np.copyto(block.reshape(parts), rows[:, m.start:m.stop].reshape(parts))
        else:  # each rank's rows out of its padded piece
            parts = rows[:, m.start:m.stop].reshape((group.size,) + m.padded)
            for part, (first, n) in zip(parts, m.pieces):
                block[first:first + n] = part[:n]
        blocks.append(block)
    return blocks, got.nbytes


def gathered(mesh: Any, group: FlatGroup, leaves: list, blocks: list) -> list:
    """The members whole again on the group's axes (DTensors of `blocks`, in their gathered layouts); where
    gradients are recorded and a leaf wants one, one node for the group (the token's) and one for each member
    that wants a gradient (reading the token), as the module docstring says."""
    outs = [DTensor._trusted(mesh, block, m.layout, m.shape) for m, block in zip(group.members, blocks)]
    wanted = [j for j, leaf in enumerate(leaves) if leaf._ag is not None]
    if not wanted or not is_grad_enabled():
        return outs
    unit = _UnitGrads(mesh, group, wanted)
    token = DTensor._trusted(mesh, nothing(_F32, _TOKEN_SHAPE), pending(mesh.layout, 1, ()), _TOKEN_SHAPE)
    attach(token, "fsdp gather", tuple(leaves[j] for j in wanted), unit.backward, None,
           tuple(leaves[j]._layout for j in wanted))
    unit.token_grad = DTensor._trusted(mesh, nothing(_F32, _TOKEN_SHAPE), token._layout, _TOKEN_SHAPE)
    inputs = (token,)
    for k, j in enumerate(wanted):
        out = outs[j]
        attach(out, "fsdp gathered", inputs, unit.stasher(k), None, (out._layout,))
        out._ag.low = None  # a parameter's gradient: float32, never rounded to bfloat16 (spmdsim.base.precision)
    return outs


class _UnitGrads:
    """A group's gradients as the walk gives them, reduce-scattered once the group's node runs."""

    __slots__ = ("mesh", "group", "wanted", "grads", "token_grad")

    def __init__(self, mesh: Any, group: FlatGroup, wanted: list) -> None:
        self.mesh, self.group, self.wanted = mesh, group, wanted
        self.grads: list = [None] * len(wanted)
        self.token_grad: Any = None

    def stasher(self, k: int) -> Any:
        """The backward of the `k`-th gathered member that wants a gradient: keeps it; the first to come hands
        the group's node its token's gradient (so the walk runs that node; the others hand nothing)."""
        def stash(dy: Any) -> tuple:
            first = all(g is None for g in self.grads)
            self.grads[k] = dy
            return (self.token_grad if first else None,)
        return stash

    def backward(self, dy: Any) -> tuple:
        """Every member's gradient packed and reduce-scattered by one Reduce_scatter: one gradient per leaf
        (None for a member whose gradient never came)."""
        grads, self.grads = self.grads, [None] * len(self.wanted)
        if all(g is None for g in grads):
            return (None,) * len(grads)
        return tuple(reduce_grads(self.mesh, self.group, self.wanted, grads))


def reduce_grads(mesh: Any, group: FlatGroup, wanted: list, grads: list) -> list:
    """The shard gradients of the members `wanted` (their indices) of `group` from the gradients `grads` of
    their gathered blocks (None: none came; zeros in the pack, no gradient out): one Reduce_scatter, and one
    Allreduce of its result over the pending axes every member keeps (`_across`; HSDP's data axis)."""
    total, g = group.total, group.size
    send = buffers.empty((g * total,), group.wide)
    rows = send.reshape(g, total)
    dry = mesh.engine.dry
    kept: list = []  # per member: the pending axes its leaf keeps, or None
    placed = {j: k for k, j in enumerate(wanted)}
    for j, m in enumerate(group.members):
        k = placed.get(j)
        dy = None if k is None else grads[k]
        view = rows[:, m.start:m.stop]
        if dy is None:
            if not dry:
                view[...] = 0
            if k is not None:
                kept.append(None)
            continue
        dy, extra = _pending_on(dy, m)
        kept.append(extra)
        if not dry:
            local = dy._local if not buffers.CAPTURE.on else dy.local
            if m.pieces is None:
                np.copyto(view.reshape((g,) + m.shard_shape), local.reshape((g,) + m.shard_shape))
            else:  # each rank's rows into its padded piece, zeros after them
                parts = view.reshape((g,) + m.padded)
                for part, (first, n) in zip(parts, m.pieces):
                    part[:n] = local[first:first + n]
                    part[n:] = 0
    out = run_block(mesh, group.reduce, send, group.labels[1])
    del send, rows
    common = _across(kept)
    moving = tuple(a for a in common if mesh.layout.axis_size(a) > 1)
    if moving:  # summed across the shard groups: one Allreduce of the whole result, in place (FSDP2's foreach_reduce)
        out = run_block(mesh, BlockAllreduce(moving), out, group.labels[2], out=out)
    result = []
    for j, extra in zip(wanted, kept):
        m = group.members[j]
        if extra is None:
            result.append(None)
            continue
        extra = tuple(a for a in extra if a not in common)
        block = out[m.start:m.start + math.prod(m.shard_shape)].reshape(m.shard_shape)
        if extra:  # summed again at its leaf (spmdsim.nn.autograd's `_summed_alone`): a block of its own, summed in
            # place there as a dry run's is, not a view that keeps the whole result alive beside its sum
            own = buffers.empty(m.shard_shape, group.wide)
            if not dry:
                np.copyto(own, block)
            block = own
        result.append(DTensor._trusted(mesh, block, with_partial(m.sharded, extra), m.shape))
    return result


def _across(kept: list) -> tuple:
    """The pending axes every member that has a gradient keeps after the Reduce_scatter (HSDP's data axis; in
    their order), summed for all of them at once; () where one keeps none (the group's own axes alone)."""
    have = [extra for extra in kept if extra is not None]
    if not have:
        return ()
    return tuple(a for a in have[0] if all(a in extra for extra in have[1:]))


def _pending_on(dy: Any, m: Member) -> tuple[Any, tuple]:
    """`dy` (a gathered member's gradient: its layout, with the pending sums the walk kept) pending over the
    group's axes too (a value whole there becomes one member's addend: no communication), and the pending axes
    its leaf keeps after the Reduce_scatter (the others: HSDP's data axis)."""
    have = dy._layout.partial
    mesh = m.layout.layout
    axes = set(have) | {a for a in m.axes if mesh.axis_size(a) > 1}
    target = with_partial(m.layout, tuple(a for a in mesh.alias_name if a in axes))
    if dy._layout is not target and dy._layout != target:
        dy = redistribute(dy, target)
    return dy, tuple(a for a in target.partial if a not in m.axes)
