"""Gradient rules of the elementwise ops: numpy's broadcasting ops, activations, bias add, scale, dropout.

Each operand's gradient is the local derivative times dY, summed over the
dims the operand was broadcast along (a pending sum over the axes that split
those dims) and over the pending sums the forward kept; shard by shard, no
communication. `DERIVATIVES` holds each op's derivative, beside the forward
kernels of `spmdsim.nn.ops.pointwise`.
"""
from __future__ import annotations

import contextlib
import math
import operator
from typing import Any, Callable

import numpy as np

from ....references import activations
from ....base.buffers import CAPTURE
from ....runtime.engines import local as _local  # the kernel; the dry engine's zeros, not computed
from ....base import flops as _flops
from ....base.flops import any_open, sweep
from ....base.precision import as_rows, wide
from ..graph import attach, record, with_partial
from ..kept import shell
from .grads import NEED1, NEED2, axes_of, grad_tensor, gradient_block, needs, zeros_block
from ....base.tables import put

_SUM = np.add.reduce  # ndarray.sum's own kernel, without its Python wrapper (numpy's _methods._sum)

__all__ = ["DERIVATIVES", "NO_DERIVATIVE", "PointwiseGrads", "quiet", "record_pointwise", "record_activation",
           "record_bias_add", "record_scale", "record_dropout", "record_dropout_mask"]


def _half(mask: np.ndarray, ties: np.ndarray) -> np.ndarray:
    return mask + 0.5 * ties


def _clip_grads(dy: np.ndarray, x: np.ndarray, low: np.ndarray, high: np.ndarray, need: tuple) -> tuple:
    """Gradients of numpy.clip = minimum(maximum(x, low), high): x gets dY inside [low, high] (bounds
    included), low where x is below it, high where the clamped value is above it (also when low > high)."""
    above = np.maximum(x, low) > high
    inner = np.where(above, 0, dy)
    return (inner * (x >= low) if need[0] else None, inner * (x < low) if need[1] else None,
            dy * above if need[2] else None)


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _gelu_erf_slope(x: np.ndarray) -> np.ndarray:
    """d/dx x Phi(x) = Phi(x) + x phi(x); bfloat16 x in float32 (as `activations.gelu_erf` computes it)."""
    x = wide(x)
    return 0.5 * (1.0 + activations.erf(x * _INV_SQRT_2)) + x * _INV_SQRT_2PI * np.exp(-0.5 * x * x)


#: The piecewise constant ops: a zero gradient for each operand that takes one, reading nothing.
_CONSTANT = ("floordiv", "round", "rint", "floor", "ceil", "sign")

#: op -> its derivative: (dy, operands, out, need) -> per operand the gradient or None. The comparisons
#: (eq, lt, ...) have none: their bool results take no gradient.
DERIVATIVES: dict[str, Callable] = {
    "add": lambda dy, x, o, n: (dy, dy),
    "sub": lambda dy, x, o, n: (dy, -dy if n[1] else None),
    "mul": lambda dy, x, o, n: (dy * x[1] if n[0] else None, dy * x[0] if n[1] else None),
    "div": lambda dy, x, o, n: (dy / x[1] if n[0] else None, -dy * o / x[1] if n[1] else None),
    "mod": lambda dy, x, o, n: (dy if n[0] else None, -dy * np.floor_divide(x[0], x[1]) if n[1] else None),
    "log1p": lambda dy, x, o, n: (dy / (1 + x[0]),),
    "expm1": lambda dy, x, o, n: (dy * (o + 1),),
    **dict.fromkeys(_CONSTANT, lambda dy, x, o, n: tuple(np.zeros_like(dy) if need else None for need in n)),
    "maximum": lambda dy, x, o, n: (dy * _half(x[0] > x[1], x[0] == x[1]), dy * _half(x[1] > x[0], x[0] == x[1])),
    "minimum": lambda dy, x, o, n: (dy * _half(x[0] < x[1], x[0] == x[1]), dy * _half(x[1] < x[0], x[0] == x[1])),
    "where": lambda dy, x, o, n: (None, np.where(x[0], dy, 0) if n[1] else None,
                                  np.where(x[0], 0, dy) if n[2] else None),
    "exp": lambda dy, x, o, n: (dy * o,),
    "log": lambda dy, x, o, n: (dy / x[0],),
    "sqrt": lambda dy, x, o, n: (dy * 0.5 / o,),
    "tanh": lambda dy, x, o, n: (dy * (1 - o * o),),
    "neg": lambda dy, x, o, n: (-dy,),
    "abs": lambda dy, x, o, n: (dy * np.sign(x[0]),),
    "pow": lambda dy, x, o, n: (dy * x[1] * np.power(x[0], x[1] - 1) if n[0] else None,
                                dy * o * np.log(x[0]) if n[1] else None),
    "sigmoid": lambda dy, x, o, n: (dy * o * (1 - o),),
    "silu": lambda dy, x, o, n: (dy * activations.silu_slope(x[0]),),
    "sin": lambda dy, x, o, n: (dy * np.cos(x[0]),),
    "cos": lambda dy, x, o, n: (-dy * np.sin(x[0]),),
    "square": lambda dy, x, o, n: (2 * dy * x[0],),
    "rsqrt": lambda dy, x, o, n: (-0.5 * dy * o * o * o,),
    "clip": lambda dy, x, o, n: _clip_grads(dy, *x, n),
    "erf": lambda dy, x, o, n: (dy * _TWO_OVER_SQRT_PI * np.exp(-x[0] * x[0]),),
    "gelu_erf": lambda dy, x, o, n: (dy * _gelu_erf_slope(x[0]),),
}

