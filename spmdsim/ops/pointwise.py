"""Elementwise ops with numpy broadcasting on DTensors, by the sharding rules of spmdsim.infer.pointwise.

Each op plans (pure, cached), redistributes the operands that disagree with
the plan (the planner's least-bytes moves, recorded for autograd), runs
numpy's kernel on this rank's blocks, and records its backward: each
operand's gradient is the local derivative summed over the dims the operand
was broadcast along (a pending sum over the axes that split those dims) and
over the pending sums the forward kept. Python numbers are replicated 0-d
operands. ``DTensor``'s ``+ - * / ** -x`` call these.
"""
from __future__ import annotations

import contextlib
import math
import numbers
from typing import Any, Callable

import numpy as np

from ..autograd.graph import record, with_partial
from ..autograd.rules import axes_of, grad_tensor
from ..errors import OperatorError
from ..infer.pointwise import infer_pointwise
from ..engines import local as engine_local
from ..validate import dtype_name
from . import _common
from ._common import describe, dry_zeros, make_dtensor, result_dtype

__all__ = ["add", "sub", "mul", "div", "maximum", "minimum", "where", "exp", "log", "sqrt", "tanh", "pow", "neg",
           "abs", "sigmoid", "silu", "sin", "cos", "square", "rsqrt", "clip", "erf", "equal", "not_equal", "lift",
           "pointwise"]


def _half(mask: np.ndarray, ties: np.ndarray) -> np.ndarray:
    return mask + 0.5 * ties


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) as (1 + tanh(x / 2)) / 2: no overflow for large |x|, and x's float precision kept."""
    return 0.5 * np.tanh(0.5 * x) + 0.5


def _clip_grads(dy: np.ndarray, x: np.ndarray, low: np.ndarray, high: np.ndarray, need: tuple) -> tuple:
    """Gradients of numpy.clip = minimum(maximum(x, low), high): x gets dY inside [low, high] (bounds
    included), low where x is below it, high where the clamped value is above it (also when low > high)."""
    above = np.maximum(x, low) > high
    inner = np.where(above, 0, dy)
    return (inner * (x >= low) if need[0] else None, inner * (x < low) if need[1] else None,
            dy * above if need[2] else None)


def _silu_slope(x: np.ndarray) -> np.ndarray:
    """d silu / dx = s (1 + x (1 - s)) with s = sigmoid(x)."""
    s = _sigmoid(x)
    return s * (1 + x * (1 - s))


_ERF = np.frompyfunc(math.erf, 1, 1)  # the C library's erf, element by element (numpy has none)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _erf(x: np.ndarray) -> np.ndarray:
    """erf of a float array in its own dtype (libm's, correctly rounded to within an ulp)."""
    x = np.asarray(x)
    dtype = x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)
    return np.asarray(_ERF(x.astype(np.float64, copy=False)), dtype=np.float64).astype(dtype, copy=False)


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    """x * Phi(x) = x (1 + erf(x / sqrt 2)) / 2: GELU without the tanh approximation (PyTorch's default)."""
    return 0.5 * x * (1.0 + _erf(x * _INV_SQRT_2))


def _gelu_erf_slope(x: np.ndarray) -> np.ndarray:
    """d/dx x Phi(x) = Phi(x) + x phi(x)."""
    return 0.5 * (1.0 + _erf(x * _INV_SQRT_2)) + x * _INV_SQRT_2PI * np.exp(-0.5 * x * x)


