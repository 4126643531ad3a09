"""Gradient rules of the graph's fused pieces (`spmdsim.nn.ops.fused`): each runs the rules of the chain it stands for,
in the backward's order, without the walk between them.

- einsum + bias (+ reshape): dY reshaped back (the reshape's rule), the bias's gradient dY summed over the dims it
  was broadcast along (the add's rule: the same numpy reduction), dX and dW the einsum's rule on dY;
- bias + dropout + residual add: dH = dY (the add's rule), the dropped-out values' dY times the dropout's kept
  factors (its rule), rounded to bfloat16 where the bias add's node rounded it, then the bias's gradient summed
  over the broadcast dims and dY passed to y (the add's rule);
- reshape + einsum: the einsum's rule on dY, dX reshaped back to x's dims (the reshape's rule).

What the walk did between the chain's nodes is done where it changes a value: a gradient made C-ordered where its
tensor's gradient was (spmdsim.nn.autograd.rules.grads.gradient_block), a bfloat16 gradient rounded where a node
rounded one that was not rounded already (spmdsim.nn.autograd.engine's `_prepared`); a dry run's gradients are the
engine's zeros where the add's rule made them. The fused operators fuse only chains whose nodes read the same mesh
axes (a pending dY passes or is summed at the fused node as at the chain's first), so every gradient is the
chain's, bit for bit. Each rule object keeps every block the chain's nodes kept (spmdsim.nn.autograd.kept_bytes).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ....base import flops as _flops
from ....base.buffers import CAPTURE, broadcast_zero
from ....runtime.engines import c_order
from ....runtime.engines import local as _local  # the kernel; the dry engine's zeros, not computed
from ....base.flops import sweep
from ....base.precision import is_low
from .einsum import einsum_grads
from .grads import GRADIENT_DTYPE, grad_tensor, gradient_block, gradient_layout
from .pointwise import _sum_dims, _summed_axes
from ....base.tables import put

__all__ = ["EinsumBiasGrads", "NormAffineGrads", "ResidualGrads", "ReshapeEinsumGrads", "bias_sums"]

_SUM = np.add.reduce  # the add rule's reduction (ndarray.sum's own kernel)
_F32 = np.dtype(np.float32)


def _unread(d: np.ndarray) -> np.ndarray:
    """A dry run's stand-in kernel (the dry engine's `local` gives zeros shaped and typed as its `like`, unread)."""
    return d


def _rounded_wide(block: np.ndarray, low: np.dtype) -> np.ndarray:
    """`block` rounded once to `low`, widened to float32 again: the walk's rounding of a bfloat16 tensor's gradient."""
    return block.astype(low).astype(np.float32)


def bias_sums(add: Any, bias: Any) -> tuple:
    """What the add rule sums `bias`'s gradient over, for an add prepared as `add` (ops.pointwise's `Prepared` of
    (y, bias); or a product's, of (y, weight)): (the leading dims it lacks, its own broadcast dims, the mesh axes
    that split them, its gradient's layout where dY holds no pending sum), kept per prepared add (its operands'
    layouts and shapes decide it)."""
    seen = _SUMS.get(id(add))
    if seen is not None and seen[0] is add:
        return seen[1]
    lead, inner, dims = _sum_dims(bias._shape, add.shape)
    summed = _summed_axes(add.out, dims) if dims else ()
    out = (lead, inner, summed, gradient_layout(bias._layout, summed))
    put(_SUMS, id(add), (add, out), 4096)  # the entry holds the add: its id is not reused meanwhile
    return out


_SUMS: dict = {}  # id(a prepared add) -> (that add, bias_sums' answer)


def _summed_grad(t: Any, g: np.ndarray, partial: tuple, sums: tuple, dry: bool, count: bool = False) -> Any:
    """An elementwise rule's gradient of its broadcast operand `t` from the output-shaped block `g`: summed over
    the leading dims it lacks and its broadcast dims (`sums`: `bias_sums`' answer), pending over their axes too (a
    dry run's: the zeros of the sum's shape, `g` not read). `count`: the add rule's gradient of a bias, counted
    as the add rule counts it (dY read, the bias's gradient written)."""
    if count and _flops._OPEN:
        sweep("add", [g], [t.local])
    lead, inner, summed, whole = sums
    if dry and (lead or inner):
        shape = [n for k, n in enumerate(g.shape) if k not in lead]
        for k in inner:
            shape[k] = 1
        g = np.zeros(shape, g.dtype)
    else:
        if lead:
            g = _SUM(g, lead)  # (np.add.reduce(g, axis): positional, the same reduction)
        if inner:
            g = _SUM(g, inner, None, None, True)  # (axis, dtype, out, keepdims)
    block = t._local
    if g.shape != block.shape:
        g = g.reshape(block.shape)
    if not partial and type(g) is _ndarray and g.dtype is block.dtype and g.flags.c_contiguous:
        out = _new(type(t))  # grad_tensor's usual case, its layout kept in `sums`
        out._mesh, out._local, out._layout, out._shape, out._ag = t._mesh, g, whole, t._shape, None
        return out
    return grad_tensor(t, g, partial, summed)


def _made(like: Any, d: np.ndarray) -> np.ndarray:
    """The block of the gradient `d` of `like` as the rule's `grad_tensor` made it (C order, in its gradient dtype:
    float32 beside bfloat16): `d` itself where it is one already (most), without the DTensor."""
    if type(d) is _ndarray and d.flags.c_contiguous:
        dtype = like._local.dtype
        if d.dtype is dtype or d.dtype is _F32 and dtype.kind == "V" and is_low(dtype):
            return d
    return gradient_block(like, d, like._layout)._local


_ndarray = np.ndarray
_new = object.__new__


class EinsumBiasGrads:
    """`spmdsim.nn.ops.fused.einsum_bias`'s backward: the reshape's, the bias add's and the einsum's rules in turn.
    Keeps the einsum's operands (its rule's), the product before its bias and the biased product's block (the
    add's node kept both), as the three nodes kept them."""

    __slots__ = ("einsum", "y", "bias", "biased", "sums", "shaped")

    def __init__(self, xs: tuple, einsum: Any, y: Any, bias: Any, biased: Any, sums: Optional[tuple],
                 shaped: bool) -> None:
        self.einsum = einsum_grads(xs, einsum)  # `einsum`: the product's call signature's (ops.einsum's Prepared)
        self.y, self.bias, self.biased, self.sums, self.shaped = y, bias, biased, sums, shaped

    def __call__(self, dy: Any) -> tuple:
        d = dy._local if not CAPTURE.on else dy.local  # (a captured step reads its record's view)
        partial = dy._layout.partial
        bias, y = self.bias, self.y
        if self.shaped:  # the reshape's rule: dY back in the product's dims, C-ordered as its gradient was made
            d = d.reshape(self.biased.shape)
            if not d.flags.c_contiguous:
                d = c_order(d)
        if bias is None:
            if d is dy._local:
                return self.einsum(dy)
        else:
            dry = dy._mesh.engine.dry
            if dry:  # the add rule's dry gradient: the engine's zeros shaped as dY
                d = _local(_unread, d, d)
            gb = None if bias._ag is None else _summed_grad(bias, d, partial, self.sums, dry, True)
            if d is dy._local:
                return (gb,) + self.einsum(dy)
        # grad_tensor(y, d, partial), its usual case written out (nothing pending, a C-ordered block of y's
        # shape and gradient dtype: its DTensor built here), else its call
        block = y._local
        if not partial and type(d) is _ndarray and d.dtype is GRADIENT_DTYPE[block.dtype] and d.shape == block.shape \
                and d.flags.c_contiguous and not (layout := y._layout).partial:
            dy = _new(type(y))
            dy._mesh, dy._local, dy._layout, dy._shape, dy._ag = y._mesh, d, layout, y._shape, None
        else:
            dy = grad_tensor(y, d, partial)
        return self.einsum(dy) if bias is None else (gb,) + self.einsum(dy)


class ResidualGrads:
    """`spmdsim.nn.ops.residual`'s backward: the residual add's, the dropout's and the bias add's rules in turn.
    Keeps h, y, the biased y, the dropout's factors, the dropped-out values and the sum, as the three nodes kept
    them (`factors` None: no dropout, or a dry run's that kept none; `bias` None: no bias add; `dropped` the values'
    DTensor, or its block where `spmdsim.nn.ops.residual` built none: the rule reads neither)."""

    __slots__ = ("h", "y", "bias", "biased", "factors", "scale", "dropped", "out", "need", "sums")

    def __init__(self, h: Any, y: Any, bias: Any, biased: Any, factors: Optional[np.ndarray], scale: Any,
                 dropped: Any, out: Any, sums: Optional[tuple]) -> None:
        self.h, self.y, self.bias, self.biased, self.factors, self.scale = h, y, bias, biased, factors, scale
        self.dropped, self.out, self.sums = dropped, out, sums
        self.need = (h._ag is not None, y._ag is not None, bias is not None and bias._ag is not None)

    def __call__(self, dy: Any) -> tuple:
        d = dy._local if not CAPTURE.on else dy.local  # (a captured step reads its record's view)
        partial = dy._layout.partial
        need_h, need_y, need_b = self.need
        dry = dy._mesh.engine.dry
        if dry:  # the add rule's dry gradient: the engine's zeros shaped as dY
            d = _local(_unread, d, d)
        gh = None
        if need_h:  # grad_tensor(h, d, partial), its usual case written out (as EinsumBiasGrads'), else its call
            h = self.h
            block = h._local
            if not partial and type(d) is _ndarray and d.dtype is GRADIENT_DTYPE[block.dtype] \
                    and d.shape == block.shape and d.flags.c_contiguous and not (layout := h._layout).partial:
                gh = _new(type(h))
                gh._mesh, gh._local, gh._layout, gh._shape, gh._ag = h._mesh, d, layout, h._shape, None
            else:
                gh = grad_tensor(h, d, partial)
        if not need_y and not need_b:
            return gh, None, None
        biased = self.biased
        g = d
        if self.scale is not None:  # the dropout's rule: dY times the kept entries' factors
            if _flops._OPEN:
                sweep("dropout", (g, g), (g,))
            factors = self.factors
            g = _local(np.multiply, g, g, self.scale) if factors is None or dry else g * factors
            if type(g) is not _ndarray or not g.flags.c_contiguous or g.dtype is not biased._local.dtype:
                g = _made(biased, g)  # C order and dtype, as its gradient was made (its block, without the DTensor)
            low = biased._local.dtype
            if self.bias is not None and low.kind == "V" and is_low(low):  # bfloat16: the bias add's node rounded it
                g = _local(_rounded_wide, broadcast_zero(g.shape, _F32), g, low)
        bias = self.bias
        gb = None
        if bias is not None:
            if dry:
                g = _local(_unread, g, g)
            if need_b:
                gb = _summed_grad(bias, g, partial, self.sums, dry, True)
        gy = None
        if need_y:  # grad_tensor(y, g, partial), its usual case written out (as EinsumBiasGrads'), else its call
            y = self.y
            block = y._local
            if not partial and type(g) is _ndarray and g.dtype is GRADIENT_DTYPE[block.dtype] \
                    and g.shape == block.shape and g.flags.c_contiguous and not (layout := y._layout).partial:
                gy = _new(type(y))
                gy._mesh, gy._local, gy._layout, gy._shape, gy._ag = y._mesh, g, layout, y._shape, None
            else:
                gy = grad_tensor(y, g, partial)
        return gh, gy, gb


class ReshapeEinsumGrads:
    """`spmdsim.nn.ops.fused.reshape_einsum`'s backward: the einsum's rule on dY, the reshaped x's gradient reshaped
    back (the reshape's rule). Keeps x and the einsum's operands (the reshaped x: a view of x's block), as the two
    nodes kept them."""

    __slots__ = ("einsum", "x")

    def __init__(self, x: Any, flat: Any, w: Any, einsum: Any) -> None:
        flat._ag = x._ag  # (x's gradient is the reshaped x's: the einsum's rule makes it where x takes one)
        self.einsum = einsum_grads((flat, w), einsum)  # `einsum`: the product's call signature's Prepared
        self.x = x

    def __call__(self, dy: Any) -> tuple:
        g, gw = self.einsum(dy)
        if g is None:
            return None, gw
        x = self.x
        d = g._local if not CAPTURE.on else g.local
        block = x._local
        d = d.reshape(block.shape)
        partial = g._layout.partial
        # grad_tensor(x, d, partial), its usual case written out (as EinsumBiasGrads'), else its call
        if not partial and type(d) is _ndarray and d.dtype is GRADIENT_DTYPE[block.dtype] and d.flags.c_contiguous \
                and not (layout := x._layout).partial:
            g = _new(type(x))
            g._mesh, g._local, g._layout, g._shape, g._ag = x._mesh, d, layout, x._shape, None
            return g, gw
        return grad_tensor(x, d, partial), gw


class NormAffineGrads:
    """`spmdsim.nn.ops.norm_affine`'s backward: the bias add's, the product's and the normalization's rules in
    turn. Keeps x, the normalized values and 1 / sqrt(var + eps) (the normalization's rule, `norm`), the weight,
    the product and the bias (the product's and the add's nodes kept their operands) and the sum (the add's node
    kept its output), as the nodes kept them (`weight` or `bias` None: none)."""

    __slots__ = ("norm", "y", "weight", "scaled", "bias", "out", "w_sums", "b_sums", "need_w", "need_b")

    def __init__(self, norm: Any, y: Any, weight: Any, scaled: Any, bias: Any, out: Any, w_sums: Optional[tuple],
                 b_sums: Optional[tuple]) -> None:
        self.norm, self.y, self.weight, self.scaled, self.bias, self.out = norm, y, weight, scaled, bias, out
        self.w_sums, self.b_sums = w_sums, b_sums
        self.need_w = weight is not None and weight._ag is not None
        self.need_b = bias is not None and bias._ag is not None

    def __call__(self, dy: Any) -> tuple:
        d = dy._local if not CAPTURE.on else dy.local  # (a captured step reads its record's view)
        partial = dy._layout.partial
        dry = dy._mesh.engine.dry
        bias, weight, y = self.bias, self.weight, self.y
        gb = gw = None
        if bias is not None:  # the add rule: the bias's gradient dY summed over its broadcast dims, dY passed on
            if dry:  # the add rule's dry gradient: the engine's zeros shaped as dY
                d = _local(_unread, d, d)
            if self.need_b:
                gb = _summed_grad(bias, d, partial, self.b_sums, dry, True)
            if type(d) is not _ndarray or not d.flags.c_contiguous or d.dtype is not self.scaled._local.dtype:
                d = _made(self.scaled, d)  # (the product's node rounds it again: no change)
        if weight is not None:  # the product's rule: dY times the weight, the weight's gradient dY y summed
            need_w = self.need_w
            plain = not CAPTURE.on
            yb = y._local if plain else y.local
            wb = weight._local if plain else weight.local
            if _flops._OPEN:  # its count: dY and both operands read, the gradients written
                sweep("mul", [d, yb, wb], [yb, wb] if need_w else [yb])
            if dry:  # the dry engine's zeros (one block, shaped as dY, for each operand)
                g = gw = _local(_unread, d, d)
            else:
                g = d * wb
                gw = d * yb if need_w else None
            if need_w:
                gw = _summed_grad(weight, gw, partial, self.w_sums, dry)
            if type(g) is not _ndarray or not g.flags.c_contiguous or g.dtype is not y._local.dtype:
                g = _made(y, g)  # (its usual case, a C-ordered block of y's dtype: `g` itself, without its call)
            low = y._local.dtype
            if low.kind == "V" and is_low(low):  # bfloat16: the normalization's node rounded it
                g = _local(_rounded_wide, broadcast_zero(g.shape, _F32), g, low)
            d = g
        norm = self.norm  # the normalization's rule
        if _flops._OPEN:
            sweep(norm.op, (d, norm.y, norm.kept["rstd"]), (d,))
        g = _local(norm.grad, d, d)
        x = norm.x
        block = x._local
        # grad_tensor(x, g, partial), its usual case written out (as EinsumBiasGrads'), else its call
        if not partial and type(g) is _ndarray and g.dtype is GRADIENT_DTYPE[block.dtype] and g.shape == block.shape \
                and g.flags.c_contiguous and not (layout := x._layout).partial:
            gx = _new(type(x))
            gx._mesh, gx._local, gx._layout, gx._shape, gx._ag = x._mesh, g, layout, x._shape, None
            return gb, gw, gx
        return gb, gw, grad_tensor(x, g, partial)