#: The ops with no derivative, their results bool or integer: the comparisons, the bitwise and logical ops, the
#: value tests. Every other op of spmdsim.nn.ops.pointwise has its entry in DERIVATIVES: one with neither is refused
#: when called, not recorded without a gradient.
NO_DERIVATIVE = frozenset({"eq", "lt", "gt", "le", "ge", "ne", "and", "or", "xor", "invert", "logical_and",
                           "logical_or", "logical_xor", "logical_not", "isnan", "isinf", "isfinite"})


#: What each derivative reads besides dY (spmdsim.base.flops.sweep's count): "x" its operands, "o" the output;
#: absent: the operands. `_PASSED`: operands whose gradient is dY itself where not broadcast (no kernel).
_READS = {"add": "", "sub": "", "neg": "", "exp": "o", "sqrt": "o", "tanh": "o", "sigmoid": "o", "rsqrt": "o",
          "div": "xo", "pow": "xo", "expm1": "o", **dict.fromkeys(_CONSTANT, "")}
_PASSED = {"add": (0, 1), "sub": (0,), "mod": (0,)}
#: The ops whose derivative reads dY alone (their rule passes it no operand's block).
_BLIND = frozenset(op for op, reads in _READS.items() if not reads)


def _count_grads(op: str, dy: Any, xs: list, out: Any, need: tuple, shape: tuple) -> None:
    """Count the gradient kernel of elementwise `op` (spmdsim.base.flops.sweep), from shapes only: dY and what
    the derivative reads, read; each needed gradient written unless it is dY itself."""
    if not any_open():  # nothing counts: no lists to gather
        return
    passed = _PASSED.get(op, ())
    writes = [x.local for i, (x, n) in enumerate(zip(xs, need))
              if n and (tuple(x.global_shape) != shape or i not in passed)]
    if not writes:
        return
    reads = _READS.get(op, "x")
    sweep(op, [dy.local] + ([x.local for x in xs] if "x" in reads else []) + ([out.local] if "o" in reads else []),
          writes)


#: Ops that warn on finite operands (x / 0, log 0, sqrt and pow of negatives, exp's overflow), forward and
#: backward: numpy's warnings silenced there, as the masked and padded values of a model meet them by
#: design. The others warn only on operands that are already inf or nan, as numpy does in one process;
#: np.errstate costs ~10 us a call, more than a small shard's arithmetic.
LOUD = frozenset({"div", "log", "sqrt", "pow", "exp", "rsqrt", "floordiv", "mod", "log1p", "expm1"})


def quiet(op: str, **errors: str) -> Any:
    """np.errstate(**errors) for the ops that warn on finite operands, else a context that does nothing."""
    return np.errstate(**errors) if op in LOUD else _NULL


_NULL = contextlib.nullcontext()  # stateless: one shared by every call and thread


