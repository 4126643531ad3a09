"""Check tolerances: |actual - expected| <= atol + rtol * |expected|; numpy only.

Chosen for results whose summation order differs from numpy's (split
contractions, ring reductions): float32 rtol 1e-4, atol 1e-5; float64 rtol
1e-9, atol 1e-12; integers exact. `DTensor.check` uses `default_tolerances`
unless given others; examples pass `contraction_atol(k, dtype)` for a sum of
k products.

A result far smaller than its terms (a sum that cancels, a gradient near a
minimum) has no relative accuracy: its rounding follows the terms. Given the
magnitudes that entered each element (`DTensor.check(..., scale=)`: for a sum
or product the sum of the terms' absolute values), rtol multiplies them
instead of |ref|; `sum_rtol(k, dtype)` is the rounding a sum of k terms can
have relative to them (docs/explanation/tolerances.md, "Tolerances"). A gradient checked
against central differences gets `central_difference_tolerance`: their
rounding follows the magnitudes that entered the differenced function, over
the step h.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from ..base.precision import named_dtype
from ..base.validate import int_arg
from ..errors import DTypeError, SpmdsimError

__all__ = ["default_tolerances", "contraction_atol", "network_atol", "sum_rtol", "central_difference_tolerance"]

# (rtol, atol) by element type; complex types use their real part's entry.
_TOLERANCES = {
    "float16": (1e-2, 1e-3), "float32": (1e-4, 1e-5), "float64": (1e-9, 1e-12),
    "complex64": (1e-4, 1e-5), "complex128": (1e-9, 1e-12),
}


def default_tolerances(*dtypes: Any) -> tuple[float, float]:
    """(rtol, atol) for the least precise of `dtypes`; integers and bools compare exactly.

    ml_dtypes' floats (bfloat16, the FP8 formats) get five unit roundoffs, and a tenth of that absolute."""
    best = (0.0, 0.0)
    for dtype in dtypes:
        dtype = _dtype(dtype, "default_tolerances")
        if dtype.name in _NARROW:
            best = max(best, _narrow_tolerances(dtype.name))
        elif dtype.kind in "fc":
            best = max(best, _TOLERANCES.get(dtype.name, (1e-9, 1e-12)))
    return best


def _dtype(dtype: Any, what: str) -> np.dtype:
    """`dtype` as a numpy dtype, ml_dtypes' names too whether or not it was imported (`named_dtype`: without
    ml_dtypes, its one line); DTypeError naming `what` for what is no dtype."""
    try:
        return named_dtype(dtype, f"{what}: dtype")
    except (TypeError, ValueError):
        raise DTypeError(f"{what}: dtype {dtype!r} is not a numpy dtype (nor bfloat16, float8_e4m3fn or "
                         "float8_e5m2)") from None


def _float_eps(dtype: Any, what: str) -> float:
    """The machine epsilon of float or complex `dtype` (ml_dtypes' too); DTypeError naming `what` otherwise."""
    kind = _dtype(dtype, what)
    if kind.kind not in "fc" and kind.name not in _NARROW:
        raise DTypeError(f"{what}: dtype {kind.name!r} has no rounding to allow for; expected a float or complex "
                         "dtype (integers and bools compare exactly: tolerance 0)")
    return float(np.finfo(kind).eps)


#: ml_dtypes' float types a check may meet (numpy's kind says "V" for most of them, which no float test sees).
_NARROW = ("bfloat16", "float8_e4m3fn", "float8_e5m2")


def _narrow_tolerances(name: str) -> tuple[float, float]:
    """(rtol, atol) of an ml_dtypes float: 5 u (u = eps / 2; bfloat16's rtol 1.95e-2), atol a tenth of it."""
    import ml_dtypes  # loaded already: a dtype of this name exists only once it is

    rtol = 2.5 * float(ml_dtypes.finfo(getattr(ml_dtypes, name)).eps)
    return rtol, rtol / 10


