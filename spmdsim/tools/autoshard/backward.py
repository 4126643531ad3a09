"""What a choice's backward pass communicates: the autograd engine's moves, replayed on layouts.

Pure (never imports mpi4py). `spmdsim.nn.autograd` moves gradients with the
planner: each operator's rule computes its input gradients locally, as
pending sums over the axes its local math summed over (a MatMul's dX over
the axes splitting N, dW over those splitting M); the engine keeps a pending
sum over the axes the tensor is replicated on (same device matrix) and
resolves it where an operator needs the whole value or at a leaf (a weight:
the data-parallel Allreduce). `replay` follows those rules layout by layout
and prices each move by the planner's choice (`plan.planner.received_per_rank`:
the bytes of `plan_redistribution`'s plan without choosing who sends each
box), exactly as the engine plans it, so its bytes are the bytes `NetworkTrainer` measures (tested at 8
simulated ranks). The search prices the backward per candidate and per edge
(`node_bytes`, `edge_bytes`): there each operator's output gradient is
resolved to its layout, which `replay` does not require.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Optional, Sequence

import numpy as np

from ...layouts.layout import TensorLayout
from ...programs.plan.planner import received_per_rank
from .candidates import Candidate, _infer
from . import rules
from .graph import ELEMENTWISE, Graph, OpNode
from .volume import pair_bytes

__all__ = ["BackwardOp", "replay", "needs_grad", "node_bytes", "edge_bytes", "backward_total"]


@dataclass(frozen=True)
class BackwardOp:
    """One operator's backward: bytes the busiest rank receives per move kind.

    Attributes:
        in_bytes: moving its input gradients back through the hops to the producers' layouts.
        own_bytes: bringing the output gradient to the layout its rule reads.
        weight_bytes: summing its weights' gradients (the leaves' resolution).
    """

    name: str
    in_bytes: int
    own_bytes: int
    weight_bytes: int

    @property
    def bytes_per_rank(self) -> int:
        return self.in_bytes + self.own_bytes + self.weight_bytes


@lru_cache(maxsize=1 << 18)
def _move(src: TensorLayout, dst: TensorLayout, shape: tuple, dtype: str) -> int:
    """Bytes the busiest rank receives moving a gradient (0 when the layouts are equal).

    Without pending sums the planner's plan meets the lower bound (`volume.redistribution_bytes`).
    """
    if src == dst:
        return 0
    if not src.partial and not dst.partial:
        return pair_bytes(src, dst, shape, dtype)
    return max(received_per_rank(src, dst, tuple(shape), dtype), default=0)


def _pending(like: TensorLayout, *groups) -> TensorLayout:
    """`like`'s tensor map, pending over the union of `groups` (mesh order), as `grad_tensor` makes it."""
    wanted = {a for g in groups for a in g}
    return like.with_partial(a for a in like.layout.alias_name if a in wanted)


def _axes(local: TensorLayout, entries) -> tuple[str, ...]:
    return tuple(a for e in entries for a in e if local.layout.axis_size(a) > 1)


@lru_cache(maxsize=1 << 16)
def _grad_layout(layout: TensorLayout, g: TensorLayout) -> TensorLayout:
    """The engine's `grad_layout`: keep pending axes the tensor is replicated on, same mesh only."""
    keep = set(layout.replicated_axes) & set(g.partial) if g.layout == layout.layout else set()
    return _pending(layout.with_partial(()), keep)


def needs_grad(graph: Graph) -> list[bool]:
    """Per node, whether its output needs a gradient (it has weights, or an input needs one)."""
    out: list[bool] = []
    for node in graph.nodes:
        out.append(bool(node.params) or any(out[graph.index(i)] for i in node.inputs))
    return out


def _sums(weights, charged: Optional[set]) -> int:
    """Bytes of resolving weight gradients [(pending layout, weight layout, ParamSpec)] at the leaves.

    `charged` (the replay's): a weight used twice (the GPT's tied table: one ParamSpec in two
    nodes) whose uses lay out it and its gradient alike is summed once, as the engine adds the
    two gradients locally first.
    """
    total = 0
    for g, p, spec in weights:
        if charged is not None:
            if (spec, p, g) in charged:
                continue
            charged.add((spec, p, g))
        total += (_move(g, _grad_layout(p, g), spec.shape, spec.source.dtype)
                  + _move(_grad_layout(p, g), p.with_partial(()), spec.shape, spec.source.dtype))
    return total


