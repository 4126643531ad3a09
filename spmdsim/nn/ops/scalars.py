"""Python and numpy numbers as operands of the elementwise ops: replicated 0-d DTensors (`lift`) of the
dtype numpy's promotion (NEP 50) gives them beside the tensor's."""
from __future__ import annotations

import numbers
from functools import cache
from typing import Any, Callable, Optional

import numpy as np

from ...errors import OperatorError
from ...base.precision import is_low
from ._common import describe, make_dtensor
from ._operands import result_dtype, ufunc_dtype
from ...base.tables import put

__all__ = ["lift"]


def lift(mesh: Any, value: Any, dtype: Optional[np.dtype], op: str) -> Any:
    """A Python or numpy number as a replicated 0-d DTensor. A Python number takes `dtype` (numpy's weak
    scalar rule); beside bool tensors alone (`dtype` None) its own kind, as numpy 2 promotes it (NEP 50): a
    bool stays bool (``mask + True`` is a logical or), an int is int64, a float float64. A numpy scalar keeps
    its own dtype, as NEP 50 has it (float32 tensor + np.float64(0.1) is float64). A 0-d numpy array is its
    numpy scalar: numpy makes one of a scalar on the left of a comparison (``np.float64(0.5) < x`` reaches
    DTensor.__array_ufunc__ as np.less(array(0.5), x)), and NEP 50 types the two alike.

    In a logical and/or/xor a Python int is int64 beside any dtype, as numpy's logical ufuncs take it (its
    truth is what counts; past int64 numpy refuses it: `_beyond`). Beside bfloat16 (ml_dtypes' dtype, of kind
    "V") a Python number takes the dtype numpy's own call on a bfloat16 block gives, asked once (`_beside_low`:
    ml_dtypes 0.7 makes it bfloat16, NEP 50's weak scalar, in ``x * 1.5`` and ``where`` alike); a numpy scalar
    whose dtype numpy's promotion table lacks beside bfloat16 is converted, exactly, to the float numpy's
    ufuncs compute in."""
    if type(value) is np.ndarray and value.ndim == 0:
        value = value[()]
    if isinstance(value, np.generic):
        kind = value.dtype.kind
        if kind in "biuf" or (kind == "V" and is_low(value.dtype)):
            if (kind == "V" or (dtype is not None and dtype.kind == "V")) and dtype is not None:
                common = _ufunc_dtype(dtype, value.dtype)
                if common != dtype and common != value.dtype:  # no entry in numpy's table: numpy's ufunc loop
                    return make_dtensor(mesh, np.asarray(value, common), _scalar_layout(mesh.layout), ())
            return make_dtensor(mesh, np.asarray(value), _scalar_layout(mesh.layout), ())
        value = value.item()
    if not isinstance(value, (numbers.Real, bool)):
        raise OperatorError(f"{op}: operand {describe(value)} must be a DTensor or a real number; wrap an array "
                            "with DTensor.from_global or from_local first")
    if dtype is None:
        target = np.dtype(bool if isinstance(value, bool) else np.int64 if isinstance(value, int) else np.float64)
    elif op in _LOGICAL and type(value) is int:  # numpy's logical ufuncs take it as int64 (past it: refused)
        target = np.dtype(np.int64)
    elif dtype.kind == "V":
        target = _beside_low(op, dtype, type(value) if type(value) in (bool, int, float) else float)
    else:
        target = np.dtype(np.float64) if isinstance(value, float) and dtype.kind not in "fc" else dtype
    return make_dtensor(mesh, _number(value, target), _scalar_layout(mesh.layout), ())


def _number(value: Any, dtype: np.dtype) -> np.ndarray:
    """``np.asarray(value, dtype)``; OverflowError for a Python int that `dtype` cannot hold (ml_dtypes' bfloat16
    raises TypeError "expected number, got int" for one past int64)."""
    try:
        return np.asarray(value, dtype)
    except TypeError:
        if type(value) is int:
            raise OverflowError(f"{value} does not fit {dtype.name}") from None
        raise


_BESIDE_LOW: dict = {}  # (op, the tensors' dtype, a Python number's type) -> the dtype numpy converts it to


def _beside_low(op: str, dtype: np.dtype, kind: type) -> np.dtype:
    """The dtype a Python number of type `kind` takes beside a block of `dtype` (bfloat16, kind "V") in `op`, as
    numpy's own call gives it on blocks of that dtype: np.where promotes by np.result_type, np.clip has no
    bfloat16 loop (float32), the other ufuncs convert it as np.add does (with ml_dtypes 0.7 all three kinds
    bfloat16 in np.where and np.add)."""
    key = op, dtype, kind
    out = _BESIDE_LOW.get(key)
    if out is None:
        one = kind(1)
        with np.errstate(all="ignore"):
            if op == "where":
                out = np.result_type(dtype, one)
            elif op == "clip":
                out = np.clip(np.zeros(1, dtype), one, one).dtype
            else:
                out = np.add(np.zeros(1, dtype), one).dtype
        out = _BESIDE_LOW[key] = np.dtype(out)
    return out


def _ufunc_dtype(a: np.dtype, b: np.dtype) -> np.dtype:
    """The dtype numpy's ufuncs compute on dtypes `a` and `b` in (spmdsim.nn.ops._operands.ufunc_dtype)."""
    return ufunc_dtype(a, b)


def _promote(op: str) -> Callable:
    """`op`'s rule for its result dtype: np.where's is np.result_type's (`result_dtype`: bfloat16 beside int32
    refused, as np.where refuses it), every other op's numpy's ufuncs' (`ufunc_dtype`: float64)."""
    return result_dtype if op == "where" else ufunc_dtype


_SCALARS: dict = {}  # device matrix -> the layout of a replicated 0-d value on it


def _scalar_layout(layout: Any) -> Any:
    """``layout()``, the replicated 0-d layout, one object per device matrix (not rebuilt per number)."""
    out = _SCALARS.get(layout)
    if out is None:
        out = put(_SCALARS, layout, layout(), 256)
    return out


_LOGICAL = frozenset({"logical_and", "logical_or", "logical_xor"})


@cache
def logical_by_truth() -> bool:
    """Whether numpy's logical ufuncs take a Python int past int64 by its truth (numpy 2.0; from 2.1 they convert
    it to int64 and refuse it: OverflowError), asked of numpy once."""
    try:
        np.logical_and(np.zeros(1, np.int8), 2 ** 64)
    except (OverflowError, TypeError):
        return False
    return True
