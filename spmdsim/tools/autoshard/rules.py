"""The general operator kinds of the strategy search (a GPT's): einsum, broadcasting pointwise ops,
layer norm, reshape and a vocab-parallel cross-entropy.

Pure (never imports mpi4py). A strategy gives each index letter a slice count
(einsum's subscripts; a pointwise op's output dims; the input dims of a layer
norm, reshape or cross-entropy); its layouts share one device matrix, the
split letters in order of appearance plus the repeated-calculation axis "rep"
on the right (as `spmdsim.layouts.dialects.strategy` does for MindSpore's strategies).
What an operator does on those layouts is asked of `spmdsim.programs.infer`, whose
rules the operators run: the output layout, the pending sums and the
operator's own program (the step records `candidates.own_plan` prices):

- einsum: rule `infer_einsum`, then `resolve_partial`; own program: split contracted letters: Allreduce, or
  Reduce_scatter into an output dim
- pointwise: rule `infer_pointwise`; own program: none
- layernorm: rule `infer_norm("layer_norm")`; own program: hidden dim split: two Allreduces of one number per row (mean,
  variance)
- reshape: rule `infer_reshape`; own program: none (a local reshape)
- cross_entropy: rule `infer_cross_entropy`; own program: classes split: Allreduce(MAX) and a sum of two numbers per
  row; rows split: one sum of two numbers (the loss and the packed counts of bad and ignored labels; three past float's
  exact range)

The search adds one condition of its own: a candidate's operands are used
where they are (an einsum's or pointwise op's operands split alike, a layer
norm's weights split like x's hidden dim, no pending input), as the
redistributions into an operator are priced on the graph's edges.
"""
from __future__ import annotations

import math
import string
from typing import Iterator, Optional, Sequence

from ...errors import OperatorError, SpmdsimError
from ...programs.infer import infer_reshape, out_layout_from_strategy, resolve_partial
from ...programs.infer.einsum import infer_einsum, parse_einsum
from ...programs.infer.losses import infer_cross_entropy
from ...programs.infer.norms import infer_norm
from ...programs.infer.pointwise import broadcast_shape, infer_pointwise, operand_letters
from ...layouts.layout import Layout, TensorLayout
from .counts import fitting

__all__ = ["KINDS", "infer", "layouts", "letters"]

#: The kinds this module infers and enumerates.
KINDS = ("einsum", "pointwise", "layernorm", "reshape", "cross_entropy")


def letters(node) -> tuple[tuple[str, ...], str, dict]:
    """(per operand its letters, the output's letters, letter -> size) of an einsum or pointwise node.

    Operands are the activation inputs, then the weights. Einsum's letters are its
    subscripts (`parse_einsum`); a pointwise op's are its output dims'
    (`operand_letters`), and an operand's broadcast dims (missing, or of size 1) get
    none ("" in its word).
    """
    shapes = tuple(node.in_shapes) + tuple(p.shape for p in node.params)
    if node.kind == "einsum":
        spec = parse_einsum(node.spec, tuple(len(s) for s in shapes))
        sizes = {ch: n for word, s in zip(spec.inputs, shapes) for ch, n in zip(word, s)}
        return tuple(tuple(w) for w in spec.inputs), spec.output, sizes
    out = broadcast_shape(shapes, node.name)
    words = []
    for s in shapes:  # infer_pointwise's letters: a broadcast dim decides no split
        word, deciding = operand_letters(tuple(s), out)
        words.append(tuple(ch if ch in deciding else "" for ch in word))
    names = string.ascii_letters[:len(out)]
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


def infer(node, inputs: tuple, params: tuple, out: Optional[TensorLayout]) -> tuple:
    """(local result, finished output, flops per rank, program) of one node.

    `program`: the operator's own steps (`spmdsim.programs.infer`'s records), each with the global shape it acts on.
    """
    kind, dtype = node.kind, node.dtype
    operands = tuple(inputs) + tuple(params)
    shapes = tuple(node.in_shapes) + tuple(p.shape for p in node.params)
    if kind == "einsum":
        plan = infer_einsum(node.spec, operands, shapes, dtype)
        if plan.targets != operands:
            raise SpmdsimError(f"{node.name}: the operands' splits disagree")
        local = plan.local
        final, steps = resolve_partial(local, out)
        words, _, sizes = letters(node)
        where = {ch: axes for word, tl in zip(words, operands) for ch, axes in zip(word, tl.tensor_map)}
        work = math.prod(n // local.layout.group_size(where[ch]) for ch, n in sizes.items())
        return local, final, 2 * work, tuple((s, tuple(node.out_shape)) for s in steps)
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
    if kind == "layernorm":
        for p in params:
            if p.layout != x.layout or p.tensor_map != x.tensor_map[-1:]:
                raise SpmdsimError(f"{node.name}: weights {p} are not split like x's hidden dim {x}")
        norm = infer_norm("layer_norm", x, shape)
        return norm.out, norm.out, 8 * math.prod(x.local_shape(shape)), norm.program
    if kind == "cross_entropy":
        loss = infer_cross_entropy(x, TensorLayout(x.layout, x.tensor_map[:1]), shape, dtype)
        return loss.out, loss.out, 4 * math.prod(x.local_shape(shape)), loss.program
    raise OperatorError(f"{node.name}: kind {kind!r} is not one of {KINDS!r}")


def _letter_counts(order: Sequence[str], sizes: dict, devices: int, whole: Sequence[str],
                   full: bool, use: Optional[int] = None) -> Iterator[dict]:
    fixed = [d for d, ch in enumerate(order) if ch in whole]
    for combo in fitting([sizes[ch] for ch in order], devices, fixed, full, use):
        yield dict(zip(order, combo))


def layouts(node, devices: int, full: bool, use: Optional[int] = None) -> Iterator[tuple]:
    """(activation layouts, weight layouts, wanted output or None) of every strategy of a node.

    `full`: only strategies that use `use` devices (default: every device), when the node has any
    (MindSpore's ``fully_use_devices``).
    """
    n_in = len(node.inputs)
    shapes = tuple(node.in_shapes) + tuple(p.shape for p in node.params)
    if node.kind in ("einsum", "pointwise"):
        words, _, sizes = letters(node)
        order = list(dict.fromkeys(ch for w in words for ch in w if ch))
        for counts in _letter_counts(order, sizes, devices, (), full, use):
            layout, axes = _mesh(order, counts, devices)
            maps = [_map(layout, axes, w) for w in words]
            yield tuple(maps[:n_in]), tuple(maps[n_in:]), None
            if node.kind != "einsum":
                continue
            try:  # a split contracted letter leaves a pending sum, which may also Reduce_scatter
                local = infer_einsum(node.spec, tuple(maps), shapes, node.dtype).local
            except SpmdsimError:
                continue
            if not local.partial:
                continue
            for d in range(local.ndim):  # into each output dim (make_candidate refuses what does not divide)
                want = list(local.shards_per_dim)
                want[d] *= local.layout.group_size(local.partial)
                yield tuple(maps[:n_in]), tuple(maps[n_in:]), out_layout_from_strategy(local, want)
        return
    shape = node.in_shapes[0]
    order = string.ascii_lowercase[:len(shape)]
    sizes = dict(zip(order, shape))
    for counts in _letter_counts(order, sizes, devices, (), full, use):
        layout, axes = _mesh(order, counts, devices)
        x = _map(layout, axes, order)
        params = tuple(_map(layout, axes, order[-1:]) for _ in node.params)
        yield (x,), params, None
