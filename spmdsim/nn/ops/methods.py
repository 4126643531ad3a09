"""DTensor's operators and autograd methods: the table `bind_dtensor` fills in the runtime.

``x + y``, ``x @ w``, ``x.sum()``, ``x.requires_grad_()``, ``loss.backward()`` and
numpy's protocol (``np.exp(x)``, ``abs(x)``, ``len(x)``) are methods of the runtime's
DTensor that call what `bind_dtensor` puts in `spmdsim.runtime.dtensor_methods`' table: the
operators and autograd build DTensors, so the runtime, below them, imports neither
(docs/explanation/architecture.md, "The layers"). PyTorch's spellings of spmdsim's operators
(``x.view(...)``, ``x.softmax(-1)``, ``x.unsqueeze(0)``, ``x.detach()``, ...) are
methods of its class that call the functions this table gives them. spmdsim.nn.ops calls
`bind_dtensor` when it loads, the front door before it hands out a runtime name.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Any, Callable

import numpy as np

from ..autograd.engine import backward
from ..autograd.graph import requires_grad_, set_grad
from ...base.foreign import CallableInt
from ...errors import OperatorError
from ...base.validate import dims_expected
from ...runtime.dtensor import DTensor
from ...runtime.dtensor_methods import _reduce_args, install_operators
from .einsum import einsum
from .joins import broadcast_to, concatenate, getitem, narrow, stack
from .local import reshape, transpose
from .matmul import matmul
from .masks import masked_fill
from .norms import log_softmax, softmax
from .elementwise import relu as _relu
from .pointwise import pointwise
from .ufuncs import astype, clip as _clip, pow as _pow, power as _power, round as _round, where
from .reduce import arg_reduce, prod as _prod, reduce, var as _var


def _numpy_matmul(a: Any, b: Any) -> Any:
    """numpy's ``a @ b`` (DTensor's operator, np.matmul, np.dot): a 1-d operand is a vector, its dim added for
    the product and dropped after (``v @ v``, ``x @ v``, ``v @ x``), by ops.einsum; else ops.matmul."""
    na, nb = len(getattr(a, "global_shape", "ab")), len(getattr(b, "global_shape", "ab"))
    if 1 in (na, nb) and 0 not in (na, nb):
        return einsum("i,i->" if na == nb == 1 else "j,...jk->...k" if na == 1 else "...ij,j->...i", a, b)
    return matmul(a, b)


def _dims(x: Any, dim: Any, extra: int = 0) -> int:
    """`dim` of `x` (counted from the end when negative; `extra` more dims allowed, as unsqueeze's)."""
    ndim = len(x.global_shape) + extra
    if type(dim) is not int or not -ndim <= dim < max(ndim, 1):
        raise OperatorError(f"dim {dim!r} is out of range for a tensor of {ndim - extra} dims "
                            + dims_expected(ndim))
    return dim % max(ndim, 1)


def _size(x: Any, dim: Any = None) -> Any:
    """PyTorch's ``x.size()``: the global shape, or one dim's size."""
    if dim is None:
        return tuple(x.global_shape)
    d = _dims(x, dim)
    if not x.global_shape:  # _dims lets dim 0 of a 0-d tensor through (flatten's, squeeze's): it has no size
        raise OperatorError(f"dim {dim!r} is out of range for a tensor of 0 dims " + dims_expected(0))
    return x.global_shape[d]


def _size_of(x: Any) -> CallableInt:
    """``x.size``: numpy's attribute, the global number of elements (an int: ``x.size == 24``, ``x.sum() / x.size``),
    that PyTorch's ``x.size()`` and ``x.size(dim)`` call for the global shape or one dim's size. A bound method in
    its place would compare unequal to every number, silently (``x.size == 24`` False)."""
    return CallableInt(math.prod(x.global_shape), partial(_size, x))


def _unsqueeze(x: Any, dim: int) -> Any:
    """A new dim of size 1 at `dim` (PyTorch's unsqueeze): a reshape."""
    d, shape = _dims(x, dim, 1), tuple(x.global_shape)
    return reshape(x, shape[:d] + (1,) + shape[d:])


def _squeeze(x: Any, dim: Any = None) -> Any:
    """Dims of size 1 removed (all, or `dim` when it is 1), as PyTorch's squeeze: a reshape."""
    shape = tuple(x.global_shape)
    drop = {i for i, n in enumerate(shape) if n == 1} if dim is None else {_dims(x, dim)} & {
        i for i, n in enumerate(shape) if n == 1}
    return reshape(x, tuple(n for i, n in enumerate(shape) if i not in drop)) if drop else x


def _flatten(x: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    """Dims `start_dim` to `end_dim` merged into one (PyTorch's flatten): a reshape."""
    shape = tuple(x.global_shape)
    if not shape:
        return reshape(x, (1,))
    a, b = _dims(x, start_dim), _dims(x, end_dim)
    if a > b:
        raise OperatorError(f"flatten: start_dim {start_dim!r} comes after end_dim {end_dim!r}")
    return reshape(x, shape[:a] + (math.prod(shape[a:b + 1]),) + shape[b + 1:])


def _split(x: Any, split_size_or_sections: Any, dim: int = 0) -> tuple:
    """PyTorch's ``x.split(size, dim)`` (pieces of `size`, the last smaller) or ``x.split([a, b], dim)``: narrows.

    spmdsim.nn.ops.split is Paddle's distributed split layer, not this."""
    d = _dims(x, dim)
    total = x.global_shape[d]
    sizes = split_size_or_sections
    if type(sizes) is int and sizes > 0:
        sizes = [min(sizes, total - start) for start in range(0, total, sizes)] or [0]
    elif not isinstance(sizes, (list, tuple)) or any(type(n) is not int or n < 0 for n in sizes) or sum(sizes) != total:
        raise OperatorError(f"split: {split_size_or_sections!r} must be a positive size or sizes adding up to "
                            f"dim {d}'s {total}")
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    return tuple(narrow(x, d, start, n) for start, n in zip(starts, sizes))


def _detach(x: Any) -> Any:
    """The same block, outside the graph (PyTorch's detach: no gradient flows back through it)."""
    return type(x)._trusted(x.mesh, x.local, x.layout, tuple(x.global_shape))


#: numpy's ufuncs a DTensor answers, by spmdsim.nn.ops.pointwise's names (matmul: spmdsim.nn.ops.matmul).
_UFUNCS = {np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "div", np.power: "pow",
           np.floor_divide: "floordiv", np.remainder: "mod", np.rint: "rint", np.floor: "floor", np.ceil: "ceil",
           np.sign: "sign", np.log1p: "log1p", np.expm1: "expm1", np.bitwise_and: "and", np.bitwise_or: "or",
           np.bitwise_xor: "xor", np.invert: "invert", np.logical_and: "logical_and", np.logical_or: "logical_or",
           np.logical_xor: "logical_xor", np.logical_not: "logical_not", np.isnan: "isnan", np.isinf: "isinf",
           np.isfinite: "isfinite",
           np.negative: "neg", np.absolute: "abs", np.exp: "exp", np.log: "log", np.sqrt: "sqrt", np.tanh: "tanh",
           np.sin: "sin", np.cos: "cos", np.square: "square", np.maximum: "maximum", np.minimum: "minimum",
           np.equal: "eq", np.not_equal: "ne", np.less: "lt", np.less_equal: "le", np.greater: "gt",
           np.greater_equal: "ge", np.matmul: "matmul"}


def _array_ufunc(x: Any, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
    """numpy's ufuncs on DTensors by spmdsim's rules: ``np.exp(x)``, ``np.maximum(x, 0.0)``,
    ``np.float64(2) * x``; one line for a ufunc without a rule, a reduction, or ``out=``."""
    name = _UFUNCS.get(ufunc)
    if name is None or method != "__call__" or kwargs:
        what = ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}"
        why = (f"its {', '.join(sorted(kwargs))} argument" if name and method == "__call__"
               else "spmdsim has no rule for it")
        raise OperatorError(f"numpy.{what} of a DTensor: {why}; use spmdsim.nn.ops (ops.sum, ops.exp, ops.where, ...) "
                            "or the block x.local")
    return _numpy_matmul(*inputs) if name == "matmul" else _pow(*inputs) if name == "pow" else pointwise(name, *inputs)


def _kept(func: Any, kwargs: dict, **defaults: Any) -> None:
    """Refuse (one line) a numpy keyword a DTensor's function does not take at other than its default."""
    for name, value in kwargs.items():
        if name not in defaults or (value is not defaults[name] and value != defaults[name]):
            raise OperatorError(f"numpy.{func.__name__} of a DTensor: its {name}={value!r} is not taken; spmdsim's "
                                "operators (spmdsim.nn.ops) take the operands, dims and keepdims")


def _numpy_reduction(op: str, positional: tuple = ("dtype", "out")) -> Callable:
    """np.sum(x, axis=1) and its kin (np.any, np.all: `positional` ("out",)): the method's, its keywords checked
    there."""
    def reduction(a: Any, axis: Any = None, *args: Any, keepdims: bool = False, **kwargs: Any) -> Any:
        for name, value in zip(positional, args):
            kwargs[name] = value
        return getattr(a, op)(axis, keepdims, **kwargs)
    return reduction


def _numpy_spread(op: str) -> Callable:  # np.var, np.std
    def spread(a: Any, axis: Any = None, dtype: Any = None, out: Any = None, ddof: int = 0, keepdims: bool = False,
               **kwargs: Any) -> Any:
        _kept(getattr(np, op), dict(kwargs, dtype=dtype, out=out), dtype=None, out=None, where=True)
        return getattr(a, op)(axis, ddof, keepdims)
    return spread


def _like(value: Any) -> Callable:
    """np.zeros_like and np.ones_like (`value` 0, 1), np.full_like (None: its fill_value)."""
    def like(a: Any, *args: Any, **kwargs: Any) -> Any:
        fill = value
        if value is None:
            fill, args = (args[0], args[1:]) if args else (kwargs.pop("fill_value"), args)
        dtype = args[0] if args else kwargs.pop("dtype", None)
        _kept(np.zeros_like, kwargs, order="K", subok=True, shape=None, device=None)
        return DTensor.full(a.mesh, a.layout.with_partial(()) if a.layout.partial else a.layout, a.global_shape,
                            fill, a.dtype if dtype is None else dtype)
    return like


def _numpy_functions() -> dict:
    """numpy's functions a DTensor answers (its __array_function__), by spmdsim's operators."""
    return {
        np.where: lambda c, x, y: where(c, x, y),
        np.concatenate: lambda xs, axis=0, **k: _kept(np.concatenate, k, out=None, dtype=None, casting="same_kind")
        or concatenate(list(xs), axis),
        np.stack: lambda xs, axis=0, **k: _kept(np.stack, k, out=None, dtype=None, casting="same_kind")
        or stack(list(xs), axis),
        np.clip: lambda a, a_min=None, a_max=None, **k: _kept(np.clip, k, out=None) or _clip(a, a_min, a_max),
        np.dot: lambda a, b, out=None: _numpy_matmul(a, b) if out is None else _no_out("numpy.dot"),
        np.einsum: lambda spec, *xs, **k: _kept(np.einsum, k, out=None, optimize=False) or einsum(spec, *xs),
        np.transpose: lambda a, axes=None: transpose(a, axes),
        np.reshape: lambda a, *args, **k: reshape(a, args[0] if args else k.get("shape", k.get("newshape"))),
        np.swapaxes: _swapaxes, np.squeeze: lambda a, axis=None: _squeeze(a, axis),
        np.expand_dims: lambda a, axis: _unsqueeze(a, axis),
        np.sum: _numpy_reduction("sum"), np.mean: _numpy_reduction("mean"), np.max: _numpy_reduction("max"),
        np.min: _numpy_reduction("min"), np.amax: _numpy_reduction("max"), np.amin: _numpy_reduction("min"),
        np.any: _numpy_reduction("any", ("out",)), np.all: _numpy_reduction("all", ("out",)),
        np.var: _numpy_spread("var"), np.std: _numpy_spread("std"), np.prod: _numpy_reduction("prod"),
        np.ravel: lambda a, order="C": _ravel(a, order),
        np.argmax: lambda a, axis=None, out=None, keepdims=False: a.argmax(axis, keepdims) if out is None
        else _no_out("numpy.argmax"),
        np.argmin: lambda a, axis=None, out=None, keepdims=False: a.argmin(axis, keepdims) if out is None
        else _no_out("numpy.argmin"),
        np.round: lambda a, decimals=0, out=None: _round(a, decimals) if out is None else _no_out("numpy.round"),
        np.around: lambda a, decimals=0, out=None: _round(a, decimals) if out is None else _no_out("numpy.around"),
        np.copy: lambda a, order="K", subok=False: _copy(a),
        np.shape: lambda a: tuple(a.global_shape), np.ndim: lambda a: len(a.global_shape),
        np.size: lambda a, axis=None: math.prod(a.global_shape) if axis is None else a.global_shape[axis],
        np.zeros_like: _like(0), np.ones_like: _like(1), np.full_like: _like(None),
        np.linalg.norm: lambda x, ord=None, axis=None, keepdims=False: _norm(x, ord, axis, keepdims),
        np.broadcast_to: lambda x, shape, subok=False: _expand(x, tuple(shape)),
    }


_FUNCTIONS: dict = {}


def _array_function(x: Any, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
    """numpy's functions on DTensors by spmdsim's operators (``np.where(mask, x, 0.0)``, ``np.concatenate``,
    ``np.clip``, ``np.sum(x, axis=1)``, ``np.zeros_like(x)``, ...); one line for a function without a rule."""
    if not _FUNCTIONS:
        _FUNCTIONS.update(_numpy_functions())
    handler = _FUNCTIONS.get(func)
    if handler is None:
        raise OperatorError(f"numpy.{func.__name__} of a DTensor: spmdsim has no rule for it; use spmdsim.nn.ops "
                            "(ops.where, ops.concatenate, ops.sum, ...), or the whole array x.gather gives every "
                            "rank (a collective: every rank calls it)")
    return handler(*args, **kwargs)


def _array(x: Any, dtype: Any = None, copy: Any = None) -> Any:
    raise OperatorError(f"numpy array of a DTensor of global shape {tuple(x.global_shape)!r}: its values are spread "
                        "over the ranks; x.gather() makes the whole array on every rank (a collective: every rank "
                        "calls it), x.local is this rank's block")


def _whole(what: str) -> Any:
    """A method that would need the whole tensor on one rank (PyTorch's ``x.numpy()``, numpy's ``x.tolist()``):
    refused in one line naming gather()."""
    def refuse(x: Any, *args: Any, **kwargs: Any) -> Any:
        raise OperatorError(f"x.{what}() of a DTensor of global shape {tuple(x.global_shape)!r}: its values are "
                            f"spread over the ranks; {what}() the whole array x.gather gives every rank (a "
                            "collective: every rank calls it), or x.local, this rank's block")
    return refuse


def _reduce(op: str, x: Any, dims: Any = None, keepdims: bool = False, **aliases: Any) -> Any:
    """numpy's ``x.any()`` and ``x.all()`` (a bool DTensor's max and min, over no entries False and True:
    spmdsim.nn.ops.reduce takes them as uint8), with its and PyTorch's keywords."""
    return reduce(op, x, *_reduce_args(op, dims, keepdims, aliases))


def _product(x: Any, dims: Any = None, keepdims: bool = False, **aliases: Any) -> Any:
    """numpy's ``x.prod(axis=...)`` (`spmdsim.nn.ops.reduce.prod`), with its and PyTorch's keywords."""
    return _prod(x, *_reduce_args("prod", dims, keepdims, aliases))


def _ravel(x: Any, order: str = "C") -> Any:
    """numpy's ``x.ravel()``: ``x.reshape(-1)`` (refused where a rank's block would not stay a block of the one
    dim, as reshape is: redistribute the named dims whole first), its gradient reshaped back."""
    if order not in ("C", "A", "K"):
        raise OperatorError(f"ravel: order {order!r} is not taken; a DTensor is read in C order ('C'): for "
                            "Fortran's, x.T.ravel() of a 2-d tensor")
    try:
        return reshape(x, (-1,))
    except OperatorError as e:
        raise OperatorError(f"ravel: {e}") from None


def _norm(x: Any, ord: Any = None, dims: Any = None, keepdims: bool = False) -> Any:
    """The 2-norm (Frobenius over every dim when `dims` is None): sqrt of the sum of squares, numpy's
    ``np.linalg.norm(x, axis=...)`` and PyTorch's ``x.norm(dim=...)``; other orders one line."""
    if ord not in (None, 2, "fro") or (ord == 2 and dims is None and len(x.global_shape) > 1):
        raise OperatorError(f"norm of a DTensor: ord {ord!r} is not taken (the 2-norm of a vector, the Frobenius "
                            "norm of every element: ord None, 2 on one dim, or 'fro')")
    return pointwise("sqrt", reduce("sum", pointwise("square", x), dims, keepdims))


def _expand(x: Any, *sizes: Any) -> Any:
    """PyTorch's ``x.expand(*sizes)`` (-1: the dim as it is): ops.broadcast_to."""
    sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
    lead = len(sizes) - len(x.global_shape)
    shape = tuple(x.global_shape[i - lead] if n == -1 and i >= lead else n for i, n in enumerate(sizes))
    return broadcast_to(x, shape)


def _no_out(what: str) -> Any:
    raise OperatorError(f"{what} of a DTensor with out=: a DTensor's blocks are not written in place; use the result")


def _copy(x: Any, *args: Any, **kwargs: Any) -> Any:
    """A copy of x's blocks (PyTorch's ``clone()``, numpy's ``copy()``): the same layout, its gradient x's."""
    if args or kwargs:
        raise OperatorError("clone()/copy() of a DTensor takes no arguments (a memory format or order: its blocks "
                            "are C-ordered)")
    return pointwise("add", x, 0) if x.dtype.kind != "b" else pointwise("where", x, True, False)


def _positive(x: Any) -> Any:
    """numpy's ``+x``: a copy (its gradient x's); a bool's refused, as numpy has no positive of bools."""
    if x.dtype.kind == "b":
        raise OperatorError("+x of a bool DTensor: numpy has no positive of bools; use x itself, or x.astype('int64')")
    return _copy(x)


class _Unsized(OperatorError, TypeError):
    """len() of a 0-d DTensor: a TypeError too, as numpy's len() of a 0-d array is."""


def _len(x: Any) -> int:
    """The global size of dim 0, as numpy's and PyTorch's ``len``."""
    if not x.global_shape:
        raise _Unsized("len() of a 0-d DTensor: it has no dims (global shape ()), as numpy's 0-d array; x.size "
                       "counts its elements")
    return x.global_shape[0]


def _t(x: Any) -> Any:
    """PyTorch's ``x.t()``: a 2-d tensor transposed, a 0-d or 1-d one as it is."""
    if len(x.global_shape) > 2:
        raise OperatorError(f"t() of a tensor of {len(x.global_shape)} dims: PyTorch's t() takes at most 2; "
                            "use x.swapaxes(a, b) or x.permute(...)")
    return transpose(x, None) if len(x.global_shape) == 2 else x


def _swapaxes(x: Any, a: int, b: int) -> Any:
    """Dims `a` and `b` swapped (numpy's swapaxes, PyTorch's ``transpose(a, b)``)."""
    ndim = len(x.global_shape)
    for d in (a, b):
        if type(d) is not int or not -ndim <= d < ndim:
            raise OperatorError(f"swapaxes: dim {d!r} is out of range for a tensor of {ndim} dims "
                                + dims_expected(ndim))
    perm = list(range(ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, tuple(perm))


#: PyTorch's method spellings of spmdsim's operators (docs/tutorials/porting.md), and numpy's (x.T, x.swapaxes):
#: the functions behind DTensor's methods of these names (spmdsim.runtime.dtensor_methods._SPELLINGS; T and size
#: are properties there).
_METHODS = {
    "T": lambda x: transpose(x, None), "swapaxes": _swapaxes,
    "permute": lambda x, *perm: transpose(x, perm[0] if len(perm) == 1 else perm), "t": _t,
    "view": lambda x, *shape: reshape(x, shape[0] if len(shape) == 1 else shape),
    "size": _size_of, "numel": lambda x: math.prod(x.global_shape), "dim": lambda x: len(x.global_shape),
    "unsqueeze": _unsqueeze, "squeeze": _squeeze, "flatten": _flatten, "contiguous": lambda x: x,
    "detach": _detach, "split": _split, "softmax": lambda x, dim=-1: softmax(x, dim),
    "log_softmax": lambda x, dim=-1: log_softmax(x, dim), "masked_fill": masked_fill,
    "exp": lambda x: pointwise("exp", x), "log": lambda x: pointwise("log", x),
    "sqrt": lambda x: pointwise("sqrt", x), "tanh": lambda x: pointwise("tanh", x),
    # PyTorch's (and where numpy has one, numpy's) method spellings of more of spmdsim's operators
    "abs": lambda x: pointwise("abs", x), "square": lambda x: pointwise("square", x),
    "sigmoid": lambda x: pointwise("sigmoid", x), "pow": lambda x, exponent: _pow(x, exponent),
    "relu": lambda x: _relu(x), "clamp": lambda x, min=None, max=None: _clip(x, min, max),
    "clip": lambda x, min=None, max=None: _clip(x, min, max), "matmul": lambda x, other: matmul(x, other),
    "mm": lambda x, other: matmul(x, other), "clone": _copy, "copy": _copy,
    "numpy": _whole("numpy"), "tolist": _whole("tolist"),
    "round": lambda x, decimals=0, out=None: _round(x, decimals) if out is None else _no_out("round"),
    "floor": lambda x: pointwise("floor", x), "ceil": lambda x: pointwise("ceil", x),
    "sign": lambda x: pointwise("sign", x),
    "norm": lambda x, p="fro", dim=None, keepdim=False: _norm(x, None if p == "fro" else p, dim, keepdim),
    "expand": _expand,
    # x != 0, not x.astype(bool) (the same truth, NaN's too): a pending sum is added up first, where astype
    # refuses to cut it to bools ("the addends would be truncated one by one")
    "any": lambda x, *a, **k: _reduce("any", pointwise("ne", x, 0) if x.dtype.kind != "b" else x, *a, **k),
    "all": lambda x, *a, **k: _reduce("all", pointwise("ne", x, 0) if x.dtype.kind != "b" else x, *a, **k),
    "var": lambda x, axis=None, ddof=0, keepdims=False: _var(x, axis, keepdims, ddof),
    "prod": _product, "ravel": _ravel,
    "std": lambda x, axis=None, ddof=0, keepdims=False: pointwise("sqrt", _var(x, axis, keepdims, ddof)),
}


def bind_dtensor() -> None:
    """Fill the runtime's table that DTensor's operators, numpy protocol and spellings call (idempotent)."""
    install_operators(
        _METHODS, pointwise=pointwise, power=_power, matmul=_numpy_matmul, reduce=reduce, arg=arg_reduce,
        requires_grad_=requires_grad_, set_grad=set_grad, backward=backward, getitem=getitem, reshape=reshape,
        transpose=transpose, array_ufunc=_array_ufunc, array_function=_array_function, array=_array, len=_len,
        abs=lambda x: pointwise("abs", x), pos=_positive, round=lambda x, ndigits=None: _round(x, ndigits or 0),
        astype=astype)
