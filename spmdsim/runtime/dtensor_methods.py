"""DTensor's operators, reductions and autograd, and the table they call (filled by spmdsim.nn.ops.methods).

The runtime sits below the operators and autograd, which build DTensors, and imports neither: each method
here calls the function the table `_OPERATORS` holds for it, and PyTorch's and numpy's spellings
(`_SPELLINGS`) call the function `_METHODS` holds. DTensor (spmdsim.runtime.dtensor) takes them from
`_Methods`, a base class of its own.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, TypeVar

from ..base.foreign import ForeignAttribute
from ..errors import OperatorError
from .replay import local_of

#: The tensor a method is called on, whose kind the operators give back (spmdsim.runtime.dtensor.DTensor, which
#: takes these methods from this module).
_T = TypeVar("_T", bound="_Methods")


class _Operators:
    """What DTensor's operator methods call: the operators and autograd, which build DTensors.

    The runtime sits below them and imports neither; `spmdsim.nn.ops.methods.bind_dtensor` fills this
    table, called by spmdsim.nn.ops when it loads and by the front door (``from spmdsim import DTensor``)
    before it hands out a runtime name.
    """
    __slots__ = ("pointwise", "power", "matmul", "reduce", "arg", "requires_grad_", "set_grad", "backward", "getitem",
                 "reshape", "transpose", "array_ufunc", "array_function", "array", "len", "abs", "pos", "round",
                 "astype")

    def __getattr__(self, name: str) -> Any:  # a slot not filled yet
        raise OperatorError(f"DTensor's operators and autograd come with spmdsim.nn.ops, which is not loaded: "
                            f"import spmdsim.nn.ops (or take DTensor from spmdsim) before using {name}")


class _Spelled(dict):
    """name -> the function behind DTensor's method (or property) of that name in `_SPELLINGS`."""

    def __missing__(self, name: str) -> Any:
        return getattr(_OPERATORS, name)  # the one line saying where the operators come from


_OPERATORS = _Operators()
_METHODS = _Spelled()

#: PyTorch's and numpy's method spellings of spmdsim's operators (docs/tutorials/porting.md): ``x.view(...)``,
#: ``x.softmax(-1)``, ``x.detach()``, ... DTensor's methods of these names call the function
#: spmdsim.nn.ops.methods gives each; those of `_PROPERTIES` are properties (``x.T``, ``x.size``).
_SPELLINGS = ("swapaxes", "permute", "t", "view", "numel", "dim", "unsqueeze", "squeeze", "flatten", "contiguous",
              "detach", "split", "softmax", "log_softmax", "masked_fill", "exp", "log", "sqrt", "tanh", "abs",
              "square", "sigmoid", "pow", "relu", "clamp", "clip", "matmul", "mm", "clone", "copy", "numpy",
              "tolist", "round", "floor", "ceil", "sign", "norm", "expand", "any", "all", "var", "prod", "std",
              "ravel")
_PROPERTIES = ("T", "size")


def install_operators(methods: dict[str, Any] | None = None, **functions: Callable[..., Any]) -> None:
    """Fill the table DTensor's methods call, and the functions behind its spellings (`methods`)."""
    for name, function in functions.items():
        setattr(_OPERATORS, name, function)
    if methods:
        unknown = set(methods) - set(_SPELLINGS + _PROPERTIES)
        if unknown:
            raise OperatorError(f"DTensor has no method spelled {sorted(unknown)!r} (expected one of _SPELLINGS)")
        _METHODS.update(methods)


