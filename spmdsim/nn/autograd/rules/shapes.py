"""Gradient rules of the ops that move entries without arithmetic: transpose, reshape, broadcast_to, narrow,
concatenate.

Each gradient is dY's entries put back where the forward took them from:
permuted or reshaped back, summed over broadcast dims, cut into the
operands' pieces, or padded with zeros around a slice. Along a split dim a
slice or a join moved rows between ranks (a `spmdsim.programs.plan.shift.Shift`, one
Alltoallv); its gradient moves them back by the reverse Shift, run by the
mover the forward hands the rule (`spmdsim.runtime.exchange`'s), so this
module imports no runtime.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ....base import buffers
from ....runtime.engines import local as _local  # the kernel; the dry engine's zeros, not computed
from ....programs.plan.shift import Shift
from ..graph import attach, record, with_partial
from .grads import grad_tensor, zeros_block

_SUM = np.add.reduce  # ndarray.sum's own kernel, without its Python wrapper (numpy's _methods._sum)

__all__ = ["record_transpose", "record_reshape", "record_broadcast_to", "record_narrow", "record_narrow_split",
           "record_concatenate", "record_concatenate_split"]


def record_transpose(out: Any, x: Any, dims: tuple[int, ...]) -> Any:
    """Permuted dims: the gradient is permuted back."""
    inverse = tuple(int(i) for i in np.argsort(dims))

    def backward(dy: Any) -> tuple:
        return (grad_tensor(x, np.transpose(dy.local, inverse), dy.layout.partial),)

    return record(out, "transpose", (x,), backward)


def record_reshape(out: Any, x: Any) -> Any:
    """A local reshape: the gradient is reshaped back."""
    back = _new(_ReshapedBack)  # without its __init__'s frame (a node per reshape)
    back.x = x
    # `record`'s node (its reads: x's layout and out's) without its call
    return attach(out, "reshape", (x,), back, None, (x._layout, out._layout))


_new = object.__new__


class _ReshapedBack:
    """A reshape's backward: one object where a closure took a function, its cell and their tuple (the
    forward's graph holds one per reshape until the backward: fewer objects for the garbage collector)."""

    __slots__ = ("x",)

    def __init__(self, x: Any) -> None:
        self.x = x

    def __call__(self, dy: Any) -> tuple:
        x = self.x
        d = dy._local if not buffers.CAPTURE.on else dy.local  # (a captured step reads its record's view)
        return (grad_tensor(x, d.reshape(x._local.shape), dy._layout.partial),)


def record_broadcast_to(out: Any, x: Any, new: tuple) -> Any:
    """x broadcast to global shape `new`: the grown dims (whole on every rank) summed back, on each rank's block."""
    lead = len(new) - x.local.ndim
    grown = tuple(lead + d for d, (o, n) in enumerate(zip(x.global_shape, new[lead:])) if o == 1 and n != 1)

    axes = tuple(range(lead)) + grown

    def summed(d: np.ndarray) -> np.ndarray:
        return _SUM(d, axis=axes, keepdims=True).reshape(x.local.shape)

    def backward(dy: Any) -> tuple:
        d = dy.local
        if not axes:
            return (grad_tensor(x, d.reshape(x.local.shape), dy.layout.partial),)
        # the sum on the running engine (a dry run: the engine's zeros of x's block, dY not read)
        block = _local(summed, buffers.broadcast_zero(x.local.shape, d.dtype), d)
        return (grad_tensor(x, block, dy.layout.partial),)

    return record(out, "broadcast_to", (x,), backward)


def record_narrow(out: Any, x: Any, index: tuple) -> Any:
    """A slice `index` of a dim whole on every rank: dY in place, zeros elsewhere."""

    def fill(d: np.ndarray) -> np.ndarray:
        grad = buffers.fresh(np.zeros(x.local.shape, d.dtype), 0)  # zeroed again by a replay of a captured step
        grad[index] = d
        return grad

    def backward(dy: Any) -> tuple:
        d = dy.local  # a dry run: the engine's zeros of x's block, not filled (spmdsim.runtime.sim.dry)
        like = buffers.broadcast_zero(x.local.shape, d.dtype)
        return (grad_tensor(x, _local(fill, like, d), dy.layout.partial),)

    return record(out, "narrow", (x,), backward)


