"""The general operator kinds of the strategy search (a GPT's): einsum, broadcasting pointwise ops,
layer norm, reshape and a vocab-parallel cross-entropy.

Pure (never imports mpi4py). A strategy gives each index letter a slice count
(einsum's subscripts; a pointwise op's output dims; the input dims of a layer
norm, reshape or cross-entropy); its layouts share one device matrix, the
split letters in order of appearance plus the repeated-calculation axis "rep"
on the right (as `spmdsim.dialects.strategy` does for MindSpore's strategies).
The output layout and the pending sums come from the pure rules of
`spmdsim.infer` (`infer_einsum`, `infer_pointwise`, `infer_reduce`,
`infer_reshape`); an operator's own collectives are planned by
`candidates.own_plan`:

| kind          | own collectives                                                           |
| ------------- | ------------------------------------------------------------------------- |
| einsum        | split contracted letters: Allreduce, or Reduce_scatter into an output dim   |
| pointwise     | none (operands split alike; broadcast dims whole)                          |
| layernorm     | hidden dim split: two Allreduces of one number per row (mean, variance)    |
| reshape       | none (only strategies whose blocks stay blocks: a local reshape)           |
| cross_entropy | classes split: Allreduce(MAX) and a sum of two numbers per row; rows split: |
|               | one sum of two numbers (the loss and the count of bad labels)              |
"""
from __future__ import annotations

import math
import string
from typing import Iterator, Optional, Sequence

from ..errors import OperatorError, SpmdsimError
from ..infer import infer_reshape, out_layout_from_strategy
from ..infer.einsum import infer_einsum, parse_einsum
from ..infer.pointwise import broadcast_shape, infer_pointwise, infer_reduce
from ..layout import Layout, TensorLayout
from ..plan import Plan

__all__ = ["KINDS", "infer", "layouts", "letters"]

#: The kinds this module infers and enumerates.
KINDS = ("einsum", "pointwise", "layernorm", "reshape", "cross_entropy")


def letters(node) -> tuple[tuple[str, ...], str, dict]:
    """(per operand its letters, the output's letters, letter -> size) of an einsum or pointwise node.

    Operands are the activation inputs, then the weights. A pointwise operand's
    broadcast dims (missing, or of size 1) get no letter ("" in its word).
    """
    shapes = tuple(node.in_shapes) + tuple(p.shape for p in node.params)
    if node.kind == "einsum":
        spec = parse_einsum(node.spec, tuple(len(s) for s in shapes))
        sizes = {ch: n for word, s in zip(spec.inputs, shapes) for ch, n in zip(word, s)}
        return tuple(tuple(w) for w in spec.inputs), spec.output, sizes
    out = broadcast_shape(shapes, node.name) if node.kind == "pointwise" else tuple(shapes[0])
    names = string.ascii_lowercase[:len(out)]
    words = []
    for s in shapes:
        offset = len(out) - len(s)
        words.append(tuple(names[offset + d] if n == out[offset + d] else "" for d, n in enumerate(s)))
    return tuple(words), names, dict(zip(names, out))