def _spelling(name: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _METHODS[name](self, *args, **kwargs)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"PyTorch's (or numpy's) ``x.{name}(...)``: spmdsim.nn.ops.methods gives what it does."
    return method


class _Immutable(OperatorError, TypeError):
    """``x[i] = v``: a TypeError too, as Python's for an object without item assignment."""


#: Other frameworks' names for what a DTensor has (docs/tutorials/porting.md): name -> (whose, spmdsim's). A
#: program ported as it was written meets them first; each is a ForeignAttribute of DTensor's (spmdsim.base.foreign),
#: naming spmdsim's in one line.
_FOREIGN = {
    "to_local()": ("PyTorch DTensor's and OneFlow's", "x.local, this rank's block, a numpy array"),
    "full_tensor()": ("PyTorch DTensor's", "x.gather(), the whole tensor on every rank, a collective every rank "
                                           "calls"),
    "device_mesh": ("PyTorch DTensor's", "x.mesh, whose device matrix is x.mesh.layout"),
    "float()": ("PyTorch's", "x.astype('float32') (numpy's astype: any dtype by name)"),
    "double()": ("PyTorch's", "x.astype('float64')"),
    "half()": ("PyTorch's", "x.astype('float16')"),
    "long()": ("PyTorch's", "x.astype('int64')"),
    "int()": ("PyTorch's", "x.astype('int32')"),
    "to()": ("PyTorch's", "x.astype(dtype) for a dtype; for a device, x itself (its blocks are numpy arrays)"),
    "cuda()": ("PyTorch's", "x itself: its blocks are numpy arrays in this process's memory; drop the call"),
    "cpu()": ("PyTorch's", "x itself: its blocks are numpy arrays in this process's memory; drop the call"),
    "addressable_shards": ("JAX's", "x.local, this rank's block, and x.slices, where it lies in the tensor"),
    "addressable_data()": ("JAX's", "x.local, this rank's block"),
    "sharding": ("JAX's", "x.layout, as a PartitionSpec x.partition_spec"),
    "sbp": ("OneFlow's", "x.layout, as SBP spmdsim.layouts.dialects.layout_to_sbp(x.layout)"),
    "placement": ("OneFlow's", "x.mesh"),
    "to_global()": ("OneFlow's", "x.redistribute(layout), or DTensor.from_local(mesh, block, layout) from a block"),
    "process_mesh": ("Paddle's", "x.mesh"),
    "_local_value()": ("Paddle's", "x.local, this rank's block"),
    "dist_attr": ("Paddle's", "x.layout"),
}
_FOREIGN_BY_NAME = {spelled.rstrip("()"): (spelled, *said) for spelled, said in _FOREIGN.items()}


#: The base class that holds DTensor's spellings: methods that look up their function when called, so a
#: DTensor finds them on its class whether or not spmdsim.nn.ops has loaded yet; and other frameworks' names.
_Spellings = type("_Spellings", (), {
    "__slots__": (), "__module__": __name__,
    **{name: ForeignAttribute("x", *said) for name, said in _FOREIGN_BY_NAME.items()},
    **{name: _spelling(name) for name in _SPELLINGS},
    **{name: property(lambda self, name=name: _METHODS[name](self)) for name in _PROPERTIES}})


def _grad(tensor: Any) -> Any:
    """``tensor.grad``: a leaf's gradient (or None); None with PyTorch's warning for an operator's output."""
    node = tensor._ag
    grad = getattr(node, "grad", _NOT_A_LEAF)
    if grad is not _NOT_A_LEAF:
        return grad
    if node is not None:  # a Node (spmdsim.nn.autograd.graph): backward never fills its .grad
        warnings.warn(f".grad of a DTensor of global shape {tuple(tensor.global_shape)!r}{_made_by(node)} is None: "
                      "backward fills the .grad of leaves only (tensors given requires_grad_()) and refuses "
                      f"retain_grad() of another; {_AS_LEAF}", UserWarning, stacklevel=3)
    return None


_NOT_A_LEAF = object()
#: How to read the gradient of an operator's output (`.grad` and `retain_grad()` say it).
_AS_LEAF = ("to read this gradient, make the tensor a leaf where it is made, t = t.detach().requires_grad_(), "
            "before the ops that read it")


def _made_by(node: Any) -> str:
    """" made by 'matmul'": the operator of an autograd node, its description before the colon ("" if none)."""
    describe = getattr(node, "describe", None)
    return f" made by {describe().split(':')[0]!r}" if describe is not None else ""


class _Methods(_Spellings):
    """DTensor's operator methods (``x + y``, ``x @ w``, ``x.sum()``, ``backward``, ...): each calls `_OPERATORS`."""

    __slots__ = ()

    # -- autograd and operators: spmdsim.nn.ops.methods.bind_dtensor fills `_OPERATORS` ----------
    def requires_grad_(self: _T, requires_grad: bool = True) -> _T:
        """Ask for ``.grad`` after ``loss.backward()`` (floating tensors only); returns self."""
        return _OPERATORS.requires_grad_(self, requires_grad)

    requires_grad = property(lambda self: self._ag is not None,
                             lambda self, flag: _OPERATORS.requires_grad_(self, flag, "requires_grad = "),
                             doc="whether gradients are recorded for it; ``x.requires_grad = True`` is "
                                 "``x.requires_grad_()``")
    grad = property(lambda self: _grad(self), lambda self, value: _OPERATORS.set_grad(self, value),
                    doc="the gradient, in this layout; ``p.grad = None`` forgets it (a DTensor of the "
                        "parameter's global shape and layout sets it)")

    def backward(self: _T, gradient: _T | None = None, explain: list | None = None,
                 bucket: bool | int = False, keep_pending: Any = (), *, retain_graph: Any = None,
                 create_graph: Any = False, reduce_with: Any = None, **foreign: Any) -> None:
        """Gradients of this scalar loss into every leaf's ``.grad`` (collective; see autograd.backward).

        `gradient`: the upstream gradient of a non-scalar tensor (a DTensor of its global shape, any
        layout). ``bucket=True``: gradients summed over the same axes share one Allreduce; an int caps
        a bucket's bytes. `keep_pending`: leaves whose gradients stay pending sums, accumulated, for
        spmdsim.nn.autograd.reduce_grads (gradient accumulation). PyTorch's `retain_graph` and
        `create_graph` are refused when true (the walk frees the graph; no gradient of a gradient), its
        `inputs` when given (every leaf's ``.grad`` is filled). `reduce_with`: spmdsim.nn.autograd.backward's (a
        ZeRO optimizer or gradient buffer the walk puts each gradient into).
        """
        _OPERATORS.backward(self, explain, bucket, gradient, keep_pending, retain_graph, create_graph, reduce_with,
                            **foreign)

    def retain_grad(self) -> None:
        """PyTorch's: nothing to do for a leaf (its ``.grad`` is filled anyway); refused in one line for an operator's
        output or a tensor that records no gradient (backward fills the ``.grad`` of leaves only)."""
        node = self._ag
        if hasattr(node, "grad"):  # a Leaf
            return
        how = f"backward fills the .grad of leaves only; {_AS_LEAF}" if node is not None else \
            "it records no gradient (requires_grad is False); t.requires_grad_() makes it a leaf whose .grad is filled"
        raise OperatorError(f"retain_grad() of a DTensor of global shape {tuple(self.global_shape)!r}"
                            f"{_made_by(node)}: spmdsim does not do this; {how}")

    # arithmetic (spmdsim.nn.ops.pointwise: broadcasting; a number is a replicated 0-d operand). numpy's ufuncs
    # (np.exp(x), np.float64(2) * x), np.asarray's refusal, abs(), len(), .T and PyTorch's spellings of the
    # operators are given by spmdsim.nn.ops.methods.
    def __add__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("add", self, other)

    def __radd__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("add", other, self)

    def __sub__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("sub", self, other)

    def __rsub__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("sub", other, self)

    def __mul__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("mul", self, other)

    def __rmul__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("mul", other, self)

    def __truediv__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("div", self, other)

    def __rtruediv__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("div", other, self)

    def __floordiv__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("floordiv", self, other)

    def __rfloordiv__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("floordiv", other, self)

    def __mod__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("mod", self, other)

    def __rmod__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("mod", other, self)

    # Bitwise (on bool DTensors: and, or, exclusive or, not; masks), as numpy's: no gradient.
    def __and__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("and", self, other)

    def __rand__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("and", other, self)

    def __or__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("or", self, other)

    def __ror__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("or", other, self)

    def __xor__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("xor", self, other)

    def __rxor__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("xor", other, self)

    def __invert__(self: _T) -> _T:
        return _OPERATORS.pointwise("invert", self)

    def __pow__(self: _T, other: Any) -> _T:
        """numpy's ``x ** y`` (spmdsim.nn.ops.ufuncs.power: ``mask ** 2`` is numpy's int8, as np.square's)."""
        return _OPERATORS.power(self, other)

    def __rpow__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("pow", other, self)

    def __neg__(self: _T) -> _T:
        return _OPERATORS.pointwise("neg", self)

    def __matmul__(self: _T, other: Any) -> _T:
        return _OPERATORS.matmul(self, other)

    # Comparisons give bool DTensors (no gradient), e.g. a padding mask; == and != too, as PyTorch's and numpy's
    # (`pred == labels`). Hashing stays by identity: a DTensor is still a dict key or a set member.
    def __eq__(self: _T, other: Any) -> _T:  # type: ignore[override]
        return _OPERATORS.pointwise("eq", self, other)

    def __ne__(self: _T, other: Any) -> _T:  # type: ignore[override]
        return _OPERATORS.pointwise("ne", self, other)

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        """The truth of a one-element tensor (``if (x == y):``, a loop's test); ambiguous for more, as numpy's."""
        if math.prod(self._shape) != 1:
            raise OperatorError(f"the truth value of a DTensor of global shape {self._shape!r} is ambiguous; "
                                "reduce it to one element first (ops.max, ops.min, ops.sum) or compare gather()")
        if self._layout.partial:
            raise OperatorError(f"the truth value of a pending sum over {self._layout.partial!r}: add it up first "
                                "on every rank (a collective): ops.resolved(x)")
        return bool(local_of(self).reshape(()))

    def __lt__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("lt", self, other)

    def __le__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("le", self, other)

    def __gt__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("gt", self, other)

    def __ge__(self: _T, other: Any) -> _T:
        return _OPERATORS.pointwise("ge", self, other)

    # numpy's protocol and Python's, looked up on the class: np.exp(x), np.where(x > 0, x, 0), abs(x), len(x)
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _OPERATORS.array_ufunc(self, ufunc, method, *inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        return _OPERATORS.array_function(self, func, types, args, kwargs)

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        return _OPERATORS.array(self, dtype, copy)

    def __len__(self) -> int:
        return _OPERATORS.len(self)

    def __abs__(self: _T) -> _T:
        return _OPERATORS.abs(self)

    def __pos__(self: _T) -> _T:
        return _OPERATORS.pos(self)

    def __round__(self: _T, ndigits: Any = None) -> _T:
        return _OPERATORS.round(self, ndigits)

    def __getitem__(self: _T, index: Any) -> _T:
        """``x[..., a:b]``: ints, step-1 slices, ``...`` and None (`spmdsim.nn.ops.narrow` on each cut dim; a
        split one moves the rows each rank's new block lacks)."""
        return _OPERATORS.getitem(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        raise _Immutable(f"x[{index!r}] = {type(value).__name__}: a DTensor is not assigned in place; make a new "
                         "one: x.masked_fill(mask, value) or ops.where(mask, value, x) with a bool DTensor mask, or "
                         "ops.concatenate of the pieces")

    def reshape(self: _T, *shape: Any) -> _T:
        """`spmdsim.nn.ops.reshape`: ``x.reshape(T, H, D)`` or ``x.reshape((T, H, D))``; no communication."""
        return _OPERATORS.reshape(self, shape[0] if len(shape) == 1 else shape)

    def transpose(self: _T, *perm: Any) -> _T:
        """`spmdsim.nn.ops.transpose` as numpy's: ``x.transpose(1, 0)``, ``x.transpose((1, 0))`` or all dims
        reversed; the arguments are the new order of every dim (PyTorch's two dims to swap: `swapaxes`).

        ``x.transpose(0, 1)`` of a 2-d tensor, which numpy keeps as it is and PyTorch swaps, is refused."""
        if len(self._shape) == 2 and perm in ((0, 1), (-2, -1)):
            raise OperatorError(f"x.transpose{perm!r} of a 2-d DTensor: numpy keeps it as it is, PyTorch swaps the "
                                "two dims; write x.T (or x.swapaxes(0, 1), x.t()) to swap them, nothing to keep them")
        return _OPERATORS.transpose(self, (perm[0] if len(perm) == 1 else perm) if perm else None)

    def sum(self: _T, dims: Any = None, keepdims: bool = False, **aliases: Any) -> _T:
        """`spmdsim.nn.ops.sum`: over a split dim, a pending sum. numpy's ``axis=`` and PyTorch's ``dim=``,
        ``keepdim=`` are taken too (so ``np.sum(x, axis=1)`` works)."""
        return _OPERATORS.reduce("sum", self, *_reduce_args("sum", dims, keepdims, aliases))

    def mean(self: _T, dims: Any = None, keepdims: bool = False, **aliases: Any) -> _T:
        """`spmdsim.nn.ops.mean`: over a split dim, a pending sum (``axis=``, ``dim=``, ``keepdim=`` too)."""
        return _OPERATORS.reduce("mean", self, *_reduce_args("mean", dims, keepdims, aliases))

    def max(self: _T, dims: Any = None, keepdims: bool = False, **aliases: Any) -> _T:
        """`spmdsim.nn.ops.max`: over a split dim, one Allreduce(MAX) (``axis=``, ``dim=``, ``keepdim=`` too)."""
        return _OPERATORS.reduce("max", self, *_reduce_args("max", dims, keepdims, aliases))

    def min(self: _T, dims: Any = None, keepdims: bool = False, **aliases: Any) -> _T:
        """`spmdsim.nn.ops.min`: over a split dim, one Allreduce(MIN) (``axis=``, ``dim=``, ``keepdim=`` too)."""
        return _OPERATORS.reduce("min", self, *_reduce_args("min", dims, keepdims, aliases))

    def argmax(self: _T, dim: Any = None, keepdims: bool = False) -> _T:
        """`spmdsim.nn.ops.argmax`: int64 indices, the first on ties; over a split dim two Allreduces."""
        return _OPERATORS.arg("argmax", self, dim, keepdims)

    def argmin(self: _T, dim: Any = None, keepdims: bool = False) -> _T:
        """`spmdsim.nn.ops.argmin`: int64 indices, the first on ties; over a split dim two Allreduces."""
        return _OPERATORS.arg("argmin", self, dim, keepdims)


def _reduce_args(op: str, dims: Any, keepdims: bool, aliases: dict) -> tuple[Any, bool]:
    """(dims, keepdims) of a reduction method called with numpy's or PyTorch's keywords: ``axis=`` or
    ``dim=`` for the dims, ``keepdim=`` for keepdims; numpy's ``dtype=None`` and ``out=None`` pass."""
    for name in ("axis", "dim"):
        if name in aliases:
            if dims is not None:
                raise OperatorError(f"{op}: dims given twice (dims {dims!r} and {name}={aliases[name]!r})")
            dims = aliases.pop(name)
    if "keepdim" in aliases:
        keepdims = aliases.pop("keepdim")
    taken = [f"{k}={v!r}" for k, v in aliases.items() if v is not None or k not in ("dtype", "out")]
    if taken:
        raise OperatorError(f"{op}: {', '.join(taken)} is not taken; a DTensor reduction takes dims (axis=, dim=) "
                            "and keepdims (keepdim=)")
    return dims, keepdims