def record_narrow_split(out: Any, x: Any, d: int, s: int, shape: tuple, rows: str, move: Callable) -> Any:
    """`narrow` of split dim `d` from row `s` (the result's global `shape`; `rows`, its "[a:b]" text): the
    gradient's rows moved back by the reverse Shift, zeros elsewhere.

    `move`: the runner the forward moved its rows with, ``move(mesh, local, shift, label) -> block``
    (`shifted` of the module spmdsim.runtime.exchange).
    """

    def backward(dy: Any) -> tuple:
        back = Shift(dy.layout, shape, with_partial(x.layout, dy.layout.partial), tuple(x.global_shape), d, -s)
        grad = move(dy.mesh, dy.local, back, f"narrow dim {d} {rows}: gradient back")
        return (grad_tensor(x, grad, dy.layout.partial),)

    # The gradient arrives whole over x's axes (`want`: the output's layout, pending sums over the axes x uses
    # summed first by the backward walk): the reverse Shift puts it in x's tensor map, where a pending sum over
    # an axis that splits x cannot stay (``x * x[0]`` with dim 0 split: the broadcast row's gradient is pending
    # over that axis). A pending sum over an axis x does not use passes through.
    return record(out, lambda: f"narrow dim {d} {rows} of {x.layout}", (x,), backward,
                  want=with_partial(out.layout, ()))


def record_concatenate(out: Any, xs: list, d: int) -> Any:
    """`xs` joined along a dim `d` whole on every rank: each operand's gradient is its piece of dY."""
    cuts = [int(x.local.shape[d]) for x in xs]
    bounds = np.cumsum([0] + cuts)

    def backward(dy: Any) -> tuple:
        pieces = []
        for x, lo, hi in zip(xs, bounds[:-1], bounds[1:]):
            if x._ag is None:
                pieces.append(None)
                continue
            index = (slice(None),) * d + (slice(int(lo), int(hi)),)
            pieces.append(grad_tensor(x, dy.local[index], dy.layout.partial))
        return tuple(pieces)

    return record(out, "concatenate", tuple(xs), backward)


def record_concatenate_split(out: Any, xs: list, plan: Any, move: Callable) -> Any:
    """`xs` joined along a dim split somewhere (the plan's `dim`, each operand at its `offsets`): the
    result's rows moved back to each operand that needs a gradient, all in one Alltoallv.

    `move`: the runner the forward joined them with, ``move(mesh, [(local, shift, out block), ...], label)``
    (`shifted_many` of the module spmdsim.runtime.exchange).
    """
    d, shape, mesh = plan.dim, plan.shape, out.mesh

    def backward(dy: Any) -> tuple:
        wanted = [(k, x, Shift(dy.layout, shape, with_partial(x.layout, dy.layout.partial), tuple(x.global_shape),
                               d, at)) for k, (x, at) in enumerate(zip(xs, plan.offsets)) if x._ag is not None]
        grads = [zeros_block(back.moves(mesh.rank).out_shape, dy.local.dtype) for _, _, back in wanted]
        move(mesh, [(dy.local, back, g) for (_, _, back), g in zip(wanted, grads)],
             f"concatenate dim {d}: gradients back")
        pieces: list = [None] * len(xs)
        for (k, x, _), g in zip(wanted, grads):
            pieces[k] = grad_tensor(x, g, dy.layout.partial)
        return tuple(pieces)

    # The gradient arrives whole over the axes the operands use (as narrow's): an operand split along `d` where
    # the result is whole (a length its shards do not divide) takes dY's rows in its own tensor map, where a
    # pending sum over an axis that splits it cannot stay (the joined tensor broadcast over a dim split by that
    # axis: its gradient is pending over it). A pending sum over an axis no operand uses passes through.
    return record(out, lambda: f"concatenate dim {d} into {plan.out}", tuple(xs), backward,
                  want=with_partial(out.layout, ()))