# op -> (forward kernel, backward: (dy, operands, out, need) -> per operand the gradient or None).
_KERNELS: dict[str, tuple[Callable, Callable]] = {
    "add": (np.add, lambda dy, x, o, n: (dy, dy)),
    "sub": (np.subtract, lambda dy, x, o, n: (dy, -dy if n[1] else None)),
    "mul": (np.multiply, lambda dy, x, o, n: (dy * x[1] if n[0] else None, dy * x[0] if n[1] else None)),
    "div": (np.divide, lambda dy, x, o, n: (dy / x[1] if n[0] else None, -dy * o / x[1] if n[1] else None)),
    "maximum": (np.maximum, lambda dy, x, o, n: (dy * _half(x[0] > x[1], x[0] == x[1]),
                                                 dy * _half(x[1] > x[0], x[0] == x[1]))),
    "minimum": (np.minimum, lambda dy, x, o, n: (dy * _half(x[0] < x[1], x[0] == x[1]),
                                                 dy * _half(x[1] < x[0], x[0] == x[1]))),
    "where": (np.where, lambda dy, x, o, n: (None, np.where(x[0], dy, 0) if n[1] else None,
                                             np.where(x[0], 0, dy) if n[2] else None)),
    "exp": (np.exp, lambda dy, x, o, n: (dy * o,)),
    "log": (np.log, lambda dy, x, o, n: (dy / x[0],)),
    "sqrt": (np.sqrt, lambda dy, x, o, n: (dy * 0.5 / o,)),
    "tanh": (np.tanh, lambda dy, x, o, n: (dy * (1 - o * o),)),
    "neg": (np.negative, lambda dy, x, o, n: (-dy,)),
    "abs": (np.abs, lambda dy, x, o, n: (dy * np.sign(x[0]),)),
    "pow": (np.power, lambda dy, x, o, n: (dy * x[1] * np.power(x[0], x[1] - 1) if n[0] else None,
                                           dy * o * np.log(x[0]) if n[1] else None)),
    "sigmoid": (lambda x: _sigmoid(x), lambda dy, x, o, n: (dy * o * (1 - o),)),
    "silu": (lambda x: x * _sigmoid(x), lambda dy, x, o, n: (dy * _silu_slope(x[0]),)),
    "sin": (np.sin, lambda dy, x, o, n: (dy * np.cos(x[0]),)),
    "cos": (np.cos, lambda dy, x, o, n: (-dy * np.sin(x[0]),)),
    "square": (np.square, lambda dy, x, o, n: (2 * dy * x[0],)),
    "rsqrt": (lambda x: 1 / np.sqrt(x), lambda dy, x, o, n: (-0.5 * dy * o * o * o,)),
    "clip": (np.clip, lambda dy, x, o, n: _clip_grads(dy, *x, n)),
    "erf": (_erf, lambda dy, x, o, n: (dy * _TWO_OVER_SQRT_PI * np.exp(-x[0] * x[0]),)),
    "gelu_erf": (_gelu_erf, lambda dy, x, o, n: (dy * _gelu_erf_slope(x[0]),)),
    "eq": (np.equal, None), "lt": (np.less, None), "gt": (np.greater, None),
    "le": (np.less_equal, None), "ge": (np.greater_equal, None), "ne": (np.not_equal, None),
}


#: Ops that warn on finite operands (x / 0, log 0, sqrt and pow of negatives, exp's overflow): numpy's
#: warnings silenced there, as the masked and padded values of a model meet them by design. The others
#: warn only on operands that are already inf or nan, as numpy does in one process; np.errstate costs
#: ~10 us a call, more than a small shard's arithmetic.
_LOUD = frozenset({"div", "log", "sqrt", "pow", "exp", "rsqrt"})


def _quiet(op: str, **errors: str) -> Any:
    """np.errstate(**errors) for the ops in _LOUD, else a context that does nothing."""
    return np.errstate(**errors) if op in _LOUD else _NULL


_NULL = contextlib.nullcontext()  # stateless: one shared by every call and thread


def lift(mesh: Any, value: Any, dtype: np.dtype, op: str) -> Any:
    """A Python or numpy number as a replicated 0-d DTensor of `dtype` (numpy's weak scalar rule)."""
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, (numbers.Real, bool)):
        raise OperatorError(f"{op}: operand {describe(value)} must be a DTensor or a real number; wrap an array "
                            "with DTensor.from_global or from_local first")
    target = np.dtype(np.float64) if isinstance(value, float) and dtype.kind not in "fc" else dtype
    return make_dtensor(mesh, np.asarray(value, dtype=target), _scalar_layout(mesh.layout), ())


