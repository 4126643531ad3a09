"""The graph's fused norm (spmdsim.nn.ops.fused describes the pieces): a layer norm's or RMSNorm's normalization
along a whole last dim times its weight plus its bias, as one operator and one node."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...base import flops as _flops
from ..autograd.graph import Leaf, attach, used_axes
from ..autograd.rules.fused import NormAffineGrads, bias_sums
from ..autograd.rules.norms import _NormalizedGrads, record_normalized
from ...base.buffers import CAPTURE
from ...base.flops import sweep
from ...base.precision import is_low
from . import _common
from .pointwise import pointwise as _pointwise
from ._common import make_dtensor, prepared_result
from .normalize import normal_values
from .fused import _add_plan, _added, _in_place, _ndarray, _new
from ...base.tables import put


class _Norm:
    """What a `norm_affine` call signature decides, once: the product's and the add's plans (ops.mul's of the
    normalized values and the weight, ops.add's of that and the bias), what the weight's and the bias's gradients
    sum over (the mul and add rules'), and the fused node's name, `want` and read layouts; `fused` False where the
    chain moves an operand, holds a pending sum, changes the dtype or the shape, or reads a mesh axis that the
    node its backward meets first does not (the separate operators run). Holds the layouts its key names by id
    (its plans do)."""

    __slots__ = ("mul", "add", "fused", "name", "want", "reads", "w_sums", "b_sums", "plain", "low")

    def __init__(self, y: Any, weight: Any, bias: Any, op: str) -> None:
        layout, dtype = y._layout, y._local.dtype
        self.mul = self.add = self.w_sums = self.b_sums = None
        self.fused, last, reads = not layout.partial, None, (layout, layout)  # the normalization's reads
        name = op
        if weight is not None and self.fused:
            self.mul = last = _add_plan(y, weight, "mul")
            self.fused = _in_place(last, layout) and last.dtype == dtype and tuple(last.shape) == tuple(y._shape)
            if self.fused:
                reads += last.reads
                self.w_sums = bias_sums(last, weight)
                name += " * weight"
        if bias is not None and self.fused:
            before = y if self.mul is None else make_dtensor(y._mesh, y._local, self.mul.out, y._shape)
            self.add = last = _add_plan(before, bias)
            self.fused = _in_place(last, layout) and last.dtype == dtype and tuple(last.shape) == tuple(y._shape)
            if self.fused:
                reads += last.reads
                self.b_sums = bias_sums(last, bias)
                name += " + bias"
        # The backward meets the last node first: its `want` and reads decide what a pending dY does; every node of
        # the chain reads no axis that one does not (what passes it passes them all, as through the chain).
        self.fused = self.fused and last is not None and used_axes(reads) <= used_axes(last.reads)
        self.name, self.reads = name, reads
        self.want = None if last is None else last.want
        # no bfloat16 kernel (norm_affine runs the plain ones itself)
        self.plain = all(plan is None or plan.dtype_name != "bfloat16" for plan in (self.mul, self.add))
        self.low = False  # whether the normalized values are bfloat16 (set by norm_affine)


# (op, id(x's layout), x's shape and dtype, id(the weight's layout), its shape and dtype, the bias's) -> _Norm
_NORMS: dict = {}


def _first_norm(key: tuple, out: Any, y: np.ndarray, weight: Any, bias: Any, op: str) -> _Norm:
    """The `_Norm` a call signature decides at its first call, kept in `_NORMS` under `key`."""
    norm = _Norm(out, weight, bias, op)
    norm.low = is_low(y.dtype)  # (y's dtype follows x's, in the key)
    put(_NORMS, key, norm, 1024)
    return norm


def _affine_added(mesh: Any, norm: _Norm, y: np.ndarray, out: Any, weight: Any, bias: Any, plain: bool) -> tuple:
    """(the product, the sum) of `norm_affine` by `_added` (a captured step, a dry run, an unusual block)."""
    scaled = z = out
    if weight is not None:
        scaled = z = _added(mesh, norm.mul, y if plain else out.local, weight._local if plain else weight.local,
                            "mul", np.multiply)
    if bias is not None:
        z = _added(mesh, norm.add, scaled._local if plain else scaled.local, bias._local if plain else bias.local)
    return scaled, z


def _separate(out: Any, weight: Any, bias: Any) -> Any:
    """The normalized values `out` times `weight` plus `bias` (each None: none) by the separate operators."""
    if weight is not None:
        out = _pointwise("mul", out, weight)
    return out if bias is None else _pointwise("add", out, bias)


def norm_affine(x: Any, d: int, eps: float, centre: bool, op: str, weight: Any = None, bias: Any = None) -> Any:
    """layer_norm's (`centre`) or rms_norm's normalization of x along its whole last dim `d`, times `weight`,
    plus `bias` (each None: none), in one node (`kept="graph"`): the normalization's node
    (spmdsim.nn.ops.normalize._normalized), ops.mul's and ops.add's values, kept blocks and counts (see the module
    docstring). x's layout is resolved (nothing pending), its rows whole on every rank (the caller's checks)."""
    out, y, kept = normal_values(x, d, eps, centre, op)
    if weight is None and bias is None:
        return out if x._ag is None else record_normalized(out, x, y, kept, d, centre, op)
    try:  # (flat: one tuple built a call; a None weight or bias holds one place, a DTensor's three)
        if weight is not None and bias is not None:
            key = op, id(x._layout), x._shape, x._local.dtype, id(weight._layout), weight._shape, \
                weight._local.dtype, id(bias._layout), bias._shape, bias._local.dtype
        elif weight is not None:
            key = op, id(x._layout), x._shape, x._local.dtype, id(weight._layout), weight._shape, \
                weight._local.dtype, None
        else:
            key = op, id(x._layout), x._shape, x._local.dtype, None, id(bias._layout), bias._shape, \
                bias._local.dtype
        norm = _NORMS.get(key)
    except (AttributeError, TypeError):  # what is no DTensor (the separate operators say so)
        norm = key = None
    if norm is None and key is not None:
        norm = _first_norm(key, out, y, weight, bias, op)
    xa = x._ag
    if xa is not None:  # the separate nodes where a bfloat16 x is a leaf (its node rounds nothing): `_rounds`
        record = norm is not None and norm.fused and (not norm.low or type(xa) is not Leaf)
    else:  # ... or where x takes no gradient but the weight or bias does (the product's node keeps no x)
        record = False
        if norm is None or not norm.fused or (weight is not None and weight._ag is not None
                                              or bias is not None and bias._ag is not None):
            norm = None
    if xa is not None and not record or norm is None:
        # the separate nodes: where the chain moves or changes an operand, and the cases above
        if xa is not None:
            out = record_normalized(out, x, y, kept, d, centre, op)
        return _separate(out, weight, bias)
    mesh, plain = x._mesh, not CAPTURE.on
    z = scaled = out
    if plain and norm.plain and not mesh.engine.dry:  # _added's kernels and counts, their results built here
        if weight is not None:
            mul, b = norm.mul, weight._local
            block = np.multiply(y, b)
            if _flops._OPEN:
                sweep("mul", [y, b], (block,))
            if type(block) is _ndarray and block.shape == mul.block and block.flags.c_contiguous:
                scaled = z = _new(_common._DTENSOR)
                z._mesh, z._local, z._layout, z._shape, z._ag = mesh, block, mul.out, mul.shape, None
            else:
                scaled = z = prepared_result(mesh, block, mul)
        if bias is not None:
            add, a, b = norm.add, scaled._local, bias._local
            block = np.add(a, b)
            if _flops._OPEN:
                sweep("add", [a, b], (block,))
            if type(block) is _ndarray and block.shape == add.block and block.flags.c_contiguous:
                z = _new(_common._DTENSOR)
                z._mesh, z._local, z._layout, z._shape, z._ag = mesh, block, add.out, add.shape, None
            else:
                z = prepared_result(mesh, block, add)
    else:
        scaled, z = _affine_added(mesh, norm, y, out, weight, bias, plain)
    if xa is None:
        return z
    norm_grads = _new(_NormalizedGrads)  # its __init__'s fields, without its frame
    norm_grads.x, norm_grads.y, norm_grads.kept, norm_grads.d, norm_grads.centre, norm_grads.op, norm_grads.n = \
        x, y, kept, d, centre, op, x._shape[d]
    grads = _new(NormAffineGrads)  # its __init__'s fields, without its frame
    grads.norm, grads.y, grads.weight, grads.scaled, grads.bias, grads.out = norm_grads, out, weight, scaled, bias, z
    grads.w_sums, grads.b_sums = norm.w_sums, norm.b_sums
    grads.need_w = weight is not None and weight._ag is not None
    grads.need_b = bias is not None and bias._ag is not None
    # the bias's gradient first, then the weight's, then x's: as the add's, the product's and the normalization's
    # nodes gave them
    return attach(z, norm.name, (bias, weight, x), grads, norm.want, norm.reads)
