"""Gradient rule of ``einsum(spec, *xs)``: each operand's gradient is the einsum of dY with the other operands.

Local math only: the gradient of operand k is pending over the axes that
split the letters it sums over (those not in its own word) and over the
other operands' pending sums.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...contraction import contract
from ..graph import record, with_partial
from .grads import grad_tensor

__all__ = ["record_einsum"]


def record_einsum(out: Any, xs: tuple, plan: Any) -> Any:
    """The einsum of `xs` (in the plan's layouts) by `plan` (spmdsim.infer.einsum's)."""
    words, output = plan.spec.inputs, plan.spec.output
    mesh = plan.local.layout
    split = dict(plan.choice.splits)
    need = tuple(x._ag is not None for x in xs)

    def backward(dy: Any) -> tuple:
        grads = []
        for k, x in enumerate(xs):
            if not need[k]:
                grads.append(None)
                continue
            others = [i for i in range(len(xs)) if i != k]
            g = contract([output] + [words[i] for i in others], [dy.local] + [xs[i].local for i in others], words[k])
            if isinstance(g, tuple):  # letters only x has (summed away by the forward): dY spread over them
                g, present = g  # `present` keeps x's letter order, so a reshape puts the ones in place
                g = np.broadcast_to(np.reshape(g, [g.shape[present.index(ch)] if ch in present else 1
                                                   for ch in words[k]]), x.local.shape).copy()
            summed = tuple(a for ch, axes in split.items() if ch not in words[k] for a in axes
                           if mesh.axis_size(a) > 1)
            carried = tuple(a for i in others for a in xs[i].layout.partial)
            grads.append(grad_tensor(x, g, dy.layout.partial, summed, carried))
        return tuple(grads)

    return record(out, f"einsum {plan.spec}", xs, backward, with_partial(plan.local, ()))