_SCALARS: dict = {}  # device matrix -> the layout of a replicated 0-d value on it


def _scalar_layout(layout: Any) -> Any:
    """``layout()``, the replicated 0-d layout, one object per device matrix (not rebuilt per number)."""
    out = _SCALARS.get(layout)
    if out is None:
        if len(_SCALARS) >= 256:
            _SCALARS.clear()
        out = _SCALARS[layout] = layout()
    return out


def _operands(op: str, args: tuple) -> tuple[Any, list]:
    """The mesh and the operands as DTensors (numbers lifted to the tensors' dtype)."""
    cls = _common._DTENSOR or _common._dtensor_class()
    for a in args:
        if type(a) is not cls:
            break
    else:  # DTensors only (most calls): nothing to lift
        mesh = args[0].mesh
        for t in args[1:]:
            if t.mesh is not mesh and t.mesh.layout != mesh.layout:
                raise OperatorError(f"{op}: operands live on different meshes: {mesh.layout} and {t.mesh.layout}")
        return mesh, list(args)
    tensors = [a for a in args if hasattr(a, "_ag") and hasattr(a, "layout")]
    if not tensors:
        raise OperatorError(f"{op}: no operand is a DTensor (got {', '.join(describe(a) for a in args)})")
    mesh = tensors[0].mesh
    for t in tensors[1:]:
        if t.mesh is not mesh and t.mesh.layout != mesh.layout:
            raise OperatorError(f"{op}: operands live on different meshes: {mesh.layout} and {t.mesh.layout}")
    dtype = result_dtype(*[t.local.dtype for t in tensors if t.local.dtype.kind != "b"] or [np.dtype(np.float64)])
    return mesh, [a if any(a is t for t in tensors) else lift(mesh, a, dtype, op) for a in args]


def _summed(local: np.ndarray, shape: tuple, out_shape: tuple) -> tuple[np.ndarray, tuple[int, ...]]:
    """`local` (an output-shaped gradient block) summed down to an operand of global `shape`.

    Returns the block and the output dims summed over (whose split axes make it pending).
    """
    lead, inner, dims = _sum_dims(shape, out_shape)
    if lead:
        local = local.sum(axis=lead)
    if inner:
        local = local.sum(axis=inner, keepdims=True)
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
    if len(_SUM_DIMS) >= _CACHE_MAX:  # a long run over many shapes: start over
        _SUM_DIMS.clear()
    out = _SUM_DIMS[key] = (tuple(range(lead)), tuple(d - lead for d in dims if d >= lead), dims)
    return out


_SUM_DIMS: dict = {}  # (operand shape, output shape) -> _sum_dims's answer (a step asks for the same few)
_SUMMED_AXES: dict = {}  # (output layout, summed dims) -> the axes of size above one that split them
_CACHE_MAX = 4096


def _summed_axes(layout: Any, dims: tuple[int, ...]) -> tuple[str, ...]:
    """``axes_of(layout, the map entries of dims)``, remembered."""
    key = (layout, dims)
    try:
        return _SUMMED_AXES[key]
    except KeyError:
        pass
    if len(_SUMMED_AXES) >= _CACHE_MAX:
        _SUMMED_AXES.clear()
    out = _SUMMED_AXES[key] = axes_of(layout, (layout.tensor_map[d] for d in dims))
    return out


def pointwise(op: str, *args: Any) -> Any:
    """Run elementwise `op` on DTensors and numbers with numpy broadcasting (see the module docstring)."""
    mesh, xs = _operands(op, args)
    dtype = dtype_name(result_dtype(*[x.local.dtype for x in xs]))
    plan = infer_pointwise(op, tuple(x.layout for x in xs), tuple(x.global_shape for x in xs), dtype)
    xs = [x if x.layout == t else _redistributed(x, t) for x, t in zip(xs, plan.targets)]
    forward, backward = _KERNELS[op]
    locals_ = [x.local for x in xs]
    block = _dry_block(mesh, forward, locals_) if mesh.engine.dry else None
    if block is None:
        with _quiet(op, divide="ignore", invalid="ignore", over="ignore"):
            block = forward(*locals_)
    out = make_dtensor(mesh, block, plan.out, plan.shape)
    if backward is None or not any(x._ag is not None for x in xs):
        return out
    return _record(op, out, xs, backward, plan)