def _mesh(order: Sequence[str], counts: dict, devices: int) -> tuple[Layout, dict]:
    """The device matrix of a strategy: split letters in `order`, then "rep"; letter -> axes."""
    split = [ch for ch in order if counts.get(ch, 1) > 1]
    used = math.prod(counts[ch] for ch in split)
    sizes, names = [counts[ch] for ch in split], list(split)
    if used < devices:
        sizes.append(devices // used)
        names.append("rep")
    if not names:
        sizes, names = [1], ["rep"]
    return Layout(tuple(sizes), tuple(names)), {ch: (ch,) for ch in split}


def _map(layout: Layout, axes: dict, word: Sequence[str]) -> TensorLayout:
    return TensorLayout(layout, tuple(axes.get(ch, ()) for ch in word), ())


def _stats(x: TensorLayout, shape: tuple, dims: tuple[int, ...], rows: int, dtype: str) -> Plan:
    """The Allreduce finishing `rows` numbers per row of a sum of x (global `shape`) over `dims`."""
    from .candidates import own_plan

    local = infer_reduce("sum", x, dims, True).local
    block = tuple(1 if d in dims else n for d, n in enumerate(shape))
    if rows > 1:
        block, local = (rows,) + block, TensorLayout(local.layout, ((),) + local.tensor_map, local.partial)
    return own_plan(local, local.with_partial(()), block, dtype)


def infer(node, inputs: tuple, params: tuple, out: Optional[TensorLayout]) -> tuple:
    """(local result, finished output, flops per rank, own plans besides local -> finished) of one node."""
    kind, dtype = node.kind, node.dtype
    operands = tuple(inputs) + tuple(params)
    shapes = tuple(node.in_shapes) + tuple(p.shape for p in node.params)
    if kind == "einsum":
        plan = infer_einsum(node.spec, operands, shapes, dtype)
        if plan.targets != operands:
            raise SpmdsimError(f"{node.name}: the operands' splits disagree")
        local = plan.local
        final = local.with_partial(()) if out is None else out
        words, _, sizes = letters(node)
        where = {ch: axes for word, tl in zip(words, operands) for ch, axes in zip(word, tl.tensor_map)}
        work = math.prod(n // local.layout.group_size(where[ch]) for ch, n in sizes.items())
        return local, final, 2 * work, ()
    if kind == "pointwise":
        plan = infer_pointwise(node.spec, operands, shapes, dtype)
        if plan.targets != operands:
            raise SpmdsimError(f"{node.name}: the operands' splits disagree")
        return plan.out, plan.out, math.prod(plan.out.local_shape(node.out_shape)), ()
    x, shape = inputs[0], tuple(node.in_shapes[0])
    if x.partial:
        raise SpmdsimError(f"{node.name}: a pending input")
    if kind == "reshape":
        local, _ = infer_reshape(x, shape, node.out_shape)
        return local, local, 0, ()
    last = (x.ndim - 1,)
    split_last = x.layout.group_size(x.tensor_map[-1]) > 1
    if kind == "layernorm":
        for p in params:
            if p.layout != x.layout or p.tensor_map != x.tensor_map[-1:]:
                raise SpmdsimError(f"{node.name}: weights {p} are not split like x's hidden dim {x}")
        extra = (_stats(x, shape, last, 1, dtype),) * 2 if split_last else ()
        return x, x, 8 * math.prod(x.local_shape(shape)), extra
    if kind == "cross_entropy":
        from .candidates import own_plan

        extra = ()
        if split_last:
            extra = (_stats(x, shape, last, 1, dtype), _stats(x, shape, last, 2, dtype))
        if x.layout.group_size(x.tensor_map[0]) > 1:
            scalar = TensorLayout(x.layout, ((),), tuple(a for a in x.layout.alias_name
                                                         if a in x.tensor_map[0]))
            extra += (own_plan(scalar, scalar.with_partial(()), (2,), dtype),)
        return x.layout(), x.layout(), 4 * math.prod(x.local_shape(shape)), extra
    raise OperatorError(f"{node.name}: kind {kind!r} is not one of {KINDS!r}")


def _letter_counts(order: Sequence[str], sizes: dict, devices: int, whole: Sequence[str],
                   full: bool) -> Iterator[dict]:
    from .candidates import fitting

    fixed = [d for d, ch in enumerate(order) if ch in whole]
    for combo in fitting([sizes[ch] for ch in order], devices, fixed, full):
        yield dict(zip(order, combo))


def layouts(node, devices: int, full: bool) -> Iterator[tuple]:
    """(activation layouts, weight layouts, wanted output or None) of every strategy of a node.

    `full`: only strategies that use every device, when the node has any (MindSpore's
    ``fully_use_devices``).
    """
    n_in = len(node.inputs)
    if node.kind in ("einsum", "pointwise"):
        words, out_word, sizes = letters(node)
        order = list(dict.fromkeys(ch for w in words for ch in w if ch))
        for counts in _letter_counts(order, sizes, devices, (), full):
            layout, axes = _mesh(order, counts, devices)
            maps = [_map(layout, axes, w) for w in words]
            yield tuple(maps[:n_in]), tuple(maps[n_in:]), None
            contracted = [ch for ch in order if ch not in out_word and counts[ch] > 1]
            if node.kind != "einsum" or not contracted:
                continue
            by = math.prod(counts[ch] for ch in contracted)
            for d, ch in enumerate(out_word):
                want = [counts.get(c, 1) for c in out_word]
                want[d] *= by
                if sizes[ch] % want[d] == 0:
                    local = TensorLayout(layout, tuple(axes.get(c, ()) for c in out_word),
                                         tuple(a for c in contracted for a in axes[c]))
                    yield tuple(maps[:n_in]), tuple(maps[n_in:]), out_layout_from_strategy(local, want)
        return
    shape = node.in_shapes[0]
    order = string.ascii_lowercase[:len(shape)]
    sizes = dict(zip(order, shape))
    for counts in _letter_counts(order, sizes, devices, (), full):
        layout, axes = _mesh(order, counts, devices)
        x = _map(layout, axes, order)
        params = tuple(_map(layout, axes, order[-1:]) for _ in node.params)
        yield (x,), params, None
