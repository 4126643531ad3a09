"""Candidate strategies per operator: every `.shard` strategy whose split counts fit the devices.

Pure (never imports mpi4py). A strategy gives the number of slices of each dim
of each input (MindSpore's ``.shard``); its layouts come from
`spmdsim.layouts.dialects.strategy` (device matrix = the counts, plus the
repeated-calculation axis "rep" on the right when they use fewer devices than
the world). What the operator does on them is asked of `spmdsim.programs.infer`, the
rules the operators run: the output layout and the operator's own program,
the step records that finish it (`MatMulPlan.steps`, `EmbeddingPlan.steps`,
`resolve_partial` for an einsum's pending sum, `NormPlan.program`,
`CrossEntropyPlan.program`), each priced by its kind's byte formula
(`own_plan`), so the search prices the collectives the operator issues. Per kind:

* matmul / linear / bmm ``((batch.., a, b), (batch.., b, c))``: every (a, b, c)
  whose product divides the devices; a split contraction b also with each
  ``out_strategy`` that Reduce_scatters into one output dim;
* relu / gelu: every split of the input; softmax: the last dim whole;
* flatten: only the batch dim split (a local reshape);
* embedding ``((v, d), (ids..))``: vocabulary and/or embedding dim split, ids split too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Iterator, Optional, Sequence

import numpy as np

from ...layouts.dialects.strategy import format_strategy, layout_to_strategy, matmul_layouts, strategy_to_layout
from ...errors import SpmdsimError
from ...layouts.layout import Layout, TensorLayout
from ...programs.infer import (infer_elementwise, infer_embedding, infer_linear, infer_matmul, infer_reshape,
                     infer_softmax, out_layout_from_strategy)
from ...programs.plan import Plan
from ...programs.plan.steps import Step
from ...programs.plan.volume import lower_bound
from . import rules
from .counts import fitting, slice_counts
from .graph import ELEMENTWISE, OpNode
from ...base.tables import put

__all__ = ["Candidate", "candidates", "make_candidate", "most_devices"]


@dataclass(frozen=True)
class Candidate:
    """One way to run an operator: the layouts it needs and what it costs by itself.

    Attributes:
        strategy: slice counts per input, activations then weights (MindSpore's order).
        out_strategy: slice counts of the output when it is reduce-scattered, else None.
        inputs: the layout each activation input must arrive in.
        params: the layout of each weight (placed there for free).
        out: the layout of the finished output.
        own: the operator's own program as `spmdsim.programs.infer` states it, one plan per step (`own_plan`):
            finishing the local result (-> `out`), a layer norm's statistics, a cross-entropy's sums.
        own_bytes: bytes the busiest rank receives in them.
        flops: floating-point operations one rank performs.
        memory: bytes one rank holds while it runs (weights, inputs, outputs).
        hand: whether this is the network's hand-written strategy.
    """

    strategy: tuple[tuple[int, ...], ...]
    out_strategy: Optional[tuple[tuple[int, ...], ...]]
    inputs: tuple[TensorLayout, ...]
    params: tuple[TensorLayout, ...]
    out: TensorLayout
    own: tuple[Plan, ...]
    own_bytes: int
    flops: int
    memory: int
    hand: bool = False

    @property
    def text(self) -> str:
        """MindSpore's spelling: ``((2, 4), (4, 1))``, ``... out ((8, 1),)``."""
        text = format_strategy(self.strategy) if self.strategy else "()"
        if self.out_strategy:
            text += f" out {format_strategy(self.out_strategy)}"
        return text

    def collectives(self) -> tuple[str, ...]:
        """Names of the operator's own collectives, in order (``Allreduce(k)``)."""
        return tuple(f"{s.via}({','.join(s.axes)})" for p in self.own for s in p.steps
                     if s.op not in ("local_slice", "local_zero"))

    def same_layouts(self, other: "Candidate") -> bool:
        return (self.inputs, self.params, self.out) == (other.inputs, other.params, other.out)


@lru_cache(maxsize=65536)
def _local_bytes(tl: TensorLayout, shape: tuple, dtype: str) -> int:
    return math.prod(tl.local_shape(shape)) * np.dtype(dtype).itemsize


@lru_cache(maxsize=65536)
def _check(tl: TensorLayout, shape: tuple) -> None:
    tl.check_shape(shape)


def make_candidate(node: OpNode, inputs: Sequence[TensorLayout], params: Sequence[TensorLayout],
                   in_dtypes: Sequence[str] = (), out: Optional[TensorLayout] = None,
                   hand: bool = False) -> Candidate:
    """The candidate running `node` on these layouts (OperatorError/ShapeError when it cannot).

    `out` asks for a reduce-scattered output (MindSpore's out_strategy);
    `in_dtypes` are the activation inputs' dtypes (default: the node's).
    """
    inputs, params = tuple(inputs), tuple(params)
    in_dtypes = tuple(in_dtypes) or (node.dtype,) * len(node.inputs)
    for tl, shape in zip(inputs + params, node.in_shapes + tuple(p.shape for p in node.params)):
        _check(tl, tuple(shape))
    infer = rules.infer if node.kind in rules.KINDS else _infer
    local, final, flops, program = infer(node, inputs, params, out)
    _check(final, tuple(node.out_shape))
    own = tuple(own_plan(step, tuple(shape), node.dtype) for step, shape in program)
    memory = sum(_local_bytes(tl, s, d) for tl, s, d in zip(inputs, node.in_shapes, in_dtypes))
    memory += sum(_local_bytes(tl, p.shape, p.source.dtype) for tl, p in zip(params, node.params))
    memory += max(_local_bytes(local, node.out_shape, node.dtype),
                  _local_bytes(final, node.out_shape, node.dtype))
    strategy = tuple(map(layout_to_strategy, (*inputs, *params))) if inputs else (final.shards_per_dim,)
    out_strategy = None
    if out is not None and out.shards_per_dim != local.shards_per_dim:
        out_strategy = (out.shards_per_dim,)
    own_bytes = sum(p.max_bytes_received for p in own)
    return Candidate(strategy, out_strategy, inputs, params, final, own, own_bytes, flops, memory, hand)


def _infer(node: OpNode, inputs: tuple, params: tuple, out: Optional[TensorLayout]) -> tuple:
    """(local result layout, finished layout, flops per rank, program) of one operator.

    `program`: the operator's own steps (`spmdsim.programs.infer`'s records), each with the global shape it acts on.
    """
    kind = node.kind
    if kind == "input":
        return node.layout, node.layout, 0, ()
    if kind == "flatten":  # a reshape: each rank reshapes its own block (infer_reshape says when)
        (x,) = inputs
        local, _ = infer_reshape(x, tuple(node.in_shapes[0]), tuple(node.out_shape))
        return local, local, 0, ()
    if kind in ELEMENTWISE:
        (x,) = inputs
        infer_elementwise(x, kind)
        if kind == "softmax" and x.num_shards(x.ndim - 1) > 1:
            infer_softmax(x)  # raises: each rank needs whole rows to normalise
        return x, x, math.prod(x.local_shape(node.out_shape)) * (5 if kind == "softmax" else 1), ()
    if kind == "embedding":
        plan = infer_embedding(inputs[0], params[0], gather_out=False, out=out)
        return plan.local, plan.out, 0, _on(plan.steps, node.out_shape)
    if kind == "linear":
        plan = infer_linear(inputs[0], *params)
        mm, steps = plan.matmul, plan.steps
    else:
        x, w = (inputs[0], params[0]) if kind == "matmul" else inputs
        mm = infer_matmul(x, w, transpose_b=node.transpose_b, out=out)
        steps = mm.steps
    k_size = node.in_shapes[0][-1] // mm.x.layout.group_size(mm.contraction_axes)
    flops = 2 * math.prod(mm.local.local_shape(node.out_shape)) * k_size
    return mm.local, mm.out, flops, _on(steps, node.out_shape)


def _on(steps: Sequence[Step], shape: Sequence[int]) -> tuple:
    """Steps that all act on one tensor of global `shape`, as a program."""
    return tuple((step, tuple(shape)) for step in steps)


@lru_cache(maxsize=65536)
def own_plan(step: Step, shape: tuple, dtype: str) -> Plan:
    """One step of an operator's own program (`spmdsim.programs.infer`'s record) on a tensor of global `shape`,
    priced: the step on the mesh of its own axes, sized by its kind's formula (`Step.moved`).

    A collective works within the groups over its axes, each group on the block
    the other axes give it. The same step on those axes alone, with that block
    as the tensor, moves the same bytes per rank (tested against the step on
    the whole mesh) and keeps per-rank figures for one group, not the world, so
    pricing stays quick at thousands of devices.
    """
    axes = step.axes
    matrix = step.before.layout
    mesh = Layout(tuple(matrix.axis_size(a) for a in axes), axes)
    block = tuple(n // matrix.group_size(tuple(a for a in e if a not in axes))
                  for n, e in zip(shape, step.before.tensor_map))

    def rebased(tl: TensorLayout) -> TensorLayout:
        return TensorLayout(mesh, tuple(tuple(a for a in e if a in axes) for e in tl.tensor_map),
                            tuple(a for a in tl.partial if a in axes))

    before, after = rebased(step.before), rebased(step.after)
    itemsize = np.dtype(dtype).itemsize
    sized = replace(step, before=before, after=after).sized(block, itemsize)
    return Plan(before, after, block, dtype, (sized,), lower_bound(before, after, block, itemsize))


# -- enumeration -------------------------------------------------------------------------
def candidates(node: OpNode, devices: int, in_dtypes: Sequence[str] = (),
               full: bool = False, use: Optional[int] = None) -> tuple[Candidate, ...]:
    """Every candidate of `node` on `devices` devices, in a fixed order (most devices first).

    Operators of the same kind and shapes share one (cached) tuple: a chain of
    identical layers enumerates once. `full`: only strategies that use `use`
    devices (default: every device), for operators that have any (MindSpore's
    ``fully_use_devices``; `most_devices` gives the most any strategy of a graph can use).
    """
    shapes = (node.kind, node.in_shapes, node.out_shape, node.dtype, node.transpose_b, node.spec,
              node.layout, tuple((p.shape, p.source.dtype) for p in node.params))
    key = (shapes, devices, tuple(in_dtypes), full, use)
    if key not in _CACHE:
        put(_CACHE, key, _enumerate(node, devices, tuple(in_dtypes), full, use), 256)
    return _CACHE[key]


def most_devices(nodes: Sequence[OpNode], devices: int) -> int:
    """The most devices any strategy of these operators computes different things on (a divisor of `devices`).

    Where it is less than `devices` (the GPT's power-of-two shapes at 384 = 3 x 128 devices: no strategy
    uses more than 128), each layout's device matrix ends in a "rep" axis whose size the remaining factor
    divides, so rank r holds what rank r // (devices // most) holds on `most` devices: every byte count
    equals the one on `most` devices (tested), and fully using the devices means using these.
    """
    most = 1
    for node in nodes:
        shapes = (node.kind, node.in_shapes, node.out_shape, node.spec, node.transpose_b, node.layout,
                  tuple(p.shape for p in node.params))
        key = (shapes, devices)
        if key not in _MOST:
            _MOST[key] = max((_used(layout) for layouts in _layouts(node, devices)
                              for layout in _first(layouts)), default=1)
        most = max(most, _MOST[key])
    return most


_MOST: dict = {}


def _first(layouts: tuple) -> tuple:
    """The device matrix of one yielded strategy (its first layout), or () when it has none."""
    inputs, params, _ = layouts
    tls = tuple(inputs) + tuple(params)
    return (tls[0].layout,) if tls else ()


def _used(layout: Layout) -> int:
    return layout.num_devices // (layout.axis_size("rep") if "rep" in layout.alias_name else 1)


_CACHE: dict = {}


def _enumerate(node: OpNode, devices: int, in_dtypes: tuple, full: bool,
               use: Optional[int] = None) -> tuple[Candidate, ...]:
    out = []
    for inputs, params, want in _layouts(node, devices, full, use):
        try:
            out.append(make_candidate(node, inputs, params, in_dtypes, want))
        except SpmdsimError:
            continue  # a shape that does not divide, an axis reused: not a candidate
    if full and not out:  # no strategy using every device runs (a reshape's blocks): every strategy
        return _enumerate(node, devices, in_dtypes, False)
    return tuple(sorted(out, key=_devices_used, reverse=True))


def _devices_used(c: Candidate) -> int:
    """Devices that compute different things (the rest repeat the calculation)."""
    return _used(c.out.layout)


def _layouts(node: OpNode, devices: int, full: bool = False, use: Optional[int] = None) -> Iterator[tuple]:
    """(activation layouts, weight layouts, wanted output or None) of every strategy."""
    kind, shapes = node.kind, node.in_shapes
    if kind == "input":
        yield (), (), None
        return
    if kind in rules.KINDS:
        yield from rules.layouts(node, devices, full, use)
        return
    if kind in ("flatten",) + ELEMENTWISE:
        x = shapes[0]
        whole = range(1, len(x)) if kind == "flatten" else (len(x) - 1,) if kind == "softmax" else ()
        for counts in fitting(x, devices, tuple(whole), full, use):
            yield (strategy_to_layout(counts, devices),), (), None
        return
    if kind == "embedding":
        yield from _embedding_layouts(node, devices, full, use)
        return
    yield from _matmul_layouts(node, devices)


def _embedding_layouts(node: OpNode, devices: int, full: bool, use: Optional[int] = None) -> Iterator[tuple]:
    """Ids and table split; with spec "scatter" a split vocabulary also Reduce_scatters into each
    output dim (as Megatron's sequence parallelism does; `make_candidate` refuses a dim it does not divide)."""
    ids, table = node.in_shapes[0], node.params[0].shape
    n = len(ids)
    for counts in fitting(ids + table, devices, (), full, use):
        whole = strategy_to_layout(counts, devices)
        names = whole.layout.alias_name[: n + 2]  # one strategy axis per dim; "rep" after them
        x, t = whole.layout(*names[:n]), whole.layout(*names[n:])
        yield (x,), (t,), None
        vocab = counts[n]
        if vocab == 1 or node.spec != "scatter":
            continue
        local = infer_embedding(x, t, gather_out=False).local
        for d in range(local.ndim):
            want = list(local.shards_per_dim)
            want[d] *= vocab
            yield (x,), (t,), out_layout_from_strategy(local, want)


def _matmul_layouts(node: OpNode, devices: int) -> Iterator[tuple]:
    x = node.in_shapes[0]
    w = node.in_shapes[1] if node.kind == "bmm" else node.params[0].shape
    tb = node.transpose_b
    m, k = x[-2], x[-1]
    n = w[-2] if tb else w[-1]
    batch = x[:-2]
    for counts in slice_counts(batch + (m, k, n), devices):
        *bc, a, b, c = counts
        xs, ws = tuple(bc) + (a, b), (tuple(bc) if len(w) > 2 else ()) + ((c, b) if tb else (b, c))
        try:
            mm = matmul_layouts((xs, ws), devices, transpose_b=tb)
        except SpmdsimError:
            continue
        if node.kind == "bmm":
            yield (mm.x, mm.w), (), None
            continue
        params = (mm.w,) if node.kind == "matmul" else (mm.w, mm.layout(mm.out.tensor_map[-1]))
        yield (mm.x,), params, None
        if b == 1 or node.kind != "matmul":
            continue
        local = infer_matmul(mm.x, mm.w, transpose_b=tb).local  # pending over the split K
        for d in range(local.ndim):  # a Reduce_scatter into each output dim (make_candidate checks it divides)
            want = list(local.shards_per_dim)
            want[d] *= b
            yield (mm.x,), params, out_layout_from_strategy(local, want)