def _dry_block(mesh: Any, forward: Callable, locals_: list) -> Any:
    """A dry run's large result (spmdsim.ops._common.dry_zeros): zeros of the kernel's shape and dtype, not
    computed; None for a small one (computed)."""
    shape = np.broadcast_shapes(*(block.shape for block in locals_))
    with np.errstate(all="ignore"):  # the result's dtype: the kernel's on one zero of each operand's dtype
        dtype = np.asarray(forward(*(np.zeros((), block.dtype) for block in locals_))).dtype
    return dry_zeros(mesh, shape, dtype, forward, *locals_)


def _redistributed(x: Any, target: Any) -> Any:
    """`x` redistributed to `target` (the import made only when an operand moves: ~2 us a call)."""
    from ..runtime.executor import redistribute

    return redistribute(x, target)


def _record(op: str, out: Any, xs: list, backward: Callable, plan: Any) -> Any:
    need = tuple(x._ag is not None for x in xs)
    kept = plan.out.partial

    def grads(dy: Any) -> tuple:
        with _quiet(op, divide="ignore", invalid="ignore"):
            fulls = engine_local(lambda: backward(dy.local, [x.local for x in xs], out.local, need), dy.local)
        if not isinstance(fulls, tuple):  # a dry run's zeros: one block shaped like dy for every operand
            fulls = tuple(fulls if n else None for n in need)
        result = []
        for x, g, n in zip(xs, fulls, need):
            if not n or g is None:
                result.append(None)
                continue
            g = np.broadcast_to(g, dy.local.shape) if np.ndim(g) < dy.local.ndim else g
            block, dims = _summed(np.asarray(g), x.global_shape, plan.shape)
            summed = _summed_axes(plan.out, dims) if dims else ()
            # A bilinear op's other operand read only this rank's addend: its gradient is pending too.
            carried = kept if not x.layout.partial else ()
            result.append(grad_tensor(x, block.reshape(x.local.shape), dy.layout.partial, summed, carried))
        return tuple(result)

    return record(out, op, tuple(xs), grads, with_partial(plan.out, ()))


def add(a: Any, b: Any) -> Any:
    """a + b with numpy broadcasting; a pending sum stays pending (the other operand joins on one replica)."""
    return pointwise("add", a, b)


def sub(a: Any, b: Any) -> Any:
    """a - b with numpy broadcasting (pending sums as for add)."""
    return pointwise("sub", a, b)


def mul(a: Any, b: Any) -> Any:
    """a * b with numpy broadcasting; one pending operand stays pending (two: the smaller is resolved)."""
    return pointwise("mul", a, b)


def div(a: Any, b: Any) -> Any:
    """a / b with numpy broadcasting; a pending numerator stays pending, a pending denominator is resolved."""
    return pointwise("div", a, b)


def maximum(a: Any, b: Any) -> Any:
    """Elementwise maximum (ties share the gradient equally, as PyTorch does); pending sums are resolved."""
    return pointwise("maximum", a, b)


def minimum(a: Any, b: Any) -> Any:
    """Elementwise minimum (ties share the gradient); pending sums are resolved."""
    return pointwise("minimum", a, b)


def where(condition: Any, a: Any, b: Any) -> Any:
    """a where `condition` (a bool DTensor) is true, else b, with broadcasting; the condition gets no gradient."""
    if getattr(getattr(condition, "local", None), "dtype", None) != np.dtype(bool):
        hint = "; a Python bool is not a mask: compare DTensors (a == b, a < b)" if type(condition) is bool else ""
        raise OperatorError(f"where: condition must be a bool DTensor, got {describe(condition)}{hint}")
    return pointwise("where", condition, a, b)


