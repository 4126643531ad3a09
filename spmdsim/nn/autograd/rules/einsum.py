"""Gradient rule of ``einsum(spec, *xs)``: each operand's gradient is the einsum of dY with the other operands.

Local math only: the gradient of operand k is pending over the axes that
split the letters it sums over (those not in its own word) and over the
other operands' pending sums.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ....base.buffers import CAPTURE
from ....base.tables import put
from ....references.contraction import contract, pair, pair_function, pair_plain, present_letters
from ..graph import attach
from .grads import NEED2, grad_tensor, gradient_block, gradient_layout, needs

__all__ = ["record_einsum", "einsum_grads", "static", "EinsumGrads"]


def record_einsum(out: Any, xs: tuple, prepared: Any) -> Any:
    """The einsum of `xs` (a tuple, in the plan's layouts) by `prepared` (spmdsim.nn.ops.einsum's call signature's:
    its plan, the node's `name`, `want` (the product's layout without pending sums) and read layouts
    (`reads`: the operands' then the product's), per operand what its gradient contracts (`per`, `static`'s)
    and `ways`, the table where the backward keeps per dY layout the gradients' layouts and, for two operands
    whose gradients are both `pair`'s products, what each contracts)."""
    return attach(out, prepared.name, xs, einsum_grads(xs, prepared), prepared.want, prepared.reads)


def einsum_grads(xs: tuple, prepared: Any) -> "EinsumGrads":
    """The backward of the einsum of `xs` (a tuple, in the plan's layouts) prepared as `prepared` (`record_einsum`'s;
    a fused piece's rule runs one: spmdsim.nn.autograd.rules.fused)."""
    grads = _new(EinsumGrads)  # without an __init__'s frame (a node per product)
    grads.xs, grads.prepared = xs, prepared
    grads.need = NEED2[xs[0]._ag is None][xs[1]._ag is None] if len(xs) == 2 else needs(xs)
    return grads


_new = object.__new__
_ndarray = np.ndarray


class EinsumGrads:
    """An einsum node's backward: one object where a closure took a function and four cells (the forward's
    graph holds one per product until the backward: fewer objects for the garbage collector). spmdsim.nn.ops.einsum
    builds one of two operands itself, as `record_einsum` does (its slots set)."""

    __slots__ = ("xs", "prepared", "need")

    def __call__(self, dy: Any) -> tuple:
        prepared = self.prepared
        layout = dy._layout
        # Each operand's gradient layout: decided by the call signature (its operands' layout objects, the
        # plan) and dY's layout object, the same every step: kept in `prepared.ways` by dY's layout (the
        # entry holds it, so an id that matches is never another object's), with, for two operands whose
        # gradients are both `pair`'s products, each one's (dY's word, the other's, its own, its layout).
        seen = prepared.ways.get(id(layout))
        if seen is not None and seen[0] is layout and seen[2] is not None and not CAPTURE.on:
            # Most products: two operands, every decision kept; the blocks contracted (`pair_plain` where no
            # block is bfloat16 and the run is no dry run's), the DTensors built here (grad_tensor's usual case),
            # a block of another shape or dtype left to gradient_block. Written out for each operand (no loop).
            a, b = self.xs
            need_a, need_b = self.need
            d = dy._local
            fns = seen[4]
            if fns is not None and d.dtype.kind != "V" and not dy._mesh.engine.dry:
                # Most products (no block bfloat16, no dry run, an even cut: every rank's blocks shaped alike):
                # each gradient the kept function `pair_plain` runs for its two blocks' words and shapes
                # (contraction.pair_function's), called without pair_plain's frame and look-up. For
                # ndarray blocks it returns an ndarray in C order (contraction's `_compiled`): only its class,
                # dtype and shape are checked.
                a_fn, a_layout, b_fn, b_layout = fns
                ga = gb = None
                if need_a:
                    g = a_fn(d, b._local)
                    block = a._local
                    if type(g) is _ndarray and g.dtype is block.dtype and g.shape == block.shape:
                        ga = _new(type(a))
                        ga._mesh, ga._local, ga._layout, ga._shape, ga._ag = a._mesh, g, a_layout, a._shape, None
                    else:
                        ga = gradient_block(a, g, a_layout)
                if need_b:
                    g = b_fn(d, a._local)
                    block = b._local
                    if type(g) is _ndarray and g.dtype is block.dtype and g.shape == block.shape:
                        gb = _new(type(b))
                        gb._mesh, gb._local, gb._layout, gb._shape, gb._ag = b._mesh, g, b_layout, b._shape, None
                    else:
                        gb = gradient_block(b, g, b_layout)
                return ga, gb
            product = pair_plain if seen[3] and d.dtype.kind != "V" and not dy._mesh.engine.dry else pair
            (a_dy, a_other, a_word, a_layout), (b_dy, b_other, b_word, b_layout) = seen[2]
            ga = gb = None
            if need_a:
                g = product(a_dy, d, a_other, b._local, a_word)
                block = a._local
                if type(g) is _ndarray and g.dtype is block.dtype and g.shape == block.shape \
                        and g.flags.c_contiguous:
                    ga = _new(type(a))
                    ga._mesh, ga._local, ga._layout, ga._shape, ga._ag = a._mesh, g, a_layout, a._shape, None
                else:
                    ga = gradient_block(a, g, a_layout)
            if need_b:
                g = product(b_dy, d, b_other, a._local, b_word)
                block = b._local
                if type(g) is _ndarray and g.dtype is block.dtype and g.shape == block.shape \
                        and g.flags.c_contiguous:
                    gb = _new(type(b))
                    gb._mesh, gb._local, gb._layout, gb._shape, gb._ag = b._mesh, g, b_layout, b._shape, None
                else:
                    gb = gradient_block(b, g, b_layout)
            return ga, gb
        return self._general(dy, seen)

    def _general(self, dy: Any, seen: Any) -> tuple:
        """`__call__`'s gradients by the general helpers (`contract`, `pair`, grad_tensor): a signature's first
        call with dY's layout, more than two operands, a captured step; dY's layout's decisions then kept."""
        prepared, layout = self.prepared, dy._layout
        xs, need = self.xs, self.need
        words, per = prepared.plan.spec.inputs, prepared.per
        grads = []
        known = seen[1] if seen is not None and seen[0] is layout else None
        plain = not CAPTURE.on  # the blocks themselves (a captured step reads them as its record's, .local)
        d = dy._local if plain else dy.local
        for k, x in enumerate(xs):
            if not need[k]:
                grads.append(None)
                continue
            others, their_words, summed, carried, paired = per[k]
            if paired:  # dY and the other operand: `contract` without its call
                other = xs[others[0]]
                g = pair(their_words[0], d, their_words[1], other._local if plain else other.local, words[k])
            else:
                blocks = [d]  # dY's and the other operands' blocks (a loop: a comprehension is a frame of its own)
                for i in others:
                    blocks.append(xs[i]._local if plain else xs[i].local)
                g = contract(their_words, blocks, words[k])
            if isinstance(g, tuple):  # letters only x has (summed away by the forward): dY spread over them
                g, present = g  # `present` keeps x's letter order, so a reshape puts the ones in place
                g = np.broadcast_to(np.reshape(g, [g.shape[present.index(ch)] if ch in present else 1
                                                   for ch in words[k]]), x.local.shape).copy()
            if known is None:
                grads.append(grad_tensor(x, g, layout.partial, summed, carried))
                continue
            block = x._local  # read for its dtype and shape (a captured step's traced view has the same)
            if type(g) is _ndarray and g.dtype is block.dtype and g.shape == block.shape and g.flags.c_contiguous:
                # grad_tensor's usual case, its layout known and its DTensor built here (DTensor._trusted)
                grad = _new(type(x))
                grad._mesh, grad._local, grad._layout, grad._shape, grad._ag = x._mesh, g, known[k], x._shape, None
                grads.append(grad)
            else:
                grads.append(gradient_block(x, g, known[k]))
        if known is None:  # every operand's gradient layout, as grad_tensor gives it (pure of the key)
            self._keep_ways(layout, d)
        return tuple(grads)

    def _keep_ways(self, layout: Any, d: Any) -> None:
        """Keep in `prepared.ways`, under dY's `layout`, every operand's gradient layout as grad_tensor gives it
        (pure of the key) and, for two paired operands, what each contracts and its `pair_plain` function."""
        xs, prepared = self.xs, self.prepared
        words, per = prepared.plan.spec.inputs, prepared.per
        partial = layout.partial
        known = tuple(gradient_layout(x._layout, partial, p[2], p[3]) for x, p in zip(xs, per))
        paired = None  # two operands, both gradients `pair`'s: what each contracts, and its layout
        if len(xs) == 2 and per[0][4] and per[1][4]:
            paired = tuple(p[1] + (w, g) for p, w, g in zip(per, words, known))
        # (and whether no operand is bfloat16: its dtype is the signature's)
        wide = all(x._local.dtype.kind != "V" for x in xs)
        # With both, under the even cut (every rank's blocks of these layouts shaped alike, so one entry
        # serves the ranks' threads): each product's `pair_plain` function, kept with its gradient's layout.
        fns = None
        if paired is not None and wide and layout.layout.cut == "even" and all(
                x._layout.layout.cut == "even" for x in xs):
            (a_dy, a_other, a_word, a_layout), (b_dy, b_other, b_word, b_layout) = paired
            a, b = xs
            fns = (pair_function(a_dy, d, a_other, b._local, a_word), a_layout,
                   pair_function(b_dy, d, b_other, a._local, b_word), b_layout)
        put(prepared.ways, id(layout), (layout, known, paired, wide, fns), 64)


def static(plan: Any) -> tuple:
    """What `plan`'s node and backward need that depends on the plan alone: the node's name and, per
    operand, (the other operands, their words after dY's, the axes of size above one that split the
    letters it sums over, the other operands' pending axes, whether its gradient is contraction.pair's
    product of dY and one other operand). spmdsim.nn.ops.einsum keeps it in the call
    signature's `Prepared`."""
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
        their_words = (output,) + tuple(words[i] for i in others)
        # Whether the gradient is `pair`'s product of dY and one other operand (contract's two-operand case).
        paired = len(their_words) == 2 and bool(words[k]) and present_letters(their_words, words[k]) == words[k]
        per.append((others, their_words, summed, carried, paired))
    return f"einsum {plan.spec}", tuple(per)
