"""Gradient rules of the normalizations along a whole dim: softmax, layer norm and RMS norm.

Along a split dim these ops are composites of the elementwise ops and
reductions (`spmdsim.nn.ops.norms`), whose rules give their gradients; along a
dim whole on every rank each is one node with the rule here, shard by shard.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ....references import backward as reference_grad
from ....base.buffers import CAPTURE, broadcast_zero
from ....runtime.engines import local as _local  # the kernel; the dry engine's zeros, not computed
from ....base.flops import any_open, sweep
from ....base.precision import is_low, rounded, wide
from ..graph import attach, record
from .grads import axes_of, grad_tensor

_SUM = np.add.reduce  # ndarray.sum's own kernel, without its Python wrapper (numpy's _methods._sum)

__all__ = ["record_softmax", "record_normalized", "record_layer_norm", "record_rms_norm"]


def record_softmax(out: Any, x: Any, dim: int) -> Any:
    """softmax along a whole dim: dX = s * (dY - sum(dY * s)), shard by shard."""

    def backward(dy: Any) -> tuple:
        if any_open():  # else nothing is counted: no blocks to gather
            sweep("softmax", (dy.local, out.local), (dy.local,))
        d, s = (dy._local, out._local) if not CAPTURE.on else (dy.local, out.local)  # (captured: views)
        grad = _local(reference_grad.softmax_grad, d, s, d, dim)
        return (grad_tensor(x, grad, dy.layout.partial),)

    return record(out, "softmax", (x,), backward, out.layout, reads=(x, out))


def record_normalized(out: Any, x: Any, y: np.ndarray, kept: dict, d: int, centre: bool, op: str) -> Any:
    """layer_norm's (`centre`) or rms_norm's normalization `y` of x along the whole dim `d`:
    dX = r (dY - mean(dY) - y mean(dY y)) (rms: without mean(dY)), shard by shard.

    `kept["rstd"]`: r = 1 / sqrt(var + eps), which the forward's kernel keeps (a dry run keeps none).
    """
    # `record`'s node (its reads: x's layout and out's) without its call
    return attach(out, op, (x,), _NormalizedGrads(x, y, kept, d, centre, op), out._layout,
                  (x._layout, out._layout))


class _NormalizedGrads:
    """`record_normalized`'s backward: one object where two closures took two functions and seven cells
    (the forward's graph holds one per norm until the backward: fewer objects for the garbage collector)."""

    __slots__ = ("x", "y", "kept", "d", "centre", "op", "n")

    def __init__(self, x: Any, y: np.ndarray, kept: dict, d: int, centre: bool, op: str) -> None:
        self.x, self.y, self.kept, self.d, self.centre, self.op = x, y, kept, d, centre, op
        self.n = x.global_shape[d]

    def grad(self, dy: np.ndarray) -> np.ndarray:
        y, d = self.y, self.d
        inv = 1.0 / self.n
        g = dy - _SUM(dy * y, axis=d, keepdims=True) * inv * y
        if self.centre:
            g = g - _SUM(dy, axis=d, keepdims=True) * inv
        return g * self.kept["rstd"]

    def __call__(self, dy: Any) -> tuple:
        d = dy.local  # read once (a captured step: its record's view)
        if any_open():  # else nothing is counted: no blocks to gather
            sweep(self.op, (d, self.y, self.kept["rstd"]), (d,))
        return (grad_tensor(self.x, _local(self.grad, d, d), dy._layout.partial),)


def record_layer_norm(out: Any, x: Any, weight: Any, bias: Any, stats: dict, d: int) -> Any:
    """layer_norm with its weight and bias along the whole last dim `d`, one node that keeps x and each
    row's mean and sqrt(var + eps) (`stats`, Apex's fused layer norm), not the normalized values nor the
    affine output: the backward makes y = (x - mean) / root again (the forward's values, bit for bit),
    then dW = sum(dY y), dB = sum(dY) (pending over the axes that split the rows) and
    dX = r (dY w - mean(dY w) - y mean(dY w y)) with r = 1 / root, as the graph's three rules do. bfloat16
    x: as TransformerEngine's fused LayerNorm's backward, in float32 throughout (y and dY w not rounded; dY
    rounded where the graph's walk rounds it, a no-op where it did), dX float32.
    """
    n = x.global_shape[d]
    rows = axes_of(x.layout, x.layout.tensor_map[:d] + x.layout.tensor_map[d + 1:])
    need = tuple(t is not None and t._ag is not None for t in (x, weight, bias))
    lead = tuple(range(x.layout.ndim - 1))
    low, shown = (x.dtype if is_low(x.dtype) else None), out.dtype

    def grads(dy: np.ndarray) -> tuple:
        y = (wide(x.local) - stats["mean"]) / stats["root"]
        if low is not None:  # dY rounded to the output's dtype (float32 beside a float32 weight), as the walk did
            dy = wide(rounded(dy, shown))
        dw = _SUM(dy * y, axis=lead) if need[1] else None
        db = _SUM(dy, axis=lead) if need[2] else None
        if not need[0]:
            return None, dw, db
        dyy = dy if weight is None else dy * wide(weight.local)
        inv = 1.0 / n
        g = dyy - _SUM(dyy * y, axis=d, keepdims=True) * inv * y
        g = g - _SUM(dyy, axis=d, keepdims=True) * inv
        return g * (1.0 / stats["root"]), dw, db

    def backward(dy: Any) -> tuple:
        if any_open():  # else nothing is counted: no blocks to gather
            w = None if weight is None else weight.local
            sweep("layer_norm", (dy.local, x.local, stats["mean"], stats["root"], w),
                  (dy.local if need[0] else None, w if need[1] else None, bias.local if need[2] else None))
        engine = dy.mesh.engine
        if engine.dry:  # the dry engine's zeros of each gradient's block, float32 beside bfloat16 as the real ones
            dt = np.float32 if low is not None else dy.local.dtype  # (they were the operands' own: bfloat16)
            gx, gw, gb = (None if t is None else engine.local(np.copy, broadcast_zero(t.local.shape, dt))
                          for t in (x, weight, bias))
        else:
            gx, gw, gb = grads(dy.local)
        passed = dy.layout.partial
        return (grad_tensor(x, gx, passed) if need[0] else None,
                grad_tensor(weight, gw, passed, rows) if need[1] else None,
                grad_tensor(bias, gb, passed, rows) if need[2] else None)

    return record(out, "layer_norm", (x, weight, bias), backward, out.layout, reads=(x, out))


def record_rms_norm(out: Any, x: Any, weight: Any, stats: dict, d: int) -> Any:
    """rms_norm with its weight along the whole last dim `d`, one node that keeps x and each row's
    sqrt(mean(x ** 2) + eps) (`stats["root"]`; TransformerEngine's fused RMSNorm keeps x and rsigma), not the
    normalized values nor the output: the backward makes y = x / root again (the forward's values, bit for bit),
    then dW = sum(dY y) (pending over the axes that split the rows) and dX = r (dY w - y mean(dY w y)),
    r = 1 / root, as the graph's two rules do. bfloat16 x: as the fused kernel, in float32 throughout (y and
    dY w not rounded; dY rounded where the graph's walk rounds it, a no-op where it did), dX float32.
    """
    n = x.global_shape[d]
    rows = axes_of(x.layout, x.layout.tensor_map[:d] + x.layout.tensor_map[d + 1:])
    need = (x._ag is not None, weight is not None and weight._ag is not None)
    lead = tuple(range(x.layout.ndim - 1))
    low, shown = (x.dtype if is_low(x.dtype) else None), out.dtype

    def grads(dy: np.ndarray) -> tuple:
        y = wide(x.local) / stats["root"]
        if low is not None:  # dY rounded to the output's dtype (float32 beside a float32 weight), as the walk did
            dy = wide(rounded(dy, shown))
        dw = _SUM(dy * y, axis=lead) if need[1] else None
        if not need[0]:
            return None, dw
        dyy = dy if weight is None else dy * wide(weight.local)
        g = dyy - _SUM(dyy * y, axis=d, keepdims=True) * (1.0 / n) * y
        return g * (1.0 / stats["root"]), dw

    def backward(dy: Any) -> tuple:
        if any_open():  # else nothing is counted: no blocks to gather
            w = None if weight is None else weight.local
            sweep("rms_norm", (dy.local, x.local, stats["root"], w),
                  (dy.local if need[0] else None, w if need[1] else None))
        engine = dy.mesh.engine
        if engine.dry:  # the dry engine's zeros of each gradient's block, float32 beside bfloat16 as the real ones
            dt = np.float32 if low is not None else dy.local.dtype
            gx, gw = (None if t is None else engine.local(np.copy, broadcast_zero(t.local.shape, dt))
                      for t in (x, weight))
        else:
            gx, gw = grads(dy.local)
        passed = dy.layout.partial
        return (grad_tensor(x, gx, passed) if need[0] else None,
                grad_tensor(weight, gw, passed, rows) if need[1] else None)

    return record(out, "rms_norm", (x, weight), backward, out.layout, reads=(x, out))