def _summed(local: np.ndarray, shape: tuple, out_shape: tuple, dry: bool = False) -> tuple[np.ndarray, tuple[int, ...]]:
    """`local` (an output-shaped gradient block) summed down to an operand of global `shape`.

    Returns the block and the output dims summed over (whose split axes make it pending). `dry`: a dry
    run's block (zeros): the zeros of the sum's shape, not added up.
    """
    lead, inner, dims = _sum_dims(shape, out_shape)
    if dry and (lead or inner):
        kept = [n for d, n in enumerate(local.shape) if d not in lead]
        for d in inner:
            kept[d] = 1
        return zeros_block(tuple(kept), local.dtype), dims  # (np.zeros would clear each page of its block)
    if lead:
        local = _SUM(local, axis=lead)
    if inner:
        local = _SUM(local, axis=inner, keepdims=True)
    return local, dims


def _sum_dims(shape: tuple, out_shape: tuple) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(leading output dims the operand lacks, its own broadcast dims, both as output dims) for `_summed`."""
    key = (shape, out_shape)
    try:
        return _SUM_DIMS[key]
    except KeyError:
        pass
    lead = len(out_shape) - len(shape)
    dims = tuple(range(lead)) + tuple(lead + d for d, s in enumerate(shape) if s == 1 and out_shape[lead + d] != 1)
    out = put(_SUM_DIMS, key, (tuple(range(lead)), tuple(d - lead for d in dims if d >= lead), dims), 4096)
    return out


_SUM_DIMS: dict = {}  # (operand shape, output shape) -> _sum_dims's answer (a step asks for the same few)
# (id(output layout), summed dims) -> (that layout, the axes of size above one that split them): by the
# layout object (a plan's, the same every step), the entry holding it so its id is not reused.
_SUMMED_AXES: dict = {}


def _summed_axes(layout: Any, dims: tuple[int, ...]) -> tuple[str, ...]:
    """``axes_of(layout, the map entries of dims)``, remembered."""
    key = (id(layout), dims)
    seen = _SUMMED_AXES.get(key)
    if seen is not None and seen[0] is layout:
        return seen[1]
    out = axes_of(layout, (layout.tensor_map[d] for d in dims))
    put(_SUMMED_AXES, key, (layout, out), 4096)
    return out


def record_pointwise(op: str, out: Any, xs: tuple, prepared: Any) -> Any:
    """Record elementwise `op` of `xs` (a tuple, in the plan's layouts) with numpy broadcasting: `prepared` is
    the call signature's (spmdsim.nn.ops.pointwise's ``_Prepared``): its plan, its op's derivative
    (``DERIVATIVES[op]``), the node's `want` (the plan's output layout without pending sums) and read layouts
    (the operands' then the output's), and `ways`, the table where the backward keeps what it decides."""
    # The rule's object built without its __init__'s frame (a node per elementwise op), `needs` without its
    # call for one or two operands (the nested table `_NEED` gives the shared tuple by the two tests).
    grads = _new(PointwiseGrads)
    grads.op, grads.xs, grads.out, grads.prepared = op, xs, out, prepared
    if len(xs) == 2:
        grads.need = NEED2[xs[0]._ag is None][xs[1]._ag is None]
    elif len(xs) == 1:  # (recorded: its operand takes a gradient)
        grads.need = NEED1
    else:
        grads.need = needs(xs)
    return attach(out, op, xs, grads, prepared.want, prepared.reads)


_new = object.__new__


class PointwiseGrads:
    """A pointwise node's backward: one object where a closure took a function and eight cells (the
    forward's graph holds one per op until the backward: fewer objects for the garbage collector).
    spmdsim.nn.ops.pointwise builds one of two operands itself, as `record_pointwise` does (its slots set)."""

    __slots__ = ("op", "xs", "out", "prepared", "need")

    def __init__(self, op: str, xs: tuple, out: Any, prepared: Any, need: tuple) -> None:
        self.op, self.xs, self.out, self.prepared, self.need = op, xs, out, prepared, need

    def __call__(self, dy: Any) -> tuple:
        op, xs, out, prepared, need = self.op, self.xs, self.out, self.prepared, self.need
        plan, derivative = prepared.plan, prepared.derivative
        if _flops._OPEN:  # any_open(), without its call (a node of most kinds a step)
            _count_grads(op, dy, xs, out, need, plan.shape)
        d = dy._local if not CAPTURE.on else dy.local  # (a captured step reads its record's view)
        dry = dy._mesh.engine.dry
        if dry:  # the dry engine's zeros, not computed
            fulls = _local(lambda: derivative(d, [x.local for x in xs], out.local, need), d)
        elif op in _BLIND:  # a derivative of dY alone (a sum's): no operand's block read
            fulls = derivative(d, None, None, need)
        elif op in LOUD:  # `quiet`'s errstate, for the ops that warn on finite operands
            with np.errstate(divide="ignore", invalid="ignore"):
                fulls = derivative(d, list(map(_LOCAL, xs)), out.local, need)
        elif not CAPTURE.on:
            fulls = derivative(d, list(map(_BLOCK, xs)), out._local, need)
        else:
            fulls = derivative(d, list(map(_LOCAL, xs)), out.local, need)
        if not isinstance(fulls, tuple):  # a dry run's zeros: one block shaped like dy for every operand
            fulls = tuple(fulls if n else None for n in need)
        layout = dy._layout
        # What each operand's gradient is summed over and in which layout it ends: decided by the call signature
        # (the plan, the operands' layouts and shapes), dY's layout and which operands take a gradient, the same
        # every step: kept in the signature's `prepared.ways` by dY's layout object (the entry holds it, so an id
        # that matches is never another object's) and `need`.
        key = (id(layout), need)
        seen = prepared.ways.get(key)
        if seen is not None and seen[0] is layout and not dry:
            result = []
            for x, g, way in zip(xs, fulls, seen[1]):
                if way is None or g is None:
                    result.append(None)
                    continue
                if type(g) is not _ndarray or g.ndim < d.ndim:  # a number or a broadcast operand's derivative
                    ndim = getattr(g, "ndim", None)
                    if (np.ndim(g) if ndim is None else ndim) < d.ndim:
                        g = np.broadcast_to(g, d.shape)
                    g = np.asanyarray(g)
                lead, inner, grad_layout = way
                if lead:
                    g = _SUM(g, axis=lead)
                if inner:
                    g = _SUM(g, axis=inner, keepdims=True)
                block = x._local  # read for its shape and dtype (a captured step's traced view has the same)
                if g.shape != block.shape:
                    g = g.reshape(block.shape)
                if type(g) is _ndarray and g.dtype is block.dtype and g.flags.c_contiguous:
                    # gradient_block's usual case, its DTensor built here (DTensor._trusted without its call)
                    grad = _new(type(x))
                    grad._mesh, grad._local, grad._layout, grad._shape, grad._ag = x._mesh, g, grad_layout, \
                        x._shape, None
                    result.append(grad)
                else:
                    result.append(gradient_block(x, g, grad_layout))
            return tuple(result)
        return self._first_ways(dy, fulls, key, dry)

    def _first_ways(self, dy: Any, fulls: tuple, key: tuple, dry: bool) -> tuple:
        """`__call__`'s gradients where this signature has not met dY's layout object and `need` (`key`): each
        summed by the general helpers, and how (its dims and layout) kept in `prepared.ways`."""
        xs, need, prepared, d = self.xs, self.need, self.prepared, dy._local if not CAPTURE.on else dy.local
        plan, layout = prepared.plan, dy._layout
        result, ways = [], []
        partial, kept = layout.partial, plan.out.partial
        for x, g, n in zip(xs, fulls, need):
            if not n or g is None:
                result.append(None)
                ways.append(None)
                continue
            ndim = getattr(g, "ndim", None)  # an array's or numpy scalar's, without np.ndim's Python
            g = np.broadcast_to(g, d.shape) if (np.ndim(g) if ndim is None else ndim) < d.ndim else g
            block, dims = _summed(np.asanyarray(g), x._shape, plan.shape, dry)
            summed = _summed_axes(plan.out, dims) if dims else ()
            # A bilinear op's other operand read only this rank's addend: its gradient is pending too.
            carried = kept if not x._layout.partial else ()
            grad = grad_tensor(x, block.reshape(x._local.shape), partial, summed, carried)
            result.append(grad)
            ways.append(_sum_dims(x._shape, plan.shape)[:2] + (grad._layout,))
        if not dry:
            put(prepared.ways, key, (layout, tuple(ways)), 64)
        return tuple(result)


_ndarray = np.ndarray
_LOCAL = operator.attrgetter("local")
_BLOCK = operator.attrgetter("_local")  # while no thread captures: the same arrays, no property call


def record_activation(out: Any, x: Any, name: str, kept: Any = None) -> Any:
    """relu / gelu: dX = dY * act'(x), shard by shard. `kept`: GELU's inner tanh from the forward
    (activations.gelu_tanh), read by the backward instead of computed again."""
    kernel = activations.backward(name)
    extra = () if kept is None else (kept,)

    def backward(dy: Any) -> tuple:
        if not CAPTURE.on:  # the blocks (no property call)
            d, local = dy._local, x._local
        else:  # read once: their record's views
            d, local = dy.local, x.local
        if _flops._OPEN:
            sweep(name, (d, local) + extra, (local,))
        return (grad_tensor(x, _local(kernel, d, local, d, *extra), dy._layout.partial),)

    # `record`'s node (its reads: x's layout and out's), without its frame
    return attach(out, name, (x,), backward, x._layout, (x._layout, out._layout))


def record_bias_add(out: Any, x: Any, bias: Any) -> Any:
    """x + bias: dX = dY, dbias = dY summed over the leading dims (pending over their axes)."""
    need_x, need_b = x._ag is not None, bias._ag is not None

    def backward(dy: Any) -> tuple:
        gx = grad_tensor(x, dy.local, dy.layout.partial) if need_x else None
        gb = None
        if need_b:
            sweep("bias_grad", (dy.local,), (bias.local,))
            rows = _SUM(as_rows(dy.local), axis=0)
            gb = grad_tensor(bias, rows, dy.layout.partial, axes_of(x.layout, x.layout.tensor_map[:-1]))
        return gx, gb

    return record(out, "bias_add", (x, bias), backward, x.layout)


def record_scale(out: Any, x: Any, factor: Any) -> Any:
    """x * factor: dX = dY * factor."""
    def backward(dy: Any) -> tuple:
        d = dy.local
        sweep("scale", (d,), (d,))
        return (type(dy)(dy.mesh, _local(np.multiply, d, d, np.asarray(factor, d.dtype)), dy.layout,
                         dy.global_shape),)

    return record(out, "scale", (x,), backward)


def record_dropout(out: Any, x: Any, kept: Any, scale: np.ndarray) -> Any:
    """Dropout: dX = dY * the kept entries' factor (`kept`: keep mask times `scale`, as the forward
    multiplied by; in a dry run zeros of its size, and dY's zeros are scaled instead), shard by shard."""
    # `record`'s node (its reads: x's layout and out's) without its call
    return attach(out, "dropout", (x,), _DropoutGrads(x, kept, scale), with_partial(x._layout, ()),
                  (x._layout, out._layout))


