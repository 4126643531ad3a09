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
from functools import partial
from typing import Any, Callable, Optional

import numpy as np

from ...references.activations import erf as _erf, gelu_erf as _gelu_erf, sigmoid as _sigmoid
from ..autograd.graph import attach
from ..autograd.rules.grads import NEED2
from ..autograd.rules.pointwise import DERIVATIVES, LOUD, NO_DERIVATIVE, PointwiseGrads, quiet, record_pointwise
from ...errors import DTypeError, OperatorError
from ...base import flops as _flops
from ...base.flops import sweep
from ...programs.infer.pointwise import infer_pointwise
from ...base.precision import rounded, wide
from . import _common
from ...base.buffers import CAPTURE
from ._common import BLOCK, LOCAL, Prepared, describe, dry_zeros, moved, prepare, prepared_result, signature
from ._operands import check_meshes, ufunc_dtype
from ...runtime.executor import redistribute
from .powers import _negative_powers
from .scalars import _LOGICAL, _number, _promote, lift, logical_by_truth

__all__ = ["pointwise"]


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


def _operands(op: str, args: tuple) -> tuple[Any, list]:
    """The mesh and the operands as DTensors (numbers lifted to the tensors' dtype)."""
    cls = _common._DTENSOR or _common._dtensor_class()
    for a in args:
        if type(a) is not cls:
            break
    else:  # DTensors only (most calls): nothing to lift
        mesh = args[0].mesh
        for t in args[1:]:
            if t.mesh is not mesh:
                check_meshes(op, mesh, t.mesh)
        return mesh, list(args)
    tensors = [a for a in args if hasattr(a, "_ag") and hasattr(a, "layout")]
    if not tensors:
        raise OperatorError(f"{op}: no operand is a DTensor (got {', '.join(describe(a) for a in args)})")
    mesh = tensors[0].mesh
    for t in tensors[1:]:
        if t.mesh is not mesh:
            check_meshes(op, mesh, t.mesh)
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
        first = _first_call(op, args, key)
        if first is None:  # a Python int the tensors' dtype cannot hold
            return _beyond(op, args)
        mesh, xs, prepared = first
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


def _first_call(op: str, args: tuple, key: Any) -> Optional[tuple]:
    """(mesh, operands, `_Prepared`) of a call signature's first call, its operands checked and lifted and its
    plan kept under `key`; None where a Python int does not fit the tensors' dtype (`_beyond` says so)."""
    try:
        mesh, xs = _operands(op, args)
    except OverflowError:
        return None
    except DTypeError as e:
        raise _named(op, e) from None
    try:
        return mesh, xs, prepare(_PREPARED, 4096, partial(_Prepared, op), xs, key)
    except DTypeError as e:
        raise _named(op, e) from None


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