def exp(x: Any) -> Any:
    """e ** x (a pending sum is resolved first)."""
    return pointwise("exp", x)


def log(x: Any) -> Any:
    """Natural logarithm (a pending sum is resolved first)."""
    return pointwise("log", x)


def sqrt(x: Any) -> Any:
    """Square root (a pending sum is resolved first)."""
    return pointwise("sqrt", x)


def tanh(x: Any) -> Any:
    """Hyperbolic tangent (a pending sum is resolved first)."""
    return pointwise("tanh", x)


def neg(x: Any) -> Any:
    """-x (linear: a pending sum stays pending)."""
    return pointwise("neg", x)


def abs(x: Any) -> Any:  # noqa: A001 - numpy's name
    """|x| (a pending sum is resolved first)."""
    return pointwise("abs", x)


def pow(x: Any, exponent: Any) -> Any:  # noqa: A001 - numpy's name
    """x ** exponent (a number or a DTensor; pending sums are resolved first)."""
    return pointwise("pow", x, exponent)


def sigmoid(x: Any) -> Any:
    """1 / (1 + e^-x) (a pending sum is resolved first)."""
    return pointwise("sigmoid", x)


def silu(x: Any) -> Any:
    """x * sigmoid(x), Swish (Llama's SwiGLU gate; a pending sum is resolved first)."""
    return pointwise("silu", x)


def sin(x: Any) -> Any:
    """Sine (a pending sum is resolved first)."""
    return pointwise("sin", x)


def cos(x: Any) -> Any:
    """Cosine (a pending sum is resolved first)."""
    return pointwise("cos", x)


def square(x: Any) -> Any:
    """x * x (a pending sum is resolved first)."""
    return pointwise("square", x)


def rsqrt(x: Any) -> Any:
    """1 / sqrt(x) (a pending sum is resolved first)."""
    return pointwise("rsqrt", x)


def erf(x: Any) -> Any:
    """The error function, elementwise (the C library's, one element at a time: slower than numpy's
    ufuncs); a pending sum is resolved first."""
    return pointwise("erf", x)


def clip(x: Any, low: Any = None, high: Any = None) -> Any:
    """x limited to [low, high] (numbers or DTensors, with broadcasting; None: no bound), like numpy.clip.

    The gradient reaches x where low <= x <= high (bounds included, as PyTorch's clamp), a bound where x
    passes it; pending sums are resolved first.
    """
    if low is None and high is None:
        raise OperatorError("clip: low None and high None: give at least one bound")
    for name, bound in (("low", low), ("high", high)):
        if bound is not None and not hasattr(bound, "_ag") and (
                not isinstance(bound, numbers.Real) or isinstance(bound, bool) or bound != bound):
            raise OperatorError(f"clip: {name} {bound!r} must be a real number, a DTensor or None")
    dtype = getattr(getattr(x, "local", None), "dtype", np.dtype(np.float64))
    if low is None or high is None:
        edge = np.iinfo(dtype) if dtype.kind in "iu" else None
        low = (edge.min if edge else -np.inf) if low is None else low
        high = (edge.max if edge else np.inf) if high is None else high
    return pointwise("clip", x, low, high)


def equal(a: Any, b: Any) -> Any:
    """a == b elementwise as a bool DTensor (no gradient); DTensor's ``==`` calls it, as PyTorch's and numpy's."""
    return pointwise("eq", a, b)


def not_equal(a: Any, b: Any) -> Any:
    """a != b elementwise as a bool DTensor (no gradient)."""
    return pointwise("ne", a, b)


def compare(op: str, a: Any, b: Any) -> Any:
    """a == b, a < b, a > b, a <= b or a >= b (op "eq", "lt", "gt", "le", "ge") as a bool DTensor (no gradient)."""
    return pointwise(op, a, b)
