"""The GPT's linear layers with their products in FP8, as TransformerEngine's Linear computes them (spmdsim.base.fp8).

- ``fp8_column(x, pairs, full, scales, site, names)``: x @ W_i + b_i for the column-split weights of `pairs`
  (stacked on a new first dim when several: Q, K and V). x is cast to e4m3 once (the tensor `site`:x), on
  this rank's piece, and the e4m3 piece gathered along the sequence with sequence parallelism (one byte an
  element); each weight cast to e4m3 (`names[i]`:w); each product of the FP8 values accumulated in float32,
  times the inverse scales, plus the bias in float32, rounded once to bfloat16 (cuBLAS's epilogue). The node
  keeps the e4m3 pieces of x and of the weights, and their scales: in the backward dY_i (bfloat16, as the walk
  rounds it) is cast to e5m2 (`names[i]`:dy), dW_i = X8^T dY8_i and dX = sum_i dY8_i W8_i^T, float32 products
  of the FP8 values times their inverse scales; the bias's gradient sums dY_i (not cast), as TransformerEngine's;
- ``fp8_row(x, w, out_layout, scales, name)``: x @ W with the contraction split over tp: x and W cast to e4m3,
  the float32 product times the inverse scales pending over tp, moved to `out_layout` (Reduce_scatter or
  Allreduce: summed in float32), rounded once to bfloat16; the backward as the column's, dY gathered along the
  sequence first (the conjugate of the forward's Reduce_scatter).

A scale is `scales.scale(key, format)` (spmdsim.base.fp8.Scales: delayed, from the previous steps' amaxes) and
each cast records the piece's amax (`observe`), which the trainer agrees over the mesh after the step; under
current scaling (`scales.recipe.scaling == "current"`) each cast first agrees its tensor's amax by an
Allreduce(MAX) over the mesh axes that split it and makes its scale from it. The reference step computes the
same values in one process (spmdsim.models.gpt.mixed).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ...base.buffers import broadcast_zero
from ...base.flops import gemm, sweep
from ...base.fp8 import BACKWARD, FORWARD, amax, fp8_dtype, fp8_product, quantize, scale_from
from ...errors import OperatorError
from ...layouts.layout import TensorLayout
from ...runtime.engines import local as _local
from ...runtime.executor import pending, redistribute, resolve
from ..autograd.graph import record, with_partial
from ..autograd.kept import shell
from ..autograd.rules.megatron import add_part
from ..autograd.rules.grads import axes_of, grad_tensor
from ._common import make_dtensor

__all__ = ["fp8_column", "fp8_row", "cast", "WEIGHT_CAST", "WEIGHT_COPIES"]

#: The kernel name (spmdsim.base.flops.sweep) of a weight's cast to e4m3: once a step, as TransformerEngine's.
WEIGHT_CAST = "fp8_weight_cast"
#: The kept kind of the weights' e4m3 copies, held once a step however many microbatches are in flight
#: (spmdsim.models.gpt.stage_memory): an FP8 kind (spmdsim.nn.autograd.kept.FP8), a byte an element.
WEIGHT_COPIES = "linear weights fp8"


def _inverse(*scales: Any) -> np.float32:
    """The product of the scales' inverses (each 1 / scale in float32, TransformerEngine's scale_inv)."""
    out = np.float32(1.0)
    for s in scales:
        out = np.float32(out * np.float32(np.float32(1.0) / np.float32(s)))
    return out


def cast(t: Any, block: np.ndarray, scales: Any, key: str, fmt: str) -> tuple:
    """(the FP8 `block` of the DTensor `t`'s piece, its scale): the scale `scales` gives `key` (under current
    scaling the one made from the tensor's amax, agreed over the axes that split it), the piece's amax recorded.
    A weight (`key` "...:w") is cast once a step: a later microbatch takes the copy the first made (the same
    parameter under the same scale: `scales.weights`)."""
    weight = key.endswith(":w")
    if weight:
        kept = scales.weights.get(key)
        if kept is not None and kept[0] is t:
            return kept[1], kept[2]
    mine = np.float32(0.0) if t.mesh.engine.dry else amax(block)
    if scales.recipe.scaling == "current":
        axes = tuple(a for a in t.layout.split_axes if t.layout.layout.axis_size(a) > 1)
        top = resolve(t.mesh, np.array([mine], np.float32), pending(t.mesh.layout, 1, axes), f"{key} amax",
                      reduction="max", owned=True) if axes else np.array([mine], np.float32)
        scale = scale_from(top[0], fmt, scales.recipe.margin, np.float32(1.0))
    else:
        scale = scales.scale(key, fmt)
    scales.observe(key, fmt, mine)
    q = _local(quantize, broadcast_zero(block.shape, fp8_dtype(fmt)), block, scale, fmt)
    if weight:
        scales.weights[key] = (t, q, scale)
    sweep(WEIGHT_CAST if weight else "fp8_cast", (block,), (q,))
    return q, scale


def _product(a: np.ndarray, b: np.ndarray, inverse: np.float32) -> np.ndarray:
    """`fp8_product` on the running engine (a dry run's zeros), counted as a GEMM of FP8 operands."""
    shape = a.shape[:-1] + b.shape[-1:]
    out = _local(fp8_product, broadcast_zero(shape, np.float32), a, b, inverse)
    gemm(a.shape, b.shape, a.dtype, (a, b, out))
    return out


def _gathered_fp8(x: Any, q: np.ndarray, full: TensorLayout) -> np.ndarray:
    """The FP8 piece `q` of x gathered to `full` (its bytes moved as uint8: one byte an element)."""
    if x.layout == full:
        return q
    moved = type(x)._trusted(x.mesh, q.view(np.uint8), x.layout, x.global_shape)
    return redistribute(moved, full).local.view(q.dtype)


def _rounded(y: np.ndarray, bias: Optional[np.ndarray], dtype: Any) -> np.ndarray:
    """float32 `y` plus the widened bias, rounded once to `dtype` (the GEMM's epilogue)."""
    def kernel() -> np.ndarray:
        z = y if bias is None else y + bias.astype(np.float32)
        return z.astype(dtype)
    return _local(kernel, broadcast_zero(y.shape, dtype))


def fp8_column(x: Any, pairs: Sequence[tuple], full: TensorLayout, scales: Any, site: str,
               names: Sequence[str]) -> Any:
    """x @ W_i + b_i for each (W_i, b_i or None) of `pairs` (weights split on their columns) with FP8 products;
    `site` names x's scale, `names` the weights'. One pair: the output split like W's columns; several: stacked."""
    entry = pairs[0][0].layout.tensor_map[-1]
    for w, _ in pairs:
        if w.layout.tensor_map != ((),) + (entry,) or w.global_shape[0] != x.global_shape[-1]:
            raise OperatorError(f"fp8_column: weight {tuple(w.global_shape)} {w.layout} is not split on its "
                                f"columns only, alike, with {x.global_shape[-1]} rows")
    qx, sx = cast(x, x.local, scales, site + ":x", FORWARD)
    QX = _gathered_fp8(x, qx, full)
    ws, ys = [], []
    for (w, b), name in zip(pairs, names):
        qw, sw = cast(w, w.local, scales, name + ":w", FORWARD)
        ws.append((qw, sw))
        ys.append(_rounded(_product(QX, qw, _inverse(sx, sw)), None if b is None else b.local, x.dtype))
    one = TensorLayout(full.layout, full.tensor_map[:-1] + (entry,))
    shape = tuple(x.global_shape[:-1]) + (pairs[0][0].global_shape[-1],)
    if len(ys) == 1:
        block, layout = ys[0], one
    else:
        block = _local(np.stack, broadcast_zero((len(ys),) + ys[0].shape, ys[0].dtype), ys)
        layout, shape = TensorLayout(full.layout, ((),) + one.tensor_map), (len(ys),) + shape
    out = make_dtensor(x.mesh, block, layout, shape)
    if x._ag is None and all(t is None or t._ag is None for pair in pairs for t in pair):
        return out
    return _record_column(out, x, tuple(pairs), full, (qx, sx), ws, scales, names)


def _record_column(out: Any, x: Any, pairs: tuple, full: TensorLayout, kx: tuple, ws: list, scales: Any,
                   names: Sequence[str]) -> Any:
    """The column node: keeps x's e4m3 piece and each weight's e4m3 copy with their scales, shells of x and W."""
    stacked = out.layout.ndim == x.layout.ndim + 1
    columns = axes_of(out.layout, out.layout.tensor_map[-1:])
    rows = axes_of(full, full.tensor_map[:-1])
    need_x = x._ag is not None
    qx, sx = kx
    xs = shell(x)
    shells = tuple((shell(w), None if b is None else shell(b)) for w, b in pairs)

    def backward(dy: Any) -> tuple:
        passed = dy.layout.partial
        QX = _gathered_fp8(xs, qx, full)
        QX2 = QX.reshape(-1, QX.shape[-1])
        grads: list = []
        dx: Optional[np.ndarray] = None
        for i, ((w, b), (qw, sw)) in enumerate(zip(shells, ws)):
            d = dy.local[i] if stacked else dy.local
            qd, sd = cast(dy, d, scales, names[i] + ":dy", BACKWARD)
            qd2 = qd.reshape(-1, qd.shape[-1])
            grads.append(grad_tensor(w, _product(QX2.T, qd2, _inverse(sx, sd)), passed, rows)
                         if w._ag is not None else None)
            db = None
            if b is not None and b._ag is not None:
                db = _local(lambda d=d: d.astype(np.float32).sum(axis=tuple(range(d.ndim - 1))),
                            np.zeros(d.shape[-1:], np.float32))
                sweep("bias_grad", (d,), (db,))
            grads.append(grad_tensor(b, db, passed, rows) if db is not None else None)
            if need_x:  # the products' sum, counted as the bf16 rule counts it
                dx = add_part(dx, _product(qd, np.swapaxes(qw, -1, -2), _inverse(sd, sw)))
        gx = None
        if need_x:
            like = type(xs)._trusted(xs.mesh, broadcast_zero(QX.shape, xs.dtype), full, xs.global_shape)
            gx = grad_tensor(like, dx, passed, columns)
        return (gx,) + tuple(grads)

    inputs = (xs,) + tuple(t for pair in shells for t in pair)
    return record(out, "fp8_column", inputs, backward, with_partial(out.layout, ()))


def fp8_row(x: Any, w: Any, out_layout: TensorLayout, scales: Any, name: str, local: TensorLayout) -> Any:
    """x @ W with x (..., in) and W (in, out) split alike on in, FP8 products (`name`: the weight's scales);
    `local`: the pending product's layout; the sums moved to `out_layout` in float32, rounded once to x's dtype."""
    if w.layout.tensor_map != (x.layout.tensor_map[-1], ()) or x.layout.partial:
        raise OperatorError(f"fp8_row: x {x.layout} and weight {w.layout} are not split alike on the "
                            "contraction (and whole elsewhere)")
    qx, sx = cast(x, x.local, scales, name + ":x", FORWARD)
    qw, sw = cast(w, w.local, scales, name + ":w", FORWARD)
    shape = tuple(x.global_shape[:-1]) + (w.global_shape[-1],)
    moved = redistribute(make_dtensor(x.mesh, _product(qx, qw, _inverse(sx, sw)), local, shape), out_layout)
    out = make_dtensor(x.mesh, _rounded(moved.local, None, x.dtype), moved.layout, moved.global_shape)
    if x._ag is None and w._ag is None:
        return out
    return _record_row(out, x, w, local, (qx, sx), (qw, sw), scales, name)


def _record_row(out: Any, x: Any, w: Any, local: TensorLayout, kx: tuple, kw: tuple, scales: Any,
                name: str) -> Any:
    """The row node: keeps the e4m3 pieces of x and W with their scales, shells of x and W."""
    rows = axes_of(local, local.tensor_map[:-1])
    need = (x._ag is not None, w._ag is not None)
    (qx, sx), (qw, sw) = kx, kw
    xs, wsh = shell(x), shell(w)

    def backward(dy: Any) -> tuple:
        passed = dy.layout.partial
        d = redistribute(type(dy)._trusted(dy.mesh, dy.local, dy.layout, dy.global_shape),
                         with_partial(local, passed)).local  # the forward's Reduce_scatter answered
        qd, sd = cast(dy, d, scales, name + ":dy", BACKWARD)
        gx = grad_tensor(xs, _product(qd, np.swapaxes(qw, -1, -2), _inverse(sd, sw)), passed) if need[0] else None
        gw = None
        if need[1]:
            gw = grad_tensor(wsh, _product(qx.reshape(-1, qx.shape[-1]).T, qd.reshape(-1, qd.shape[-1]),
                                           _inverse(sx, sd)), passed, rows)
        return gx, gw

    return record(out, "fp8_row", (xs, wsh), backward, with_partial(out.layout, ()))
