"""numpy's elementwise functions by name on DTensors (add, sub, exp, where, clip, pow, astype, ...), each
spmdsim.nn.ops.pointwise's broadcasting op with its kernel; DTensor's + - * / ** -x call them through it."""
from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from ..autograd.graph import record
from ..autograd.kept import shell
from ..autograd.rules.grads import grad_tensor
from ...base.buffers import converted
from ...errors import DTypeError, OperatorError
from ...base.precision import is_low
from ...base.validate import dtype_arg
from ...runtime.dtensor import refuse_truncated
from ._common import describe, dry_zeros, make_dtensor
from ._operands import raise_if_not_dtensors, ufunc_dtype
from .pointwise import pointwise
from .powers import _negative_power
from .scalars import _beside_low, _number, _ufunc_dtype

__all__ = ["add", "sub", "mul", "div", "floor_divide", "remainder", "round", "floor", "ceil", "sign", "maximum",
           "minimum", "where", "exp", "log", "sqrt", "tanh", "pow", "neg", "abs", "sigmoid", "silu", "sin", "cos",
           "square", "rsqrt", "clip", "erf", "equal", "not_equal", "astype", "power"]


def astype(x: Any, dtype: Any) -> Any:
    """`x` with its blocks converted to `dtype` (a float rounded to nearest even), recorded for autograd.

    The gradient goes back in x's own gradient dtype; the same layout, pending sums kept (a cast of a
    pending sum to a narrower float rounds each addend: round after resolving it)."""
    want = dtype_arg(dtype)
    try:
        if x.local.dtype == want:
            return x
    except AttributeError:
        raise_if_not_dtensors("astype", ("x",), x)
        raise
    refuse_truncated(x.layout, x.local.dtype, want)  # (a pending sum of floats cut to integers: x.astype's line)
    dry = dry_zeros(x.mesh, x.local.shape, want, converted, x.local, want)  # a dry run's: not converted
    out = make_dtensor(x.mesh, x.local.astype(want) if dry is None else dry, x.layout, x.global_shape)
    if x._ag is None:
        return out
    x = shell(x)  # the cast's backward reads no value of x: the node keeps its shell, not its block
    return record(out, f"astype {want.name}", (x,), lambda dy: (grad_tensor(x, dy.local, dy.layout.partial),))


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


def floor_divide(a: Any, b: Any) -> Any:
    """a // b, numpy's floor division (``x // 2``), with broadcasting; pending sums are resolved first. Its
    gradient is zero (the result is piecewise constant)."""
    return pointwise("floordiv", a, b)


def remainder(a: Any, b: Any) -> Any:
    """a % b, numpy's remainder (the sign of b), with broadcasting; pending sums are resolved first. Gradients
    as PyTorch's: dy for a, -dy * (a // b) for b."""
    return pointwise("mod", a, b)


def round(x: Any, decimals: int = 0) -> Any:  # noqa: A001 - numpy's name
    """x rounded to `decimals` places, halves to even, as numpy.round (x * 10**decimals rounded, then divided);
    integers as they are, their dtype kept; its gradient is zero; a pending sum is resolved first.

    Negative `decimals` round to tens, hundreds, ... as numpy's (x / 10**-decimals rounded, then multiplied;
    an integer's computed in float64 and converted back to its dtype); a bool's refused, as numpy refuses it.
    So are `decimals` whose 10**|decimals| overflows the float dtype the scaling computes in (float64: beyond 308,
    float32: 38), where numpy's np.round gives NaN for every entry (x * inf / inf, 0 * inf), not x rounded; an
    integer rounded past its digits is 0."""
    if isinstance(decimals, bool) or not isinstance(decimals, numbers.Integral):
        raise OperatorError(f"round: decimals {decimals!r} must be an integer")
    dtype = getattr(getattr(x, "local", None), "dtype", np.dtype(np.float64))
    if decimals < 0:
        if dtype.kind == "b":
            raise OperatorError(f"round of a bool DTensor to decimals {decimals}: numpy refuses it (its quotient "
                                "is not a bool); convert first, e.g. x.astype('int64')")
        # past every integer's digits (2**64 < 10**20) each rounds to 0, as it does at -20
        scale = _round_scale(max(int(decimals), -20) if dtype.kind in "iu" else int(decimals), dtype)
        out = pointwise("mul", pointwise("round", pointwise("div", x, scale)), scale)
        return astype(out, dtype) if dtype.kind in "iu" else out
    if not decimals or dtype.kind in "iu":
        # Integers have no places to round (numpy gives them back as they are, their dtype kept): scaled by a
        # float they would come back float64.
        return pointwise("round", x)
    scale = _round_scale(int(decimals), dtype)
    return pointwise("div", pointwise("round", pointwise("mul", x, scale)), scale)


