"""Gradient rules of the normalizations along a whole dim: softmax, layer norm and RMS norm.

Along a split dim these ops are composites of the elementwise ops and
reductions (`spmdsim.ops.norms`), whose rules give their gradients; along a
dim whole on every rank each is one node with the rule here, shard by shard.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ... import reference_grad
from ...engines import local as _local  # the kernel; the dry engine's zeros, not computed
from ..graph import record
from .grads import grad_tensor

__all__ = ["record_softmax", "record_normalized"]


def record_softmax(out: Any, x: Any, dim: int) -> Any:
    """softmax along a whole dim: dX = s * (dY - sum(dY * s)), shard by shard."""

    def backward(dy: Any) -> tuple:
        grad = _local(reference_grad.softmax_grad, dy.local, out.local, dy.local, dim)
        return (grad_tensor(x, grad, dy.layout.partial),)

    return record(out, "softmax", (x,), backward, out.layout, reads=(x, out))


def record_normalized(out: Any, x: Any, y: np.ndarray, kept: dict, d: int, centre: bool, op: str) -> Any:
    """layer_norm's (`centre`) or rms_norm's normalization `y` of x along the whole dim `d`:
    dX = r (dY - mean(dY) - y mean(dY y)) (rms: without mean(dY)), shard by shard.

    `kept["rstd"]`: r = 1 / sqrt(var + eps), which the forward's kernel keeps (a dry run keeps none).
    """
    n = x.global_shape[d]

    def grad(dy: np.ndarray) -> np.ndarray:
        inv = 1.0 / n
        g = dy - np.sum(dy * y, axis=d, keepdims=True) * inv * y
        if centre:
            g = g - np.sum(dy, axis=d, keepdims=True) * inv
        return g * kept["rstd"]

    def backward(dy: Any) -> tuple:
        return (grad_tensor(x, _local(grad, dy.local, dy.local), dy.layout.partial),)

    return record(out, op, (x,), backward, out.layout, reads=(x, out))
