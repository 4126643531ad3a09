"""Gradient rule of ``einsum(spec, *xs)``: each operand's gradient is the einsum of dY with the other operands.

Local math only: the gradient of operand k is pending over the axes that
split the letters it sums over (those not in its own word) and over the
other operands' pending sums.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...buffers import CAPTURING
from ...contraction import contract
from ..graph import attach
from .grads import grad_tensor, needs

__all__ = ["record_einsum"]


def record_einsum(out: Any, xs: tuple, plan: Any, want: Any, reads: tuple) -> Any:
    """The einsum of `xs` (a tuple, in the plan's layouts) by `plan` (spmdsim.infer.einsum's): `want` is the
    product's layout without pending sums (``with_partial(plan.local, ())``), `reads` the node's read layouts
    (the operands' then the product's), worked out once per call signature by spmdsim.ops.einsum."""
    name, per = _static(plan)
    return attach(out, name, xs, _EinsumGrads(xs, plan.spec.inputs, per), want, reads)


class _EinsumGrads:
    """An einsum node's backward: one object where a closure took a function and four cells (the forward's
    graph holds one per product until the backward: fewer objects for the garbage collector)."""

    __slots__ = ("xs", "words", "per", "need")

    def __init__(self, xs: tuple, words: tuple, per: tuple) -> None:
        self.xs, self.words, self.per = xs, words, per
        self.need = needs(xs)

    def __call__(self, dy: Any) -> tuple:
        xs, words, per, need = self.xs, self.words, self.per, self.need
        grads = []
        partial = dy._layout.partial
        plain = not CAPTURING[0]  # the blocks themselves (a captured step reads them as its record's, .local)
        d = dy._local if plain else dy.local
        for k, x in enumerate(xs):
            if not need[k]:
                grads.append(None)
                continue
            others, their_words, summed, carried = per[k]
            blocks = [d]  # dY's and the other operands' blocks (a loop: a comprehension is a frame of its own)
            for i in others:
                blocks.append(xs[i]._local if plain else xs[i].local)
            g = contract(their_words, blocks, words[k])
            if isinstance(g, tuple):  # letters only x has (summed away by the forward): dY spread over them
                g, present = g  # `present` keeps x's letter order, so a reshape puts the ones in place
                g = np.broadcast_to(np.reshape(g, [g.shape[present.index(ch)] if ch in present else 1
                                                   for ch in words[k]]), x.local.shape).copy()
            grads.append(grad_tensor(x, g, partial, summed, carried))
        return tuple(grads)


def _static(plan: Any) -> tuple:
    """What `plan`'s node and backward need that depends on the plan alone: the node's name and, per
    operand, (the other operands, their words after dY's, the axes of size above one that split the
    letters it sums over, the other operands' pending axes), remembered per plan object as
    spmdsim.ops._common.decided keeps the plan (each entry holds its plan, so an id in the table is never
    another object's)."""
    seen = _STATIC.get(id(plan))
    if seen is not None and seen[0] is plan:
        return seen[1]
    words, output = plan.spec.inputs, plan.spec.output
    mesh = plan.local.layout
    split = dict(plan.choice.splits)
    per = []
    for k in range(len(words)):
        others = tuple(i for i in range(len(words)) if i != k)
        summed = tuple(a for ch, axes in split.items() if ch not in words[k] for a in axes
                       if mesh.axis_size(a) > 1)
        # The operands are in the plan's layouts (ops.einsum moves those that are not): their pending axes.
        carried = tuple(a for i in others for a in plan.targets[i].partial)
        per.append((others, (output,) + tuple(words[i] for i in others), summed, carried))
    out = (f"einsum {plan.spec}", tuple(per))
    if len(_STATIC) >= 4096:  # a long run over many plans: start over
        _STATIC.clear()
    _STATIC[id(plan)] = (plan, out)
    return out


_STATIC: dict = {}  # id(einsum plan) -> (that plan, _static's answer)