def _op(node: OpNode, c: Candidate, dy: TensorLayout, need: Sequence[bool],
        charged: Optional[set] = None) -> tuple:
    """(own bytes, weight bytes, per input its gradient layout or None) of one rule."""
    kind = node.kind
    grads: list = [None] * len(node.inputs)
    if kind == "input":
        return 0, 0, grads
    if kind in rules.KINDS:
        return _general(node, c, dy, need, charged)
    if kind in ("flatten",) + ELEMENTWISE:
        own = 0
        if kind != "flatten":  # want = the input's layout; pending over replicated axes passes
            used = set(c.inputs[0].split_axes) | set(c.out.split_axes)
            target = c.inputs[0].with_partial(a for a in dy.partial if a not in used)
            own, dy = _move(dy, target, node.out_shape, node.dtype), target
        grads[0] = _pending(c.inputs[0], dy.partial) if need[0] else None
        return own, 0, grads
    local = _infer(node, c.inputs, c.params, c.out)[0]
    reads = list(c.inputs) + list(c.params) + [c.out]
    used = {a for tl in reads for a in tl.split_axes + tl.partial}
    target = local.with_partial(()).with_partial(a for a in dy.partial if a not in used)
    own = _move(dy, target, node.out_shape, node.dtype)
    passed = target.partial
    if kind == "embedding":
        w = [_pending(c.params[0], passed, _axes(local, local.tensor_map[:-1]))]
    else:
        x, wl = c.inputs[0], (c.params[0] if kind in ("matmul", "linear") else c.inputs[1])
        gx = _pending(x, passed, _axes(local, local.tensor_map[-1:]))
        summed = local.tensor_map[:-1] if wl.ndim == 2 and x.ndim > 2 else local.tensor_map[-2:-1]
        gw = _pending(wl, passed, _axes(local, summed))
        grads[0] = gx if need[0] else None
        if kind == "bmm":
            grads[1] = gw if need[1] else None
            w = []
        else:
            w = [gw] + ([_pending(c.params[1], passed, _axes(local, local.tensor_map[:-1]))]
                        if kind == "linear" else [])
    return own, _sums(zip(w, c.params, node.params), charged), grads


def _summed(node: OpNode, c: Candidate, local: TensorLayout) -> list[tuple[str, ...]]:
    """Per operand (activations, then weights), the mesh axes its gradient's local math sums over."""
    operands = list(c.inputs) + list(c.params)
    if node.kind == "einsum":
        words, _, _ = rules.letters(node)
        where = {ch: axes for w, tl in zip(words, operands) for ch, axes in zip(w, tl.tensor_map)}
        return [_axes(local, [where[ch] for ch in where if ch not in w]) for w in words]
    if node.kind == "pointwise":
        words, out_word, _ = rules.letters(node)
        return [_axes(local, [e for ch, e in zip(out_word, c.out.tensor_map) if ch not in w]) for w in words]
    if node.kind == "layernorm":  # the weights' gradients sum over the rows
        return [()] + [_axes(local, c.inputs[0].tensor_map[:-1])] * len(c.params)
    return [()] * len(operands)


def _general(node: OpNode, c: Candidate, dy: TensorLayout, need: Sequence[bool],
             charged: Optional[set] = None) -> tuple:
    """(own bytes, weight bytes, per input its gradient layout or None) of a `rules` kind.

    Every backward is linear in the output gradient: a pending sum over axes the
    operator does not split passes to its operands' gradients. Each operand's
    gradient is also pending over the axes of the letters its local math sums
    (an einsum's letters it lacks, a broadcast operand's broadcast dims). A split
    hidden dim costs a layer norm's backward the two row sums its forward needed.
    """
    local = rules.infer(node, c.inputs, c.params, c.out)[0]
    reads = list(c.inputs) + list(c.params) + [c.out, local]
    used = {a for tl in reads for a in tl.split_axes + tl.partial}
    target = local.with_partial(()).with_partial(a for a in dy.partial if a not in used)
    own = _move(dy, target, node.out_shape, node.dtype)
    if node.kind == "layernorm":
        own += c.own_bytes
    passed = target.partial
    summed = _summed(node, c, local)
    n = len(node.inputs)
    grads = [_pending(tl, passed, s) if want else None
             for tl, s, want in zip(c.inputs, summed[:n], need)]
    weights = [(_pending(p, passed, s), p, spec) for p, s, spec in zip(c.params, summed[n:], node.params)]
    return own, _sums(weights, charged), grads


def _back(g: TensorLayout, consumer_in: TensorLayout, producer_out: TensorLayout, shape: tuple,
          dtype: str) -> tuple[int, TensorLayout]:
    """(bytes, layout at the producer) of an input gradient: onto the hop's output, then back over it."""
    at_in = _grad_layout(consumer_in, g)
    cost, at = _over(at_in, consumer_in, producer_out, shape, dtype)
    return _move(g, at_in, shape, dtype) + cost, at


def _over(at_in: TensorLayout, consumer_in: TensorLayout, producer_out: TensorLayout, shape: tuple,
          dtype: str) -> tuple[int, TensorLayout]:
    """(bytes, layout at the producer) of a gradient at the hop's output (`at_in`) back over the hop."""
    if consumer_in == producer_out:
        return 0, at_in
    at_out = _grad_layout(producer_out, at_in)
    return _move(at_in, at_out, shape, dtype), at_out