def _round_scale(decimals: int, dtype: np.dtype) -> float:
    """10.0 ** |decimals|, what `round` of x of `dtype` scales by, or the OperatorError where it overflows the dtype
    the scaling computes in (a float's or complex's own; a bool's float64): numpy's np.round gives NaN there."""
    within = dtype if dtype.kind in "fcV" else np.dtype(np.float64)  # (bfloat16's numpy kind is 'V')
    most = _ROUND_DIGITS.get(within)
    if most is None:
        most = _ROUND_DIGITS[within] = int(math.log10(float(np.finfo(within).max)))
    places = -decimals if decimals < 0 else decimals  # (abs is this module's ufunc)
    if places > most:
        rounded_in = "" if within == dtype else f" (rounded in {within.name})"
        raise OperatorError(f"round: decimals {decimals} is out of range for {dtype.name}{rounded_in}: 10**{places} "
                            f"overflows {within.name}, where numpy's np.round gives NaN for every entry; expected "
                            f"decimals from {-most} to {most}")
    return 10.0 ** places


_ROUND_DIGITS: dict = {}  # a float dtype -> the largest n whose 10**n it holds (float64: 308)


def floor(x: Any) -> Any:
    """The largest integer not above x, elementwise (numpy.floor); its gradient is zero."""
    return pointwise("floor", x)


def ceil(x: Any) -> Any:
    """The smallest integer not below x, elementwise (numpy.ceil); its gradient is zero."""
    return pointwise("ceil", x)


def sign(x: Any) -> Any:
    """-1, 0 or 1 by x's sign, elementwise (numpy.sign); its gradient is zero."""
    return pointwise("sign", x)


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
    """x ** exponent (a number or a DTensor; pending sums are resolved first).

    numpy's np.power: an integer or bool x to a negative integer power is refused in one line on every rank where
    the result has entries, as numpy refuses it (its ValueError came from the kernel, on the ranks that hold such
    an entry alone; an empty x gives the empty result, as numpy's): a number
    exponent here, a DTensor's (``2 ** x``, ``x ** y`` of integers) by its least entry, agreed over the mesh
    (`_negative_powers`: one small Allreduce, for an integer power of signed integers only)."""
    if exponent.__class__ is int or isinstance(exponent, np.integer):
        kind = getattr(getattr(x, "local", None), "dtype", np.dtype(np.float64)).kind
        if kind in "biu" and exponent < 0 and math.prod(x._shape):  # (an empty result has no entry to refuse)
            raise _negative_power(x.local.dtype, int(exponent))
    return pointwise("pow", x, exponent)


