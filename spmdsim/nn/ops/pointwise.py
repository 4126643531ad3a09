"""Elementwise ops with numpy broadcasting on DTensors, by the sharding rules of spmdsim.programs.infer.pointwise.

Each op plans (pure, cached), redistributes the operands that disagree with
the plan (the planner's least-bytes moves, recorded for autograd), runs
numpy's kernel on this rank's blocks, and records its node with its
gradient rule (`spmdsim.nn.autograd.rules.pointwise`: each operand's gradient is
the local derivative summed over the dims the operand was broadcast along, a
pending sum over the axes that split those dims). Python numbers are
replicated 0-d operands. ``DTensor``'s ``+ - * / ** -x`` call these.
"""
from __future__ import annotations

import math
import numbers
from functools import partial
from typing import Any, Callable, Optional

import numpy as np

from ...references.activations import erf as _erf, gelu_erf as _gelu_erf, sigmoid as _sigmoid
from ..autograd.graph import attach, record
from ..autograd.kept import shell
from ..autograd.rules.grads import NEED2, grad_tensor
from ..autograd.rules.pointwise import DERIVATIVES, LOUD, PointwiseGrads, quiet, record_pointwise
from ...errors import DTypeError, OperatorError
from ...base import flops as _flops
from ...base.flops import sweep
from ...programs.infer.pointwise import infer_pointwise
from ...base.precision import is_low, rounded, wide
from ...base.validate import dtype_arg
from . import _common
from ...base.buffers import CAPTURE
from ._common import (BLOCK, DRY_ZEROS_BYTES, LOCAL, Prepared, describe, dry_zeros, make_dtensor, moved, prepare,
                      prepared_result, result_dtype, signature, ufunc_dtype)
from ...runtime.executor import redistribute
from ...runtime import door, replay

__all__ = ["add", "sub", "mul", "div", "floor_divide", "remainder", "round", "floor", "ceil", "sign", "maximum",
           "minimum", "where", "exp", "log", "sqrt", "tanh", "pow", "neg",
           "abs", "sigmoid", "silu", "sin", "cos", "square", "rsqrt", "clip", "erf", "equal", "not_equal", "lift",
           "pointwise", "astype", "power"]


# op -> its forward kernel (its derivative: spmdsim.nn.autograd.rules.pointwise.DERIVATIVES; none for comparisons).
_KERNELS: dict[str, Callable] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "floordiv": np.floor_divide,
    "mod": np.remainder, "round": np.round, "rint": np.rint, "floor": np.floor, "ceil": np.ceil, "sign": np.sign,
    "maximum": np.maximum,
    "minimum": np.minimum, "where": np.where, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh,
    "neg": np.negative, "abs": np.abs, "pow": np.power, "sigmoid": _sigmoid, "silu": lambda x: x * _sigmoid(x),
    "sin": np.sin, "cos": np.cos, "square": np.square, "rsqrt": lambda x: 1 / np.sqrt(x), "clip": np.clip,
    "erf": _erf, "gelu_erf": _gelu_erf,
    "eq": np.equal, "lt": np.less, "gt": np.greater, "le": np.less_equal, "ge": np.greater_equal, "ne": np.not_equal,
    "log1p": np.log1p, "expm1": np.expm1,
    # bitwise and logical (no gradient: their results are bool or integer), and the value tests
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor, "invert": np.invert,
    "logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor,
    "logical_not": np.logical_not, "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite,
}


