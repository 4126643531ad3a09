"""Gradient rules of Megatron's fused pieces (`spmdsim.nn.ops.megatron`): each keeps only what it reads.

- column-parallel products: dW_i = X^T dY_i, db_i = sum dY_i (pending over the axes that split the
  rows), dX = sum_i dY_i W_i^T (pending over the axes that split the columns: the walk Reduce_scatters
  it onto the sequence, or it stays pending to the layer norm, as in the graph). X is the kept input
  gathered again along the sequence: one Allgather, Megatron's;
- row-parallel product: dY gathered along the sequence (the conjugate of the forward's
  Reduce_scatter, as in the graph), dX = dY W^T, dW = X^T dY;
- bias, dropout and residual: d residual = dY, d y = dY * mask / (1 - p), d bias = its sum;
- SwiGLU (Megatron's bias_swiglu): from its kept input z = (gate, up) alone, d gate = dY silu'(gate) up and
  d up = dY silu(gate), silu'(x) = s (1 + x (1 - s)), s = sigmoid(x) (Megatron's swiglu_back), stacked as z;
- rotary embeddings (TransformerEngine's fused RoPE): dX = dY cos + rotate_half^T(dY sin), rotate_half^T
  [u1, u2] -> [u2, -u1]: the tables alone, no block of X.

Under a low-precision policy the gradients are float32 (spmdsim.base.precision): each rule reads dY rounded to
the activations' dtype (the walk rounds it), multiplies the bfloat16 blocks widened (precision.product),
and bias-dropout-add rounds d y as the graph rounds the gradient of y + bias before its bias sums it.

The inputs a rule does not read are recorded as shells (`spmdsim.nn.autograd.kept.shell`), so a node
keeps none of their blocks.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np

from ....references.activations import sigmoid, silu_slope
from ....base.buffers import broadcast_zero
from ....runtime.engines import local as _local  # the kernel; the dry engine's zeros, not computed
from ....runtime.engines import matmul as _product  # np.matmul; the dry engine's zeros, unmultiplied
from ....base.flops import sweep
from ....layouts.layout import TensorLayout
from ....base.precision import as_rows, is_low, wide
from ..graph import record, with_partial
from ..kept import nothing, shell
from .grads import axes_of, grad_tensor

__all__ = ["record_column", "record_row", "record_bias_dropout_add", "record_swiglu", "record_rotary",
           "rotate_halves", "add_part"]


def _lead(ndim: int) -> tuple:
    return tuple(range(ndim - 1))


def _rows(a: np.ndarray, dry: bool) -> np.ndarray:
    """`a` (..., n) seen as (rows, n) for a product: a view, or numpy's copy when `a`'s strides need one; in
    a dry run the view where it is one (no page read: the block itself, which spmdsim.base.flops tells apart from
    the blocks a rank holds anyway), else a read-only broadcast zero of that shape (the dry engine's product
    reads shapes only)."""
    if dry and not a.flags.c_contiguous:
        return nothing(a.dtype, (math.prod(a.shape[:-1]), a.shape[-1]))
    return as_rows(a)


def _bias_grad(d: np.ndarray, dry: bool) -> np.ndarray:
    """`d` summed over its leading dims; in a dry run the zeros of that shape, `d` not read (its zeros)."""
    return np.zeros(d.shape[-1:], d.dtype) if dry else d.sum(axis=_lead(d.ndim))


def record_column(out: Any, x: Any, pairs: tuple, full: TensorLayout, gather: Callable) -> Any:
    """`out` = gather(x) @ W_i + b_i for each (W_i, b_i) of `pairs` (stacked on a first dim when several).

    `gather(x, full)`: x laid out as `full` outside the graph (the backward's Allgather). The node keeps
    x's block as it came (a sequence shard with sequence parallelism), no product.
    """
    stacked = out.layout.ndim == x.layout.ndim + 1
    columns = axes_of(out.layout, out.layout.tensor_map[-1:])
    rows = axes_of(full, full.tensor_map[:-1])
    need_x = x._ag is not None

    def backward(dy: Any) -> tuple:
        passed, dry = dy.layout.partial, dy.mesh.engine.dry
        X = gather(x, full).local
        X2 = _rows(X, dry)
        grads: list = []
        dx: Optional[np.ndarray] = None
        for i, (w, b) in enumerate(pairs):
            d = dy.local[i] if stacked else dy.local
            need_w = w._ag is not None
            grads.append(grad_tensor(w, _product(X2.T, _rows(d, dry)), passed, rows) if need_w else None)
            need_b = b is not None and b._ag is not None
            db = None
            if need_b:
                db = _bias_grad(d, dry)
                sweep("bias_grad", (d,), (db,))
            grads.append(grad_tensor(b, db, passed, rows) if need_b else None)
            if need_x:
                dx = add_part(dx, _product(d, np.swapaxes(w.local, -1, -2)))
        gx = None
        if need_x:
            like = type(x)._trusted(x.mesh, nothing(x.dtype, X.shape), full, x.global_shape)
            gx = grad_tensor(like, dx, passed, columns)
        return (gx,) + tuple(grads)

    inputs = (x,) + tuple(t for pair in pairs for t in pair)
    return record(out, "column_parallel_linear", inputs, backward, with_partial(out.layout, ()))


def add_part(dx: Optional[np.ndarray], part: np.ndarray) -> np.ndarray:
    """The input's gradient so far, `dx` (None: none yet), plus one weight's `part` of it, summed into `part`'s
    block: the sum a kernel of its own (a fused column's products add their parts one by one)."""
    if dx is None:
        return part
    sweep("add", (dx, part), (part,))
    return _local(np.add, part, dx, part)


def record_row(out: Any, x: Any, w: Any, local: TensorLayout, gather: Callable) -> Any:
    """`out` = x @ W moved from `local` (the product's layout, pending over the contraction's axes) by a
    Reduce_scatter or an Allreduce. The node keeps x's block, not the product."""
    rows = axes_of(local, local.tensor_map[:-1])
    need = (x._ag is not None, w._ag is not None)

    def backward(dy: Any) -> tuple:
        passed, dry = dy.layout.partial, dy.mesh.engine.dry
        d = gather(dy, with_partial(local, passed)).local  # the forward's Reduce_scatter answered
        gx = grad_tensor(x, _product(d, np.swapaxes(w.local, -1, -2)), passed) if need[0] else None
        gw = None
        if need[1]:
            gw = grad_tensor(w, _product(_rows(x.local, dry).T, _rows(d, dry)), passed, rows)
        return gx, gw

    return record(out, "row_parallel_linear", (x, w), backward, with_partial(out.layout, ()))


def record_bias_dropout_add(out: Any, y: Any, bias: Any, residual: Any, keep: Optional[np.ndarray],
                            scale: np.generic) -> Any:
    """`out` = residual + dropout(y + bias): the node keeps the boolean mask `keep` (None: no dropout)
    and shells of y and the residual (bias None: no bias); `scale`: 1 / (1 - p), a numpy scalar (no array
    kept)."""
    need = (y._ag is not None, bias is not None and bias._ag is not None, residual._ag is not None)
    rows = axes_of(y.layout, y.layout.tensor_map[:-1])
    low = y.dtype if is_low(y.dtype) else None  # bfloat16: d(y + bias) rounded to it, as the graph's walk does
    y, residual = shell(y), shell(residual)

    def backward(dy: Any) -> tuple:
        passed, d = dy.layout.partial, dy.local
        if keep is None:
            inner = d
        elif low is None:
            inner = _local(lambda: d * np.multiply(keep, scale), d)
        else:
            inner = _local(lambda: (d * np.multiply(keep, scale)).astype(low).astype(np.float32), d)
        if keep is not None:
            sweep("dropout", (d, keep), (inner,))
        if need[1]:
            sweep("bias_grad", (inner,), (bias.local,))
        return (grad_tensor(y, inner, passed) if need[0] else None,
                grad_tensor(bias, _bias_grad(inner, dy.mesh.engine.dry), passed, rows) if need[1] else None,
                grad_tensor(residual, d, passed) if need[2] else None)

    return record(out, "bias_dropout_add", (y, bias, residual), backward, with_partial(out.layout, ()))


def _swiglu_back(dy: np.ndarray, z: np.ndarray) -> np.ndarray:
    """(d gate, d up) stacked, in dY's dtype (float32 at bfloat16: the halves widened), from z = (gate, up)."""
    gate, up = (wide(z[0]), wide(z[1])) if is_low(z.dtype) else (z[0], z[1])
    s = sigmoid(gate)
    return np.stack([dy * silu_slope(gate, s) * up, dy * (gate * s)])


def record_swiglu(out: Any, z: Any) -> Any:
    """`out` = silu(z[0]) * z[1]: the node keeps z (fc1's stacked output) and computes silu again."""

    def backward(dy: Any) -> tuple:
        d = dy.local
        like = broadcast_zero(z.local.shape, d.dtype)  # z's shape in dY's dtype (a dry run's zeros)
        dz = _local(_swiglu_back, like, d, z.local)
        sweep("bias_swiglu", (d, z.local), (dz,))
        return (grad_tensor(z, dz, dy.layout.partial),)

    return record(out, "bias_swiglu", (z,), backward, with_partial(out.layout, ()))


def rotate_halves(a: np.ndarray) -> np.ndarray:
    """[-a2, a1] of `a` (..., 2, n) seen as its halves a1 = a[..., 0, :], a2 = a[..., 1, :] (rotate_half)."""
    return np.stack([-a[..., 1, :], a[..., 0, :]], axis=-2)


def _rotary_back(dy: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """dY cos + rotate_half^T(dY sin) of dY (t, b, n, d), in dY's dtype (float32 at bfloat16)."""
    t, b, n, d = dy.shape
    halves = dy.reshape(t, b, n, 2, d // 2)
    u = halves * sin
    return (halves * cos + np.stack([u[..., 1, :], -u[..., 0, :]], axis=-2)).reshape(t, b, n, d)


def record_rotary(out: Any, x: Any, cos: np.ndarray, sin: np.ndarray) -> Any:
    """`out` = x cos + rotate_half(x) sin: the node keeps x's shell and the tables (shared by every layer)."""
    x = shell(x)

    def backward(dy: Any) -> tuple:
        d = dy.local
        dx = _local(_rotary_back, broadcast_zero(d.shape, d.dtype), d, cos, sin)
        sweep("rotary", (d, cos, sin), (dx,))
        return (grad_tensor(x, dx, dy.layout.partial),)

    return record(out, "rotary", (x,), backward, with_partial(out.layout, ()))