def power(x: Any, exponent: Any) -> Any:
    """``x ** exponent`` (DTensor's operator) as numpy's ndarray operator: `pow`, but a bool x to the Python int
    2 is numpy's np.square of it (int8: ``mask ** 2``), where np.power(mask, 2) is int64."""
    if exponent.__class__ is int and exponent == 2 and x.local.dtype.kind == "b":
        return pointwise("square", x)
    return pow(x, exponent)


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
                not (isinstance(bound, numbers.Real) or isinstance(bound, np.generic) and is_low(bound.dtype))
                or isinstance(bound, bool) or bound != bound):
            raise OperatorError(f"clip: {name} {bound!r} must be a real number, a DTensor or None")
    dtype = getattr(getattr(x, "local", None), "dtype", np.dtype(np.float64))
    if dtype.kind in "iu":  # a Python int bound beyond x's dtype on the side where it clips nothing: numpy 2.4's
        info = np.iinfo(dtype)  # clip drops it (np.clip(int32, 0, 2**40); 2.0 refused); the other side refuses
        low = int(info.min) if type(low) is int and low < info.min else low
        high = int(info.max) if type(high) is int and high > info.max else high
    if low is not None and high is not None and "V" in (dtype.kind, _kind(low), _kind(high)):
        x = _clip_loop(x, dtype, low, high)
    if (low is None or high is None) and dtype.kind == "V":
        # bfloat16: numpy's clip by one bound is np.minimum / np.maximum, whose bfloat16 loop keeps bfloat16 beside
        # a Python int (np.clip's own has none: float32). Both bounds as numpy scalars of the dtype np.minimum
        # gives (`_ufunc_dtype`), the missing one infinite.
        given = high if low is None else low
        if hasattr(given, "_ag"):
            edge = _ufunc_dtype(dtype, given.local.dtype)
        else:
            edge = (_ufunc_dtype(dtype, given.dtype) if isinstance(given, np.generic)
                    else _beside_low("minimum", dtype, type(given)))
            try:
                given = _number(given, edge)[()]
            except OverflowError:
                raise DTypeError(f"clip: the Python int bound {given} is out of bounds for {edge.name}, the dtype it "
                                 f"takes beside a DTensor of {dtype.name} (numpy refuses it too)") from None
        low, high = ((np.asarray(-np.inf, edge)[()], given) if low is None
                     else (given, np.asarray(np.inf, edge)[()]))
    if low is None or high is None:
        # The missing bound is one that changes no value and no dtype (numpy clips by the given bound alone): the
        # extremes of the dtype x and the given bound compute in, as numpy scalars of it (x of int32 clipped below
        # by inf is inf, not int32's max; x of uint8 by np.float32(2.5) float32, where a Python inf is float64).
        out = _one_sided(dtype, high if low is None else low)
        edges = tuple(map(out.type, (np.iinfo(out).min, np.iinfo(out).max) if out.kind in "iu" else (0, 1)
                          if out.kind == "b" else (-np.inf, np.inf)))
        low = edges[0] if low is None else low
        high = edges[1] if high is None else high
    return pointwise("clip", x, low, high)


def _one_sided(dtype: np.dtype, bound: Any) -> np.dtype:
    """The dtype np.maximum (or np.minimum) of x of `dtype` and one clip `bound` (a DTensor, a numpy scalar or a
    Python number, NEP 50's weak one) computes in; `dtype` where numpy has none (the kernel refuses it)."""
    try:
        if hasattr(bound, "_ag") or isinstance(bound, np.generic):
            return ufunc_dtype(dtype, getattr(bound, "local", bound).dtype)
        return np.result_type(dtype, bound)
    except (TypeError, OverflowError, DTypeError):
        return dtype


def _kind(bound: Any) -> str:
    """The dtype kind of a clip bound that has a dtype (a DTensor's, a numpy scalar's), else ""."""
    dtype = getattr(getattr(bound, "local", bound), "dtype", None)
    return "" if dtype is None else dtype.kind


def _clip_loop(x: Any, dtype: np.dtype, low: Any, high: Any) -> Any:
    """`x` (of `dtype`) converted to the dtype numpy's np.clip computes in (exactly: a wider float) where that is
    not the bounds' and x's common dtype: np.clip has no bfloat16 loop, so bfloat16 among x and DTensor or numpy
    scalar bounds whose common dtype is bfloat16 computes in float32 (a Python number bound: `_beside_low`)."""
    dtypes = [dtype] + [b.local.dtype if hasattr(b, "_ag") else b.dtype for b in (low, high)
                        if hasattr(b, "_ag") or isinstance(b, np.generic)]
    if len(dtypes) < 3:  # a Python number among the bounds: lifted to the dtype numpy's np.clip gives it
        return x
    common = ufunc_dtype(*dtypes)
    if common.kind != "V":
        return x
    want = _CLIP_LOOPS.get(common)
    if want is None:
        with np.errstate(all="ignore"):
            want = _CLIP_LOOPS[common] = np.clip(*(np.zeros(1, common),) * 3).dtype
    return x if want == common else astype(x, want)


_CLIP_LOOPS: dict = {}  # a low float dtype -> the dtype np.clip of three arrays of it computes in


def equal(a: Any, b: Any) -> Any:
    """a == b elementwise as a bool DTensor (no gradient); DTensor's ``==`` calls it, as PyTorch's and numpy's."""
    return pointwise("eq", a, b)


def not_equal(a: Any, b: Any) -> Any:
    """a != b elementwise as a bool DTensor (no gradient)."""
    return pointwise("ne", a, b)


def compare(op: str, a: Any, b: Any) -> Any:
    """a == b, a < b, a > b, a <= b or a >= b (op "eq", "lt", "gt", "le", "ge") as a bool DTensor (no gradient)."""
    return pointwise(op, a, b)