def _beyond(op: str, args: tuple) -> Any:
    """`op` of DTensors and a Python int that their dtype cannot hold (`lift`'s OverflowError), as numpy 2 has
    it (NEP 50): an integer DTensor compared with it is compared (``x < 2**40`` of int32: every entry lies
    below the number, all True), by a comparison of x with its dtype's largest value that gives that same
    answer everywhere; a quotient is numpy's float64 one (the number converted to float64), a logical and/or/xor
    takes a number within int64 by its truth (under numpy 2.0 any number: `logical_by_truth`); anything else
    numpy refuses (OverflowError; ml_dtypes' bfloat16 before 0.7: TypeError), and so does this, in one line."""
    cls = _common._DTENSOR or _common._dtensor_class()
    kinds = [a.local.dtype for a in args if type(a) is cls and a.local.dtype.kind != "b"]
    dtype = _promote(op)(*kinds) if kinds else np.dtype(np.int64)  # bools alone: a Python int is int64
    if op in _LOGICAL:  # numpy's logical ufuncs take a Python int as int64 (`lift`)
        dtype = np.dtype(np.int64)
    number = next(a for a in args if type(a) is int and not _holds(dtype, a))
    if op in _LOGICAL and logical_by_truth():  # numpy 2.0's: the number's truth (True: it is past int64)
        return pointwise(op, *[True if a is number else a for a in args])
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
        if op in _NO_COMPLEX and any(d.kind == "c" for d in dtypes):  # (erf's kernel cast complex to float)
            name, refuses = _NO_COMPLEX[op]
            raise DTypeError(f"{name} of {' and '.join(dict.fromkeys(d.name for d in dtypes))}: {refuses}; {name} "
                             "takes bool, integer or float operands, not complex")
        super().__init__(infer_pointwise, op, layouts, shapes, dtypes, "out", _promote(op))
        self.derivative = DERIVATIVES.get(op)
        if self.derivative is None and op not in NO_DERIVATIVE:  # a new op's forgotten rule: never no gradient
            raise OperatorError(f"{op} has no derivative: add one to spmdsim.nn.autograd.rules.pointwise.DERIVATIVES "
                                "(or its name to NO_DERIVATIVE there, where its result is bool or integer)")
        self.ways: dict = {}
        self.dtypes = dtypes
        # numpy's integer power raises on a negative exponent (`_negative_powers` checks it on every rank alike)
        self.signed = op == "pow" and self.dtype.kind in "iu" and dtypes[1].kind == "i"


#: The ops numpy refuses on booleans alone (np.negative, np.subtract, np.sign): what it calls them, what to use instead.
_NO_BOOL = {"neg": ("negative", "ops.equal(x, False) for logical not"),
            "sub": ("subtract", "ops.not_equal(a, b) for exclusive or"),
            "sign": ("sign", "the mask itself (True's sign is 1)")}

#: The ops numpy or PyTorch refuse on complex operands, by spmdsim's op names: their names in messages, and who
#: refuses (numpy's floor, ceil, floor_divide and remainder have no complex loop: a TypeError; numpy has no erf,
#: and PyTorch's erf refuses complex, where the kernel here cast it to float, dropping the imaginary part).
_NO_COMPLEX = {"erf": ("erf", "PyTorch's erf refuses it (numpy has none)"),
               "gelu_erf": ("gelu", "PyTorch's gelu refuses it"),
               "floor": ("floor", "numpy's floor refuses it"), "ceil": ("ceil", "numpy's ceil refuses it"),
               "floordiv": ("floor_divide (//)", "numpy's floor_divide refuses it"),
               "mod": ("remainder (%)", "numpy's remainder refuses it")}

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
_WIDEST = 32  # bytes of numpy's widest element (clongdouble): a result of fewer elements than DRY_ZEROS_BYTES / 32
# is small at any dtype, so `_dry_block` need not work its dtype out (a small model's every result)


def _dry_block(mesh: Any, forward: Callable, locals_: list, prepared: Optional[_Prepared] = None) -> Any:
    """A dry run's large result (spmdsim.nn.ops._common.dry_zeros): zeros of the real block's shape and dtype, not
    computed; None for a small one (computed). `prepared`: the call's, whose bfloat16 result the real kernel
    rounds to (None: the kernel's own dtype, ops.fused's adds and products)."""
    shape = locals_[0].shape
    if any(block.shape != shape for block in locals_):
        shape = np.broadcast_shapes(*(block.shape for block in locals_))
    if math.prod(shape) * _WIDEST < _common.DRY_ZEROS_BYTES:  # small at any dtype: computed (dry_zeros' None)
        return None
    zeros = [np.zeros((), block.dtype) for block in locals_]
    with np.errstate(all="ignore"):  # the result's dtype: the real kernel's on one zero of each operand's dtype
        if prepared is not None and prepared.dtype_name == "bfloat16":  # widened, rounded (sigmoid's raw: float32)
            dtype = rounded(np.asarray(forward(*map(wide, zeros))), prepared.dtype).dtype
        else:
            dtype = np.asarray(forward(*zeros)).dtype
    return dry_zeros(mesh, shape, dtype, forward, *locals_)