def lift(mesh: Any, value: Any, dtype: Optional[np.dtype], op: str) -> Any:
    """A Python or numpy number as a replicated 0-d DTensor. A Python number takes `dtype` (numpy's weak
    scalar rule); beside bool tensors alone (`dtype` None) its own kind, as numpy 2 promotes it (NEP 50): a
    bool stays bool (``mask + True`` is a logical or), an int is int64, a float float64. A numpy scalar keeps
    its own dtype, as NEP 50 has it (float32 tensor + np.float64(0.1) is float64). A 0-d numpy array is its
    numpy scalar: numpy makes one of a scalar on the left of a comparison (``np.float64(0.5) < x`` reaches
    DTensor.__array_ufunc__ as np.less(array(0.5), x)), and NEP 50 types the two alike.

    Beside bfloat16 (ml_dtypes' dtype, of kind "V"), the dtype numpy's own call gives (`_beside_low`): a Python
    float is float32 (``x * 1.5`` of bfloat16 x is float32, as numpy's; in ``where`` float64, as np.where's), an
    int or bool bfloat16; in a logical and/or/xor a Python int is int64 beside any other dtype, as numpy's
    logical ufuncs take it (its truth is what counts; past int64 numpy refuses it: `_beyond`); a numpy scalar
    whose dtype numpy's promotion table lacks beside bfloat16 (float16,
    int16 and wider ints) is converted, exactly, to the float numpy's ufuncs compute in (float32, float64)."""
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
    elif dtype.kind == "V":
        target = _beside_low(op, dtype, type(value) if type(value) in (bool, int, float) else float)
    elif op in _LOGICAL and type(value) is int:  # numpy's logical ufuncs take it as int64 (past it: refused)
        target = np.dtype(np.int64)
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
    numpy's own call gives it on blocks of that dtype: np.where promotes by np.result_type (a float: float64),
    np.clip has no bfloat16 loop (float32), the other ufuncs take an int or bool as bfloat16 and a float as
    float32 (numpy's NEP 50 rule for a user dtype: the first of its loops both cast to safely)."""
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
    """The dtype numpy's ufuncs compute on dtypes `a` and `b` in (spmdsim.nn.ops._common.ufunc_dtype)."""
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
    kinds = [t.local.dtype for t in tensors if t.local.dtype.kind != "b"]
    dtype = _promote(op)(*kinds) if kinds else None  # every tensor bool: each number by its own type
    return mesh, [a if any(a is t for t in tensors) else lift(mesh, a, dtype, op) for a in args]


def pointwise(op: str, *args: Any) -> Any:
    """Run elementwise `op` on DTensors and numbers with numpy broadcasting (see the module docstring).

    What the call decides is a `_Prepared` (spmdsim.nn.ops._common.Prepared), kept per call signature: a repeated
    call runs the kernel and builds its result and node directly. A Python number (an int, float or bool) is
    part of the signature by its type (`_mixed_signature`) and lifted to its 0-d DTensor on each call.
    """
    try:
        if len(args) == 2:  # `signature`'s key, without its call (most calls: two operands)
            a, b = args
            key = op, id(a._layout), id(b._layout), a._shape, b._shape, a._local.dtype, b._local.dtype
        else:
            key = signature(op, args)
        prepared = _PREPARED.get(key)
    except (AttributeError, TypeError):  # a number among the operands (or what no DTensor is: _operands says)
        if (op == "mul" or op == "div") and len(args) == 2:  # a finite Python number (nonzero dividing) passes
            n = args[1] if type(args[1]) is float or type(args[1]) is int else args[0]
            if not ((type(n) is float or type(n) is int) and n - n == 0 and (n or op == "mul")):
                args = _unscaled(op, args)
        key = _mixed_signature(op, args)
        try:
            prepared = None if key is None else _PREPARED.get(key)
        except TypeError:  # a size that does not hash (the planner refuses it)
            key = prepared = None
    if prepared is None:
        try:
            mesh, xs = _operands(op, args)
        except OverflowError:  # a Python int the tensors' dtype cannot hold
            return _beyond(op, args)
        except DTypeError as e:
            raise _named(op, e) from None
        try:
            prepared = prepare(_PREPARED, partial(_Prepared, op), xs, key)
        except DTypeError as e:
            raise _named(op, e) from None
    elif key[1] is _MIXED:  # numbers of the types, beside DTensors of the layouts, of a call that passed _operands
        try:
            mesh, xs = _lifted(args, prepared)
        except OverflowError:
            return _beyond(op, args)
    else:  # the same layout objects, shapes and dtypes as a call that passed _operands
        mesh, xs = args[0]._mesh, args
    if not prepared.stays:
        xs = moved(xs, prepared)
    if prepared.signed:  # an integer power of signed integers: numpy's kernel refuses a negative one
        _negative_powers(mesh, args, xs)
    forward = _KERNELS[op]
    locals_ = list(map(BLOCK, xs)) if not CAPTURE.on else list(map(LOCAL, xs))
    block = _dry_block(mesh, forward, locals_, prepared) if mesh.engine.dry else None
    if block is None:
        if prepared.dtype_name == "bfloat16":  # computed in float32, rounded once (spmdsim.base.precision)
            with quiet(op, divide="ignore", invalid="ignore", over="ignore"):
                block = rounded(forward(*[wide(b) for b in locals_]), prepared.dtype)
        elif op in LOUD:  # `quiet`'s errstate, for the ops that warn on finite operands
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                block = forward(*locals_)
        else:
            block = forward(*locals_)
    if _flops._OPEN:  # one fused pass (spmdsim.base.flops): its operands read, its result written
        sweep(op, locals_, (block,))
    if type(block) is _ndarray and block.shape == prepared.block and block.flags.c_contiguous:
        # `prepared_result`'s usual case, its DTensor built here (DTensor._trusted without its call)
        out = _new(_common._DTENSOR)
        out._mesh, out._local, out._layout, out._shape, out._ag = mesh, block, prepared.out, prepared.shape, None
    else:
        out = prepared_result(mesh, block, prepared)
    if prepared.derivative is not None:  # not a comparison
        if len(xs) == 2:  # record_pointwise's node without its call (most nodes: two operands)
            a, b = xs
            need = NEED2[a._ag is None][b._ag is None]
            if need is not _NONE:
                if type(xs) is not tuple:  # (a lifted number's call)
                    xs = tuple(xs)
                grads = _new(PointwiseGrads)
                grads.op, grads.xs, grads.out, grads.prepared, grads.need = op, xs, out, prepared, need
                return attach(out, op, xs, grads, prepared.want, prepared.reads)
            return out
        for x in xs:
            if x._ag is not None:
                return record_pointwise(op, out, xs if type(xs) is tuple else tuple(xs), prepared)
    return out


def _named(op: str, error: DTypeError) -> DTypeError:
    """`error`, spmdsim.nn.ops._common's line for dtypes numpy has no common one of (np.where's, a ufunc's) with
    `op` named in front; any other DTypeError (naming its op already) as it is."""
    return DTypeError(f"{op}: {error}") if str(error).startswith("no common dtype") else error


_ndarray = np.ndarray
_new = object.__new__
_NONE = NEED2[True][True]  # two operands, neither taking a gradient


def _unscaled(op: str, args: tuple) -> tuple:
    """`args` of a product or quotient by a number, a pending sum among them resolved first where the number is
    not finite (times inf or NaN) or divides by zero: kept pending, the zeros the other members hold would give
    0 * inf = NaN, where numpy's product of the whole value is inf. (`pointwise` calls it for two operands.)"""
    number = args[1] if op == "div" or hasattr(args[0], "_ag") else args[0]
    if hasattr(number, "_ag"):  # a DTensor divisor: its values are not looked at
        return args
    try:
        if math.isfinite(number) and (op == "mul" or number != 0):
            return args
    except (TypeError, OverflowError):  # no number (refused below), or an int past a float's range
        return args

    return tuple(redistribute(a, a.layout.with_partial(())) if getattr(a, "partial", None) else a for a in args)


#: A comparison with the operands swapped (``5 < x`` is ``x > 5``); those true where x's every entry lies below
#: the number, and those true where every entry lies above it.
_SWAPPED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
_TRUE_BELOW, _TRUE_ABOVE = frozenset({"lt", "le", "ne"}), frozenset({"gt", "ge", "ne"})
_LOGICAL = frozenset({"logical_and", "logical_or", "logical_xor"})


def _beyond(op: str, args: tuple) -> Any:
    """`op` of DTensors and a Python int that their dtype cannot hold (`lift`'s OverflowError), as numpy 2 has
    it (NEP 50): an integer DTensor compared with it is compared (``x < 2**40`` of int32: every entry lies
    below the number, all True), by a comparison of x with its dtype's largest value that gives that same
    answer everywhere; a quotient is numpy's float64 one (the number converted to float64), a logical and/or/xor
    takes a number within int64 by its truth; anything else numpy refuses (OverflowError; ml_dtypes' bfloat16:
    TypeError), and so does this, in one line."""
    cls = _common._DTENSOR or _common._dtensor_class()
    kinds = [a.local.dtype for a in args if type(a) is cls and a.local.dtype.kind != "b"]
    dtype = _promote(op)(*kinds) if kinds else np.dtype(np.int64)  # bools alone: a Python int is int64
    if op in _LOGICAL and dtype.kind != "V":  # numpy's logical ufuncs take a Python int as int64 (`lift`)
        dtype = np.dtype(np.int64)
    number = next(a for a in args if type(a) is int and not _holds(dtype, a))
    if op in _SWAPPED and len(args) == 2 and kinds and dtype.kind in "iu":  # (bools alone: numpy refuses)
        x, cmp = (args[0], op) if args[1] is number else (args[1], _SWAPPED[op])
        top = int(np.iinfo(dtype).max)
        true = cmp in (_TRUE_BELOW if number > top else _TRUE_ABOVE)
        return pointwise("le" if true else "gt", x, top)
    if op == "div" and dtype.kind in "iu":  # numpy divides integers in float64: the number converted to it
        try:
            return pointwise(op, *[float(number) if a is number else a for a in args])
        except OverflowError:  # past float64's range (numpy refuses it too)
            pass
    wider = "int64" if dtype.kind in "iu" and -2 ** 63 <= number < 2 ** 63 else "float64"
    instead = (f"convert first, e.g. x.astype({wider!r})" if wider != dtype.name and op not in _LOGICAL
               else "pass its truth, True" if op in _LOGICAL else "compute in Python ints")
    digits = str(number)
    shown = digits if len(digits) <= 24 else f"of {len(digits.lstrip('-'))} digits"
    beside = "/".join(sorted({a.local.dtype.name for a in args if type(a) is cls}))
    if dtype.kind == "V":  # ml_dtypes converts a Python int through int64 (past it: "expected number, got int")
        raise DTypeError(f"{op}: the Python int {shown} is past int64, through which ml_dtypes converts a Python int "
                         f"to {dtype.name}, the dtype it takes beside a DTensor of {beside} (numpy 2 refuses it too: "
                         f"TypeError); {instead}")
    raise DTypeError(f"{op}: the Python int {shown} is out of bounds for {dtype.name}, the dtype it takes beside a "
                     f"DTensor of {beside} (numpy 2 refuses it too: OverflowError); {instead}")


def _holds(dtype: np.dtype, number: int) -> bool:
    """Whether `dtype` holds the Python int `number` (a float's: within its range)."""
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return int(info.min) <= number <= int(info.max)
    try:
        _number(number, dtype)
    except OverflowError:
        return False
    return True


class _Prepared(Prepared):
    """A pointwise call's `Prepared`, with its op's derivative (None: a comparison, which records nothing),
    `ways`, what its node's backward decides per dY layout (spmdsim.nn.autograd.rules.pointwise), kept here, and
    the operands' dtypes (a lifted number's: `_lifted`)."""

    __slots__ = ("derivative", "ways", "dtypes", "signed")

    def __init__(self, op: str, layouts: tuple, shapes: tuple, dtypes: tuple) -> None:
        if op in _NO_BOOL and all(d.kind == "b" for d in dtypes):  # numpy refuses these (a TypeError)
            name, instead = _NO_BOOL[op]
            raise OperatorError(f"{op} of bool DTensors: numpy has no boolean {name}; use {instead}, or convert "
                                "first, e.g. x.astype('int64')")
        if op in _BITWISE:  # numpy's TypeError for floats (on every rank alike: the dtypes are every rank's)
            _bitwise_dtypes(op, dtypes)
        super().__init__(infer_pointwise, op, layouts, shapes, dtypes, "out", _promote(op))
        self.derivative = DERIVATIVES.get(op)
        self.ways: dict = {}
        self.dtypes = dtypes
        # numpy's integer power raises on a negative exponent (`_negative_powers` checks it on every rank alike)
        self.signed = op == "pow" and self.dtype.kind in "iu" and dtypes[1].kind == "i"


#: The ops numpy refuses on booleans alone (np.negative, np.subtract): what it calls them, what to use instead.
_NO_BOOL = {"neg": ("negative", "ops.equal(x, False) for logical not"),
            "sub": ("subtract", "ops.not_equal(a, b) for exclusive or")}

#: numpy's bitwise ufuncs, by spmdsim's op names: their names and operators in messages.
_BITWISE = {"and": "bitwise_and (&)", "or": "bitwise_or (|)", "xor": "bitwise_xor (^)", "invert": "invert (~)"}


def _bitwise_dtypes(op: str, dtypes: tuple) -> None:
    """Refuse a bitwise `op` of operands of `dtypes` (a lifted number's too) numpy's bitwise ufuncs have no loop
    for: a float or bfloat16 among them, or integers whose common dtype is a float (uint64 and int64), in one
    line naming the op, the dtypes and what it takes (numpy's TypeError named none of them)."""
    common = ufunc_dtype(*dtypes)
    if common.kind in "biu":
        return
    names = " and ".join(dict.fromkeys(d.name for d in dtypes))
    floats = [d.name for d in dtypes if d.kind not in "biu"]
    if floats:
        raise DTypeError(f"{_BITWISE[op]} of {names}: numpy's bitwise ops take integer or bool operands, not "
                         f"{floats[0]}; convert first, e.g. x.astype('int64'), or compare for a mask, e.g. x > 0")
    raise DTypeError(f"{_BITWISE[op]} of {names}: numpy's bitwise ops take integer or bool operands of a common "
                     f"integer dtype, and these promote to {common.name}; convert one first, e.g. x.astype('int64')")


_MIXED = object()  # the second entry of a signature whose operands mix DTensors and numbers


def _mixed_signature(op: str, args: tuple) -> Any:
    """The key of a call whose operands mix DTensors and Python numbers (None for other operands, or none a
    DTensor): per operand its layout object's id, global shape and dtype, or the number's type, which with
    the DTensors' dtypes decides the 0-d DTensor `lift` makes of it (its value aside)."""
    cls = _common._DTENSOR or _common._dtensor_class()
    key: list = [op, _MIXED]
    tensors = False
    for a in args:
        kind = type(a)
        if kind is cls:
            key += (id(a._layout), a._shape, a._local.dtype)
            tensors = True
        elif kind is float or kind is int or kind is bool:
            key.append(kind)
        else:
            return None
    return tuple(key) if tensors else None


def _lifted(args: tuple, prepared: _Prepared) -> tuple:
    """(the mesh, the operands) of a mixed call found prepared: each number lifted as `lift` lifts it, to the
    0-d layout and dtype its signature's first call gave it (checked then), the DTensors as they are."""
    cls = _common._DTENSOR
    mesh = next(a._mesh for a in args if type(a) is cls)
    try:
        return mesh, [a if type(a) is cls else cls._trusted(mesh, np.asarray(a, dtype), layout, ())
                      for a, layout, dtype in zip(args, prepared.layouts, prepared.dtypes)]
    except TypeError:  # ml_dtypes' bfloat16 of a Python int past int64 ("expected number, got int")
        raise OverflowError("a Python int past its dtype") from None


_PREPARED: dict = {}  # signature -> _Prepared (spmdsim.nn.ops._common.Prepared)


def _negative_powers(mesh: Any, args: tuple, xs: Any) -> None:
    """Refuse, on every rank alike, an integer power (numpy's integer loop: an integer or bool base, a signed
    integer exponent) with a negative exponent where the result has entries, as numpy refuses it (its kernel's
    ValueError, raised on the ranks holding such an entry alone, would leave the others going on into the next
    collective). A number's exponent is every rank's: checked here. A DTensor's values differ between ranks:
    each rank's least exponent among those its result block uses, the least of them agreed over the mesh (one
    small Allreduce of control traffic, for this kind of call only; in a dry run, where one rank runs for all,
    its own block's, a large one's zeros not looked at). While capturing (spmdsim.runtime.replay), that check is
    recorded as a kernel: each replay checks the exponent it is given again, on every rank alike."""
    base, exponent = xs
    cls = _common._DTENSOR
    block = exponent._local
    if type(args[1]) is not cls:  # a number: every rank's
        least = int(block.min()) if math.prod(base._shape) else 0
        if least < 0:
            raise _negative_power(base._local.dtype if type(args[0]) is cls else None, least, args[0])
        return
    what = f"a DTensor of {base._local.dtype.name}" if type(args[0]) is cls else describe(args[0])
    if mesh.engine.dry:  # one rank runs for all: its own block, unless a large one (zeros, not looked at)
        least = int(block.min()) if block.size and base._local.size and block.nbytes < DRY_ZEROS_BYTES else 0
        if least < 0:
            raise _negative_exponents(what, block.dtype, least)
        return

    if CAPTURE.on and replay.capturing():  # the values a replay is given are not the capture's: checked again
        replay.kernel(_least_exponent)(mesh.comm, block, base._local.size, what)
    else:
        _least_exponent(mesh.comm, block, base._local.size, what)


def _least_exponent(comm: Any, block: np.ndarray, base_size: int, what: str) -> None:
    """`_negative_powers`' check of a DTensor's exponent `block` (this rank's, beside a base block of
    `base_size` entries): the least entry over `comm`'s ranks, a negative one refused on every rank alike."""
    least = door.all_reduce_object(comm, int(block.min()) if block.size and base_size else 0, "min")
    if least < 0:
        raise _negative_exponents(what, block.dtype, least)


def _negative_exponents(what: str, dtype: np.dtype, least: int) -> OperatorError:
    """The refusal of `what` (a DTensor or a number, described) to the powers of a DTensor of integer `dtype`
    whose least entry is `least`, the same on every rank."""
    return OperatorError(f"pow: {what} to the powers of a DTensor of {dtype.name} whose entries include "
                         f"{least}: numpy refuses integers to negative integer powers; convert first, e.g. "
                         "exponent.astype('float64')")


def _negative_power(dtype: Any, exponent: int, base: Any = None) -> OperatorError:
    """The refusal of a DTensor of integer `dtype` (None: the number `base`) to the negative integer power
    `exponent`, the same on every rank."""
    what = f"a DTensor of {dtype.name}" if dtype is not None else describe(base)
    return OperatorError(f"pow: {what} to the negative integer power {exponent}: numpy refuses integers to "
                         f"negative integer powers; use a float exponent ({float(exponent)!r}) or convert x first, "
                         "e.g. x.astype('float64')")


def astype(x: Any, dtype: Any) -> Any:
    """`x` with its blocks converted to `dtype` (a float rounded to nearest even), recorded for autograd.

    The gradient goes back in x's own gradient dtype; the same layout, pending sums kept (a cast of a
    pending sum to a narrower float rounds each addend: round after resolving it)."""
    want = dtype_arg(dtype)
    if x.local.dtype == want:
        return x
    dry = dry_zeros(x.mesh, x.local.shape, want, np.ndarray.astype, x.local, want)  # a dry run's: not converted
    out = make_dtensor(x.mesh, x.local.astype(want) if dry is None else dry, x.layout, x.global_shape)
    if x._ag is None:
        return out
    x = shell(x)  # the cast's backward reads no value of x: the node keeps its shell, not its block
    return record(out, f"astype {want.name}", (x,), lambda dy: (grad_tensor(x, dy.local, dy.layout.partial),))


def _dry_block(mesh: Any, forward: Callable, locals_: list, prepared: Optional[_Prepared] = None) -> Any:
    """A dry run's large result (spmdsim.nn.ops._common.dry_zeros): zeros of the real block's shape and dtype, not
    computed; None for a small one (computed). `prepared`: the call's, whose bfloat16 result the real kernel
    rounds to (None: the kernel's own dtype, ops.fused's adds and products)."""
    shape = np.broadcast_shapes(*(block.shape for block in locals_))
    zeros = [np.zeros((), block.dtype) for block in locals_]
    with np.errstate(all="ignore"):  # the result's dtype: the real kernel's on one zero of each operand's dtype
        if prepared is not None and prepared.dtype_name == "bfloat16":  # widened, rounded (sigmoid's raw: float32)
            dtype = rounded(np.asarray(forward(*map(wide, zeros))), prepared.dtype).dtype
        else:
            dtype = np.asarray(forward(*zeros)).dtype
    return dry_zeros(mesh, shape, dtype, forward, *locals_)


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
    an integer's computed in float64 and converted back to its dtype); a bool's refused, as numpy refuses it."""
    if isinstance(decimals, bool) or not isinstance(decimals, numbers.Integral):
        raise OperatorError(f"round: decimals {decimals!r} must be an integer")
    if decimals < 0:
        dtype = getattr(getattr(x, "local", None), "dtype", np.dtype(np.float64))
        if dtype.kind == "b":
            raise OperatorError(f"round of a bool DTensor to decimals {decimals}: numpy refuses it (its quotient "
                                "is not a bool); convert first, e.g. x.astype('int64')")
        scale = 10.0 ** -int(decimals) if decimals >= -308 else math.inf  # numpy's too: inf, then NaN
        out = pointwise("mul", pointwise("round", pointwise("div", x, scale)), scale)
        return astype(out, dtype) if dtype.kind in "iu" else out
    if not decimals or getattr(getattr(x, "local", None), "dtype", np.dtype(np.float64)).kind in "iu":
        # Integers have no places to round (numpy gives them back as they are, their dtype kept): scaled by a
        # float they would come back float64.
        return pointwise("round", x)
    scale = 10.0 ** int(decimals)
    return pointwise("div", pointwise("round", pointwise("mul", x, scale)), scale)


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
        # The missing bound is one that changes no value and no dtype (numpy clips by the given bound alone):
        # an integer's extremes, a bool's the ints 0 and 1 (-inf and inf would make it float64), a float's infs.
        edges = ((np.iinfo(dtype).min, np.iinfo(dtype).max) if dtype.kind in "iu" else (0, 1) if dtype.kind == "b"
                 else (-np.inf, np.inf))
        low = edges[0] if low is None else low
        high = edges[1] if high is None else high
    return pointwise("clip", x, low, high)


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
