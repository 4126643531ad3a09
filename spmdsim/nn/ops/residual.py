"""The graph's fused residual (spmdsim.nn.ops.fused describes the pieces): ``h + ops.dropout(y + bias, p, seed,
mask_dims)``, the row-parallel output's bias, dropout and residual as one operator and one node, with the separate
operators' values, kept blocks and counts."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ...base import flops as _flops
from ..autograd.graph import attach, used_axes
from ..autograd.rules.fused import ResidualGrads, bias_sums
from ...base.buffers import CAPTURE, broadcast_zero
from ...runtime.engines import local as _engine_local
from ...errors import OperatorError
from ...base.flops import any_open, sweep
from ...base.precision import is_float, is_low, rounded, wide
from . import _common
from .pointwise import pointwise as _pointwise
from ._common import _PLAIN_DTYPES, dry_zeros, keep_mask, make_dtensor, prepared_result
from .masks import _mask_geometry, dropout, dropout_args
from .fused import _add_plan, _added, _Call, _in_place, _ndarray, _new, _rounds
from ...base.tables import put


def residual(h: Any, y: Any, bias: Any = None, p: float = 0.0, seed: Any = None,
             mask_dims: Optional[Sequence[int]] = None) -> Any:
    """``h + ops.dropout(y + bias, p, seed=seed, mask_dims=mask_dims)`` in one node (`bias` None: no add; `p` 0: no
    dropout; the dropout's arguments as ops.dropout's, whose node keeps its float factors): the separate operators'
    values, kept blocks and counts (see the module docstring).

    A repeated call signature (`_RESIDUAL_CALLS`: the operands' layout objects, shapes and dtypes, p, mask_dims,
    the rank) whose chain fuses and is not bfloat16 runs its kernels and builds its tensors and node here, from
    what its first call decided, without the general helpers; the rest take `_residual`."""
    try:
        key = id(h._layout), id(y._layout), h._shape, y._shape, h._local.dtype, y._local.dtype, type(p), p, \
            mask_dims, y._mesh.rank
        if bias is not None:
            key += (id(bias._layout), bias._shape, bias._local.dtype)
        call = _RESIDUAL_CALLS.get(key)
    except (AttributeError, TypeError):  # no DTensor, mask_dims as a list: the general path
        key = call = None
    mesh = y._mesh if call is not None else None
    if call is None or CAPTURE.on or mesh.engine.dry:
        return _residual(h, y, bias, p, seed, mask_dims, key)
    if p and type(seed) is not int:  # (p was checked by this signature's first call)
        dropout_args(p, seed)
    decided = call.residual
    biased = y
    if bias is not None:  # _added's kernel and count, its result built as prepared_result's
        first = decided.first
        a, b = y._local, bias._local
        block = np.add(a, b)
        if _flops._OPEN:
            sweep("add", [a, b], (block,))
        if type(block) is _ndarray and block.shape == first.block and block.flags.c_contiguous:
            biased = _new(_common._DTENSOR)
            biased._mesh, biased._local, biased._layout, biased._shape, biased._ag = \
                mesh, block, first.out, first.shape, None
        else:
            biased = prepared_result(mesh, block, first)
    # The dropped-out values' block (the node keeps it; no DTensor of it is read)
    dropped, factors, scale = biased._local, None, None
    if p:  # _dropped's kernel, mask and count
        local = dropped
        scale = np.asarray(1.0 / (1.0 - p), local.dtype)
        order, mask_shape, mask_region, back = call.geometry
        # (keep_mask's kernel itself: its replay wrapper's test answered, this thread does not capture)
        factors = np.multiply(_keep(mask_shape, seed, mask_region, p), scale)
        if order is not None:
            factors = factors.transpose(back)
        dropped = local * factors
        if type(dropped) is not _ndarray or dropped.shape != local.shape or not dropped.flags.c_contiguous:
            dropped = make_dtensor(mesh, dropped, biased._layout, biased._shape)._local  # (as make_dtensor makes it)
        if _flops._OPEN:
            sweep("dropout", (local,), (dropped, local))
    last = decided.last
    a, b = h._local, dropped
    block = np.add(a, b)
    if _flops._OPEN:
        sweep("add", [a, b], (block,))
    if type(block) is _ndarray and block.shape == last.block and block.flags.c_contiguous:
        out = _new(_common._DTENSOR)
        out._mesh, out._local, out._layout, out._shape, out._ag = mesh, block, last.out, last.shape, None
    else:
        out = prepared_result(mesh, block, last)
    need = h._ag is not None, y._ag is not None, bias is not None and bias._ag is not None
    if need == _NEED_NONE:
        return out
    grads = _new(ResidualGrads)  # its __init__'s fields, without its frame
    grads.h, grads.y, grads.bias, grads.biased, grads.factors, grads.scale = h, y, bias, biased, factors, scale
    grads.dropped, grads.out, grads.need, grads.sums = dropped, out, need, call.sums if need[2] else None
    return attach(out, decided.name, (h, y, bias), grads, last.want, decided.reads)


_NEED_NONE = (False, False, False)


_keep = keep_mask.__wrapped__  # the mask's kernel, for a call that knows this thread does not capture


# residual's call signature (the layout ids, shapes and dtypes of h and y; p's type and value; mask_dims; the rank;
# the bias's layout id, shape and dtype) -> _Call
_RESIDUAL_CALLS: dict = {}


def _residual(h: Any, y: Any, bias: Any, p: Any, seed: Any, mask_dims: Any, call_key: Any) -> Any:
    """`residual` through the general helpers (`call_key`: its call signature, kept in `_RESIDUAL_CALLS` where a
    repeat can run directly; None: never)."""
    if p:
        dropout_args(p, seed)
    elif bias is None:
        return _pointwise("add", h, y)
    first = _add_plan(y, bias) if bias is not None else None
    try:
        key = (id(first) if bias is not None else (id(y._layout), y._shape, y._local.dtype), id(h._layout), h._shape,
               h._local.dtype, bool(p))
        decided = _RESIDUALS.get(key)
    except (AttributeError, TypeError):  # an operand that is no DTensor (the separate operators say which)
        return _residual_separate(h, y, bias, p, seed, mask_dims)
    if decided is None:
        decided = _Residual(first, y, bias, h, p)
        put(_RESIDUALS, key, decided, 4096)
    grads_y = y._ag is not None or bias is not None and bias._ag is not None
    if not decided.fused or decided.low and (grads_y or h._ag is not None) and not _rounds(y):
        return _residual_separate(h, y, bias, p, seed, mask_dims)
    mesh, plain = y._mesh, not CAPTURE.on
    biased = y
    if bias is not None:
        biased = _added(mesh, first, y._local if plain else y.local, bias._local if plain else bias.local)
    dropped, factors, scale = biased, None, None
    if p:
        dropped, factors, scale = _dropped(biased, p, seed, mask_dims, grads_y)
    last = decided.last
    if last is None:  # the residual add's plan: its operands laid out alike, whole (checked), move nothing
        last = _add_plan(h, dropped)
        if not _in_place(last, h._layout):
            raise OperatorError(f"residual: the add of h {h._layout} and the dropped-out y {dropped._layout} moves "
                                "an operand")
        decided.last = last
    out = _added(mesh, last, h._local if plain else h.local, dropped._local if plain else dropped.local)
    if decided.reads is None:
        decided.reads = (first.reads if bias is not None else ()) + ((decided.inner,) * 2 if p else ()) + last.reads
    if (call_key is not None and not decided.low and dropped._layout is decided.inner
            and h._local.dtype in _PLAIN_DTYPES and dropped._local.dtype in _PLAIN_DTYPES
            and out._local.dtype in _PLAIN_DTYPES and type(mesh) is _common._MESH):
        call = _Call()
        call.residual = decided
        call.geometry = _mask_geometry(biased, mask_dims) if p else None
        call.sums = None if bias is None else bias_sums(first, bias)
        put(_RESIDUAL_CALLS, call_key, call, 4096)
    if not grads_y and h._ag is None:
        return out
    sums = None if bias is None or bias._ag is None else bias_sums(first, bias)
    return attach(out, decided.name, (h, y, bias),
                  ResidualGrads(h, y, bias, biased, factors, scale, dropped, out, sums), last.want, decided.reads)


class _Residual:
    """What a `residual` call signature decides, once: whether its chain is fused (the bias add and the residual
    add move no operand, nothing pending, a pending dY the residual add would pass the bias add passes too), the
    biased y's layout, whether its blocks are bfloat16, the residual add's plan and the node's name and read
    layouts (made on first use). Holds the layouts its key names by id."""

    __slots__ = ("first", "h_layout", "y_layout", "fused", "inner", "low", "last", "reads", "name")

    def __init__(self, first: Any, y: Any, bias: Any, h: Any, p: float) -> None:
        self.first, self.h_layout, self.y_layout = first, h._layout, y._layout
        self.inner = inner = first.out if bias is not None else y._layout  # the biased y's, the dropped-out values'
        dtype = first.dtype if bias is not None else y._local.dtype
        self.fused = not inner.partial and h._shape == y._shape and (h._layout is inner or h._layout == inner) \
            and h._local.dtype == dtype and (bias is None or _in_place(first, y._layout)
                                             and used_axes(first.reads) <= used_axes((inner,)))
        self.low = is_low(dtype)
        self.last = self.reads = None
        self.name = ("bias + " if bias is not None else "") + ("dropout + " if p else "") + "residual add"


# (id(the bias add's Prepared) or y's layout id, shape and dtype; id(h's layout), its shape and dtype; dropout?)
# -> _Residual
_RESIDUALS: dict = {}


def _dropped(x: Any, p: float, seed: Any, mask_dims: Any, kept: bool) -> tuple:
    """(ops.dropout(x, p, seed, mask_dims=mask_dims), the factors its node keeps, its scale) with kept "graph": its
    kernel, mask and count, without its node (`kept`: whether x takes a gradient, so that the node would keep
    the factors: a dry run makes them only then)."""
    local = x.local
    if not is_float(local.dtype):
        raise OperatorError(f"dropout of a DTensor of dtype {local.dtype.name!r}: dropout needs a floating dtype "
                            "(float16, float32 or float64); convert first, e.g. x.astype('float64')")
    low = is_low(local.dtype)
    scale = np.asarray(1.0 / (1.0 - p), np.float32 if low else local.dtype)
    dry = dry_zeros(x._mesh, local.shape, local.dtype, np.multiply, local, scale)
    if dry is not None:  # the factors the rule keeps, sized (zeros never touched): kept bytes measure alike
        factors = _engine_local(np.copy, broadcast_zero(dry.shape, scale.dtype), dry) if kept else None
        block = dry
    else:
        order, mask_shape, mask_region, back = _mask_geometry(x, mask_dims)
        factors = np.multiply(keep_mask(mask_shape, seed, mask_region, p), scale)
        if order is not None:
            factors = factors.transpose(back)
        block = rounded(wide(local) * factors, local.dtype) if low else local * factors
    out = make_dtensor(x._mesh, block, x._layout, x._shape)
    if any_open():  # the kept entries' factors drawn in the kernel and written beside the result
        sweep("dropout", (local,), (out.local, local))
    return out, factors, scale


def _residual_separate(h: Any, y: Any, bias: Any, p: float, seed: Any, mask_dims: Any) -> Any:
    """`residual` as its separate operators."""
    if bias is not None:
        y = _pointwise("add", y, bias)
    if p:
        y = dropout(y, p, seed=seed, mask_dims=mask_dims)
    return _pointwise("add", h, y)
