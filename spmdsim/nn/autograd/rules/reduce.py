"""Gradient rules of the reductions: sum, mean, max, min, prod.

``sum`` spreads dY over the reduced dims and ``mean`` divides it by the
global count; ``max`` and ``min`` send dY to the positions that attain the
extreme, shared equally among ties counted over the whole group, as
``numpy``'s ``amax`` derivative and JAX do: over a split dim the ties' count
is one Allreduce, which the rule asks of the DTensor it is given
(`DTensor.redistribute`), so this module imports no runtime.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ....base.buffers import broadcast_zero
from ....runtime.engines import local as _local  # the kernel; the dry engine's zeros, not computed
from ....base.flops import sweep
from ..graph import record, with_partial
from .grads import grad_tensor, zeros_block

__all__ = ["record_reduce", "record_prod"]


def record_reduce(kind: str, out: Any, x: Any, plan: Any, axes: tuple, keepdims: bool, count: int) -> Any:
    """`kind` ("sum", "mean", "max" or "min") of x over the dims `axes` by `plan` (spmdsim.programs.infer's
    reduction plan; `count`: the number of entries each result sums)."""
    def backward(dy: Any) -> tuple:
        d = dy.local if keepdims else np.expand_dims(dy.local, axes)
        block = x.local.shape
        if kind in ("sum", "mean"):  # the gradient read and spread over x's block
            sweep(kind, (dy.local,), (x.local,))
            d = d / count if kind == "mean" and count else d  # (no entries: x's blocks are empty, d spreads over none)
            # on the running engine: a dry run's spread is the engine's zeros of x's block, nothing copied
            return (grad_tensor(x, _local(_spread, broadcast_zero(block, d.dtype), d, block), dy.layout.partial),)
        sweep(kind, (dy.local, x.local, out.local), (x.local,))  # where x met the extreme, the gradient
        extreme = out.local if keepdims else np.expand_dims(out.local, axes)
        if x.mesh.engine.dry:  # no mask of x's block made (the engine's zeros of the ties: their shape)
            hit, rows = None, tuple(1 if i in axes else n for i, n in enumerate(block))
            ties = zeros_block(rows, x.dtype)
        else:
            hit = x.local == extreme
            ties = hit.sum(axis=axes, keepdims=True).astype(x.dtype)
        if plan.steps:  # ties elsewhere in the group count too: their sum over the reduced dims' axes
            ndim = x.layout.ndim
            kept = plan.out if keepdims else _keepdims_layout(plan.out, axes, ndim)
            shape = tuple(1 if i in axes else n for i, n in enumerate(x.global_shape))
            pending = with_partial(kept, plan.local.partial)
            ties = type(x)(x.mesh, ties, pending, shape).redistribute(kept).local
        like = broadcast_zero(block, np.result_type(d.dtype, ties.dtype))  # a dry run's: its zeros, not computed
        return (grad_tensor(x, _local(_shared, like, d, hit, ties), dy.layout.partial),)

    return record(out, kind, (x,), backward, with_partial(plan.local, ()))


def _spread(d: np.ndarray, shape: tuple) -> np.ndarray:
    """`d` spread over `shape` (a sum's gradient over the dims it summed), a block of its own."""
    return np.broadcast_to(d, shape).copy(order="K")


def _shared(d: np.ndarray, hit: np.ndarray, ties: np.ndarray) -> np.ndarray:
    """dY where x met the extreme, shared among the ties (a max's or min's gradient)."""
    return d * hit / ties


def _keepdims_layout(layout: Any, axes: tuple, ndim: int) -> Any:
    """`layout` of a reduction without keepdims, with the reduced dims put back unsplit."""
    entries = list(layout.tensor_map)
    for d in axes:
        entries.insert(d, ())
    return layout.layout(*[e or None for e in entries], partial=layout.partial)


def record_prod(out: Any, x: Any, axes: tuple, keepdims: bool) -> Any:
    """Each rank's product of its block over the dims `axes` (spmdsim.nn.ops.reduce.prod): dY times the product of
    the other entries along them. dY arrives summed over the axes x uses (a pending sum over another axis
    passes: the gradient is linear in dY)."""
    def backward(dy: Any) -> tuple:
        d = dy.local if keepdims else np.expand_dims(dy.local, axes)
        sweep("prod", (dy.local, x.local), (x.local,))
        return (grad_tensor(x, d * others(x.local, axes), dy.layout.partial),)

    return record(out, "prod", (x,), backward, with_partial(out.layout, ()))


def others(a: np.ndarray, axes: tuple) -> np.ndarray:
    """Each entry's product of the other entries of `a` along `axes` (prefix and suffix products: no division,
    so beside one zero the rest's product, not NaN)."""
    if a.size == 0:
        return np.ones_like(a)
    back = tuple(range(a.ndim - len(axes), a.ndim))
    moved = np.moveaxis(a, axes, back)
    lead = moved.shape[:a.ndim - len(axes)]
    flat = moved.reshape(lead + (int(np.prod(moved.shape[len(lead):], dtype=np.int64)),))
    ones = np.ones(lead + (1,), a.dtype)
    before = np.cumprod(np.concatenate([ones, flat[..., :-1]], -1), -1)
    after = np.cumprod(np.concatenate([ones, flat[..., :0:-1]], -1), -1)[..., ::-1]
    return np.moveaxis((before * after).reshape(moved.shape), back, axes)