def _add(a: TensorLayout, b: TensorLayout, owner: TensorLayout, shape: tuple, dtype: str) -> tuple:
    """The engine's `add_grads` of two gradients of one tensor: (bytes, layout of the sum)."""
    if a == b:
        return 0, a
    common = _pending(owner.with_partial(()), set(a.partial) | set(b.partial))
    return _move(a, common, shape, dtype) + _move(b, common, shape, dtype), common


def replay(graph: Graph, chosen: Sequence[Candidate]) -> tuple[BackwardOp, ...]:
    """Per node, the bytes the backward of a training step moves (the loss gradient arrives whole)."""
    need = needs_grad(graph)
    last = len(graph.nodes) - 1
    grads: dict[int, TensorLayout] = {last: chosen[last].out.with_partial(())}
    rows: dict[int, list[int]] = {i: [0, 0, 0] for i in range(len(graph.nodes))}
    charged: set = set()  # weight gradients already summed (a tied weight: once)
    for q in range(last, 0, -1):
        node, dy = graph.nodes[q], grads.pop(q, None)
        if dy is None or not need[q]:
            continue
        wants = [need[graph.index(i)] for i in node.inputs]
        own, weight, gs = _op(node, chosen[q], dy, wants, charged)
        rows[q][1] += own
        rows[q][2] += weight
        for pos, (src, g) in enumerate(zip(node.inputs, gs)):
            if g is None:
                continue
            p = graph.index(src)
            shape, dtype = node.in_shapes[pos], graph.nodes[p].dtype
            cost, at = _back(g, chosen[q].inputs[pos], chosen[p].out, shape, dtype)
            if p in grads:
                extra, at = _add(grads[p], at, chosen[p].out, shape, dtype)
                cost += extra
            grads[p] = at
            rows[q][0] += cost
    return tuple(BackwardOp(n.name, *rows[i]) for i, n in enumerate(graph.nodes))


def _whole(node: OpNode, c: Candidate, need_inputs: Sequence[bool], memo: Optional[dict]) -> tuple:
    """`_op` of `c` given its output gradient whole, what the search prices; kept in `memo` (the cost table's)
    for the node's own price and each of its input edges alike."""
    if memo is None:
        return _op(node, c, c.out.with_partial(()), need_inputs)
    key = (id(node), id(c), tuple(need_inputs))
    found = memo.get(key)
    if found is None:  # node and c kept with it: their ids stay theirs while the memo lives
        found = memo[key] = (node, c, _op(node, c, c.out.with_partial(()), need_inputs))
    return found[2]


def node_bytes(node: OpNode, c: Candidate, need_inputs: Sequence[bool], memo: Optional[dict] = None) -> int:
    """The search's price of a candidate's own backward: its output gradient arriving whole."""
    own, weight, _ = _whole(node, c, need_inputs, memo)
    return own + weight


def edge_bytes(graph: Graph, p: int, q: int, pos: int, producers: Sequence[Candidate],
               consumers: Sequence[Candidate], need_inputs: Sequence[bool], memo: Optional[dict] = None
               ) -> np.ndarray:
    """The search's price of one hop backward, per (producer, consumer) candidate (int64 matrix).

    The consumer's input gradient goes back over the hop and is resolved at the producer.
    """
    node = graph.nodes[q]
    shape, dtype = tuple(node.in_shapes[pos]), graph.nodes[p].dtype
    out = np.zeros((len(producers), len(consumers)), dtype=np.int64)
    for j, cq in enumerate(consumers):
        g = _whole(node, cq, need_inputs, memo)[2][pos]
        if g is not None:  # onto the hop's output once per consumer, then back over it per producer
            consumer_in = cq.inputs[pos]
            at_in = _grad_layout(consumer_in, g)
            onto = _move(g, at_in, shape, dtype)
            out[:, j] = [onto + _resolved_over(at_in, consumer_in, cp.out, shape, dtype) for cp in producers]
    return out


@lru_cache(maxsize=1 << 18)
def _resolved_over(at_in: TensorLayout, consumer_in: TensorLayout, producer_out: TensorLayout, shape: tuple,
                   dtype: str) -> int:
    """Bytes of a gradient at the hop's output (`at_in`) back over the hop and resolved at the producer."""
    cost, at = _over(at_in, consumer_in, producer_out, shape, dtype)
    return cost + _move(at, producer_out.with_partial(()), shape, dtype)


def backward_total(graph: Graph, chosen: Sequence[Candidate]) -> int:
    """Bytes per rank of a whole choice's backward (`replay`, summed)."""
    return sum(op.bytes_per_rank for op in replay(graph, chosen))