def sum_rtol(k: int, dtype: Any) -> float:
    """The rounding a sum of `k` terms can have in any order, relative to the sum of their |terms|: k eps.

    Each of the k - 1 additions rounds by at most eps/2 of a partial sum, and
    no partial sum exceeds the sum of |terms|: (k - 1) eps / 2, to first order,
    below k eps. Compare with ``DTensor.check(ref, rtol=sum_rtol(k, dtype),
    atol=0, scale=sum of |terms|)``.
    """
    return max(int(k), 1) * _float_eps(dtype, "sum_rtol")


def central_difference_tolerance(magnitude: float, terms: int, h: float = 1e-6, step: float = 1.0,
                                 third: float = 0.0, dtype: Any = "float64") -> tuple[float, float]:
    """(rtol, atol) for a gradient checked against central differences (f(x + h) - f(x - h)) / 2h
    (`spmdsim.references.backward.numeric_grads`): the error they can have, not the gradient's size.

    Rounding: each evaluation of f is off by about ``sqrt(terms) eps x magnitude``, `magnitude` the
    magnitudes that entered f (each sum's |terms|, carried to f as an error in them would be: ``|x| @ |W|``
    and on, each >= the value it stands for) and `terms` the longest sum in it; the two evaluations round
    independently (a step of h moves the operands far more than their last bits) and their difference is
    divided by 2h: ``sqrt(terms) eps magnitude / h``. The roundings of a sum's additions have independent
    signs and add up as a random walk, sqrt(k) eps x its terms (Higham and Mary, "A new approach to
    probabilistic rounding error analysis", 2019), not `sum_rtol`'s k eps, the worst case of every rounding
    one way: divided by h (1e-6), that worst case on magnitudes that already bound each value grows past
    what a missing term moves a gradient by once the shapes grow (docs/explanation/tolerances.md, "Tolerances").
    Truncation: ``h^2 |f'''| / 6``, `third` a bound of |f'''| along one coordinate (it matters only past
    ``6 sqrt(terms) eps magnitude / h^3``, 1.3e3 sqrt(terms) magnitude at h = 1e-6: 0 for programs of
    products of values near 1). The steps: x + h and x - h round, moving the difference of the points by up
    to eps (|x| + h), a relative error of ``eps (step + h) / 2h`` of the gradient (`step`: max |x|): the rtol.
    The checked gradient's own rounding (its backward's sums, not divided by h) is far within these. Compare
    with ``grad.check(numeric, rtol=rtol, atol=atol)``.
    """
    eps = float(np.finfo(dtype).eps)
    rounding = math.sqrt(max(int(terms), 1)) * eps * float(magnitude) / h
    return eps * (step + h) / (2 * h), rounding + h * h * third / 6


def contraction_atol(k: int, dtype: str) -> float:
    """Absolute tolerance for sums of `k` products of values in [-1, 1).

    A result near zero has no relative accuracy: its rounding error grows with
    the contraction length, so the check allows k * eps (at least the default).
    `dtype`: a float or complex dtype, ml_dtypes' by name too ("bfloat16"); `k` an integer >= 0.
    """
    k = int_arg(k, "contraction_atol: k (products summed)", low=0, error=SpmdsimError)
    eps = _float_eps(dtype, "contraction_atol")
    return max(default_tolerances(dtype)[1], k * eps)


def network_atol(net: Any, upto: Optional[int] = None) -> float:
    """Absolute tolerance after `upto` stages: the contraction allowances of each layer add up.

    A sum of k products has no relative accuracy near zero; each layer allows
    k * eps (as `spmdsim.references.tolerances.contraction_atol`), and the errors carry on.
    """
    dtype = net.stages[-1].params[0].source.dtype if net.stages[-1].params else "float32"
    eps = float(np.finfo(dtype).eps)
    total = default_tolerances(dtype)[1]
    for stage in net.stages[:upto]:
        if stage.kind in ("matmul", "linear", "column_linear", "row_linear"):
            total += stage.params[0].source.shape[0] * eps
    return total
