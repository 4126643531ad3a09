"""The operators' operand checks (DTensors, one mesh, floating dtypes) and the result dtypes numpy's loops give."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import DTypeError, OperatorError
from ...base.precision import is_float
from ...runtime import debug, debug_calls
from ...base.validate import describe
from ...layouts.layout import default_axis_names
from ...runtime.dtensor import DTensor
from ...runtime.mesh import foreign

_BOOL = np.dtype(bool)
_RESULT_DTYPES: dict = {}
_UFUNC_DTYPES: dict = {}
#: numpy's own loops in the order its ufuncs try them (bool, the ints, the floats, the complex numbers)
_LOOPS = "?bBhHiIlLqQefdgFDG"


def result_dtype(*dtypes: np.dtype) -> np.dtype:
    """``np.result_type`` of these dtypes, cached: numpy's call costs ~10 us, more than most ops' own
    arithmetic on a small shard, and a program asks for the same few pairs every step. Where numpy has no
    common dtype (its DTypePromotionError: bfloat16 beside float16, int16 and wider ints before ml_dtypes 0.7;
    a join or np.where of them) a DTypeError in one line, the same on every rank (the dtypes are every rank's)."""
    try:
        return _RESULT_DTYPES[dtypes]
    except KeyError:
        pass
    try:
        out = np.result_type(*dtypes)
    except TypeError:  # DTypePromotionError
        raise _no_common(dtypes, "its np.result_type refuses them: a join or np.where of them too") from None
    out = _RESULT_DTYPES[dtypes] = out
    return out


def ufunc_dtype(*dtypes: np.dtype) -> np.dtype:
    """The dtype numpy's binary ufuncs (np.add, np.power, np.maximum, np.less, ...) compute on blocks of these
    dtypes in: `result_dtype`'s, or where numpy's promotion table has no entry (before ml_dtypes 0.7: bfloat16
    beside float16, int16 and wider ints) the first of numpy's own loops every dtype casts to safely, as a
    ufunc picks it (bfloat16 and float16, int16 or uint16: float32; int32, int64 or their unsigned: float64).
    Cached; a DTypeError in one line where no loop takes them."""
    try:
        return _UFUNC_DTYPES[dtypes]
    except KeyError:
        pass
    try:
        out = np.result_type(*dtypes)
    except TypeError:  # DTypePromotionError: numpy's ufunc looks for a loop instead
        out = next((np.dtype(c) for c in _LOOPS if all(np.can_cast(d, c, "safe") for d in dtypes)), None)
        if out is None:
            raise _no_common(dtypes, "no loop of its ufuncs takes them") from None
    out = _UFUNC_DTYPES[dtypes] = out
    return out


def _no_common(dtypes: tuple, why: str) -> Exception:
    """The one-line DTypeError for dtypes numpy has no common dtype of."""
    names = " and ".join(sorted({np.dtype(d).name for d in dtypes} - {"bool"}))  # (bool promotes with any)
    return DTypeError(f"no common dtype of {names}: numpy has none ({why}); convert one first, e.g. "
                      "x.astype('float32')")


def check_dtensor(value: Any, what: str) -> None:
    """OperatorError unless `value` is a DTensor; `what` names it ("matmul: w")."""
    if type(value) is DTensor:
        return
    if not isinstance(value, DTensor):
        raise OperatorError(f"{what} must be a DTensor, got {describe(value)}; build one with "
                            "DTensor.from_local/from_seeded")


def flag(op: str, name: str, value: Any) -> bool:
    """`value` as a bool (numpy's too); OperatorError naming `op` and the flag `name` otherwise: a truthy
    string such as "no", or 1, is no flag."""
    if type(value) is bool:
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    raise OperatorError(f"{op}: {name} {value!r} must be True or False")


def raise_if_not_dtensors(op: str, names: tuple[str, ...], *operands: Any) -> None:
    """Raise the OperatorError for the first operand that is not a DTensor (None included).

    Ops call it when reading their operands raised AttributeError, so a call
    with DTensors pays nothing for the check:
    ``except AttributeError: raise_if_not_dtensors("matmul", ("x", "w"), x, w); raise``.
    """
    for name, t in zip(names, operands):
        try:
            check_dtensor(t, f"{op}: {name}")
        except OperatorError as error:
            raise error from None


def require_float(op: str, local: np.ndarray) -> None:
    """Refuse a non-floating `local` for `op` (GELU, softmax) as PyTorch does, instead of truncating."""
    if not is_float(local.dtype):
        raise OperatorError(f"{op} of a DTensor of dtype {local.dtype.name!r}: {op} needs a floating dtype "
                            "(float16, float32 or float64); convert first, e.g. x.astype('float64')")


def refuse_bool_sum(op: str, local: np.ndarray, why: str) -> None:
    """OperatorError when an op's local result that ranks add up holds bools (MPI has no bool sum).

    Called on the local product, before any collective: its dtype is the
    same on every rank.
    """
    if local.dtype is _BOOL:
        raise OperatorError(f"{op}: the operands have dtype 'bool', but {why}; use an integer, "
                            "float or complex dtype")


def same_mesh(*tensors: Any) -> Any:
    """The mesh the tensors share; OperatorError when they live on different meshes."""
    mesh = tensors[0].mesh
    for t in tensors[1:]:
        if t.mesh is not mesh:
            check_meshes("", mesh, t.mesh)
    return mesh


def check_meshes(op: str, mesh: Any, other: Any) -> None:
    """OperatorError (by `op`, "" unnamed) when operands on the Mesh objects `mesh` and `other` cannot meet:
    another layout, another rank's mesh, or the same layout over other ranks (spmdsim.runtime.mesh.foreign)."""
    why = foreign(mesh, other)
    if why is not None:
        raise different_meshes(op, mesh.layout, other.layout, why)


def different_meshes(op: str, first: Any, other: Any, why: str | None = None) -> OperatorError:
    """The refusal of operands on the Layouts `first` and `other` (by `op`, "" unnamed; `why`: what differs where
    the Layouts are equal). Where the two have the same
    device matrix and one has the default names, it says where such a Layout comes from: a layout built from a bare mesh
    shape (placements_to_layout("R, S(1)", (2, 4), 2)) names its axes axis_0, axis_1, ..., and a redistribution onto it
    moves the tensor onto that mesh."""
    said = f"{op}: " if op else ""
    if first == other:
        return OperatorError(f"{said}operands live on different meshes: {why}")
    hint = ""
    default = default_axis_names(len(first.device_matrix))
    if first.device_matrix == other.device_matrix and default in (first.alias_name, other.alias_name):
        hint = ("; they differ only in their axis names: a layout built from a mesh shape rather than the mesh "
                "names them axis_0, axis_1, ... (build it on the tensor's mesh: placements_to_layout(p, x.mesh, "
                "x.ndim), partition_spec_to_layout(spec, x.mesh, x.ndim), x.mesh.layout(...))")
    elif first.num_devices == other.num_devices:  # a redistribution moves a tensor onto a mesh of as many devices
        hint = (f"; move one onto the other's mesh first (both have {first.num_devices} devices): "
                "y = y.redistribute(x.mesh.layout(...))")
    return OperatorError(f"{said}operands live on different meshes: {first} and {other}{hint}")


def verify_operands(mesh: Any, op: str, names: tuple[str, ...], *tensors: Any) -> None:
    """With SPMDSIM_CHECK, the named operands' global shapes, layouts and dtypes agree on every rank.

    Free otherwise (one flag read). A None tensor (no bias) is skipped.
    """
    if debug.quiet():
        return
    debug_calls.verify_operands(mesh, op, tuple((name, t.global_shape, t.layout, t.local.dtype)
                                                for name, t in zip(names, tensors) if t is not None))


def operands_mesh(op: str, names: tuple[str, ...], *tensors: Any) -> Any:
    """The mesh an operator's DTensor operands share, checked at the operator's entry.

    A non-DTensor operand is named (looked for only when reading it failed, so DTensors pay nothing), operands
    on two meshes are refused, and with SPMDSIM_CHECK they are compared across ranks (`verify_operands`).
    Pass only the operands given (no None for an absent bias).
    """
    try:
        mesh = same_mesh(*tensors)
    except AttributeError:  # not DTensors: say which
        raise_if_not_dtensors(op, names, *tensors)
        raise
    verify_operands(mesh, op, names, *tensors)
    return mesh