class _DropoutGrads:
    """A dropout's backward, one object (as `PointwiseGrads`)."""

    __slots__ = ("x", "kept", "scale")

    def __init__(self, x: Any, kept: Any, scale: np.ndarray) -> None:
        self.x, self.kept, self.scale = x, kept, scale

    def __call__(self, dy: Any) -> tuple:
        x, kept = self.x, self.kept
        d = dy._local if not CAPTURE.on else dy.local  # (a captured step reads its record's view)
        if _flops._OPEN:
            sweep("dropout", (d, d), (d,))  # dY and the kept factors read
        if kept is None or dy._mesh.engine.dry:
            return (grad_tensor(x, _local(np.multiply, d, d, self.scale), dy._layout.partial),)
        return (grad_tensor(x, d * kept, dy._layout.partial),)


def record_dropout_mask(out: Any, x: Any, keep: np.ndarray, scale: np.generic) -> Any:
    """Dropout keeping only its 1-byte boolean mask `keep` (Megatron's): dX = dY * (keep * scale), the
    graph rule's factor made again (bit for bit); x's block is not kept (its shell is)."""
    x = shell(x)

    def backward(dy: Any) -> tuple:
        d = dy.local
        sweep("dropout", (d, keep), (d,))
        # The factor made where the kernel runs (a dry run's zeros: not made).
        return (grad_tensor(x, _local(lambda: d * np.multiply(keep, scale), d), dy.layout.partial),)

    return record(out, "dropout", (x,), backward, with_partial(x.layout, ()))
