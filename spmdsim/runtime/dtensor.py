"""DTensor: this rank's shard of a global tensor plus the TensorLayout that places it.

A partial layout means the global value is the sum over the partial axes of
the local values; when one is built from full data, the member with index 0
over the partial axes holds the value and the others hold zeros (B -> P).
"""
from __future__ import annotations

import math
from functools import lru_cache
from operator import attrgetter
from typing import Any, Callable, Sequence, Union

import numpy as np

from ..base import buffers
from ..layouts.datagen import SeededTensor
from ..errors import DTypeError, LayoutError, OperatorError, RankError, ShapeError
from ..layouts.layout import Layout, TensorLayout
from ..base.context import current as _context
from ..base.validate import as_int, counted, describe, dtype_arg, dtype_name, tolerance_arg
from . import debug, door
from .replay import local_of
from .check import Verdict, agree, default_tolerances, local_stats
from .mesh import Mesh
from .budget import check_seeded
from ..layouts.dialects.dtensor import placements_of
from ..layouts.dialects.partition_spec import layout_to_partition_spec
from .executor import redistribute, resolve

__all__ = ["DTensor"]

# Dtypes a shard may have without more checks: numeric, not bool, native byte
# order (a set lookup; the rest goes through _check_dtype).
_PLAIN_DTYPES = frozenset(np.dtype(c) for c in np.typecodes["AllInteger"] + np.typecodes["AllFloat"])

Reference = Union[SeededTensor, np.ndarray, Callable[[tuple], Any]]
_SEEDABLE = ("float32", "float64", "int32", "int64")  # SeededTensor's dtypes (full's size checks borrow it)


# typed, the sizes as separate arguments: (16.0, 8) and (True, 8) hash like (16, 8) and (1, 8) and must miss.
@lru_cache(maxsize=1024, typed=True)
def _checked_shapes(layout: TensorLayout, rank: int, *global_shape: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global shape as ints, `rank`'s shard shape), cached: deriving the shard shape of every
    operator's result was ~6 us of each call (a failed check raises and is not cached)."""
    shape = layout.check_shape(global_shape)
    return shape, layout.local_shape(shape, rank)


_new = object.__new__


class _Operators:
    """What DTensor's operator methods call: the operators and autograd, which build DTensors.

    The runtime sits below them and imports neither; `spmdsim.nn.ops.methods.bind_dtensor` fills this
    table, called by spmdsim.nn.ops when it loads and by the front door (``from spmdsim import DTensor``)
    before it hands out a runtime name.
    """
    __slots__ = ("pointwise", "power", "matmul", "reduce", "arg", "requires_grad_", "set_grad", "backward", "getitem",
                 "reshape", "transpose", "array_ufunc", "array_function", "array", "len", "abs", "pos", "round")

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


#: The base class that holds DTensor's spellings: methods that look up their function when called, so a
#: DTensor finds them on its class whether or not spmdsim.nn.ops has loaded yet.
_Spellings = type("_Spellings", (), {
    "__slots__": (), "__module__": __name__,
    **{name: _spelling(name) for name in _SPELLINGS},
    **{name: property(lambda self, name=name: _METHODS[name](self)) for name in _PROPERTIES}})


class DTensor(_Spellings):
    """``DTensor(mesh, local, layout, global_shape)``; treat it as an immutable value.

    Attributes: ``mesh``, ``local`` (this rank's shard), ``layout``,
    ``global_shape``, ``dtype``, ``partial`` and ``slices`` (this rank's region
    of the global tensor); ``placements`` and ``partition_spec`` (the layout in
    PyTorch's and JAX's words); ``requires_grad`` and ``grad`` (docs/howto/train.md).
    """

    # _ag: autograd's record (None, a Leaf or a Node; spmdsim.nn.autograd), None unless asked for.
    __slots__ = ("_mesh", "_local", "_layout", "_shape", "_ag")

    def __init__(self, mesh: Mesh, local: np.ndarray, layout: TensorLayout,
                 global_shape: Sequence[int]) -> None:
        _check_placement(mesh, layout)
        try:
            if type(global_shape) is not tuple:  # a string must not be unpacked into sizes
                raise TypeError
            shape, expected = _checked_shapes(layout, mesh.rank, *global_shape)
        except TypeError:  # a list or unhashable sizes: checked without the cache
            shape = layout.check_shape(global_shape)
            expected = layout.local_shape(shape, mesh.rank)
        local = np.asarray(local)
        if local.shape != expected:
            raise ShapeError(f"local shard shape {local.shape!r} does not match {expected!r}, the shard of "
                             f"global shape {shape!r} under {layout}")
        if local.dtype not in _PLAIN_DTYPES:
            _check_dtype(local.dtype, layout)
        self._mesh, self._local, self._layout, self._shape = mesh, local, layout, shape
        self._ag = None

    @classmethod
    def _trusted(cls, mesh: Mesh, local: np.ndarray, layout: TensorLayout,
                 global_shape: tuple[int, ...]) -> "DTensor":
        """No checks (~6 us less): for runtime code that checked `local` against `layout` itself (runtime.executor)."""
        self = _new(cls)  # object.__new__ read once: not looked up on the class each call (~430 a rank-step)
        self._mesh, self._local, self._layout, self._shape, self._ag = mesh, local, layout, global_shape, None
        return self

    def astype(self, dtype: Any) -> "DTensor":
        """This tensor with every shard converted to `dtype` (same layout; no communication).

        A pending sum may widen but not be cut to integers: the sum of truncated addends is not the truncated sum.
        """
        want = dtype_arg(dtype)
        if self._layout.partial and want.kind in "biu" and self._local.dtype.kind not in "biu":
            raise DTypeError(
                f"astype({want.name!r}) of a pending sum over {self._layout.partial!r} of dtype "
                f"{self._local.dtype.name!r}: the addends would be truncated one by one; "
                "resolve the sum first (redistribute to a layout without partial axes)")
        local = local_of(self)  # converted by the engine (a dry run's: zeros of the new dtype, no page written)
        block = self._mesh.engine.local(np.ndarray.astype, buffers.broadcast_zero(local.shape, want), local, want)
        return DTensor(self._mesh, block, self._layout, self._shape)

    # -- constructors ------------------------------------------------------------
    @classmethod
    def from_local(cls, mesh: Mesh, local: Any, layout: TensorLayout, global_shape: Sequence[int] | None = None,
                   dtype: Any = None) -> "DTensor":
        """Wrap an existing shard; its shape (and `dtype` when given) must match.

        `global_shape` None: each dim's block times the number of its shards (even shards, as PyTorch's
        ``DTensor.from_local`` assumes without ``shape=``). Each rank works it out from its own block, so
        blocks of different sizes give the ranks different global shapes and wrong results: pass
        `global_shape`, or run with SPMDSIM_CHECK=1, whose guard compares the shapes across the mesh here.
        """
        local = np.asarray(local)
        if dtype is not None:
            dtype = dtype_arg(dtype)
            if local.dtype != dtype:
                raise DTypeError(f"local shard dtype {local.dtype.name!r} does not match {dtype.name!r}")
        if global_shape is None:
            if not isinstance(layout, TensorLayout):
                raise LayoutError(_not_a_tensor_layout(layout))
            if local.ndim != layout.ndim:
                raise ShapeError(f"local shard of shape {local.shape!r} has {counted(local.ndim, 'dim')} but the "
                                 f"layout {layout} maps {layout.ndim}")
            if layout.layout.cut != "even" and layout.split_axes:
                # Shards may differ by rank: a size worked out from this rank's alone would differ too.
                raise ShapeError(f"from_local on a layout cut {layout.layout.cut!r} needs global_shape= "
                                 "(its shards may differ in size between ranks)")
            global_shape = tuple(n * layout.layout.group_size(entry) for n, entry in zip(local.shape,
                                                                                        layout.tensor_map))
            out = cls(mesh, local, layout, global_shape)
            if not debug.quiet():  # the guard: every rank's worked-out shape the same (one Allgather)
                debug.verify_operands(mesh, "from_local", (("the global shape from its block", out._shape,
                                                            layout, local.dtype),))
            return out
        return cls(mesh, local, layout, global_shape)

    @classmethod
    def from_seeded(cls, mesh: Mesh, layout: TensorLayout, seeded: SeededTensor) -> "DTensor":
        """Build only this rank's shard of a seeded global tensor."""
        _check_placement(mesh, layout)
        if not isinstance(seeded, SeededTensor):
            raise ShapeError(f"from_seeded needs a SeededTensor, got {type(seeded).__name__}"
                             f"{_shape_note(seeded)}; use DTensor.from_global for an array")
        shape = layout.check_shape(seeded.shape)
        check_seeded(mesh.comm, layout, seeded)  # before the shard exists, on every rank alike
        if _holds_value(mesh, layout):
            local = seeded.region(layout.slices(mesh.rank, shape))
        else:
            local = buffers.zeros(layout.local_shape(shape, mesh.rank), seeded.dtype)
        return cls(mesh, local, layout, shape)

    @classmethod
    def full(cls, mesh: Mesh, layout: TensorLayout, shape: Sequence[int], value: Any,
             dtype: Any = "float64") -> "DTensor":
        """A tensor of `shape` filled with `value`, each rank making only its block (PyTorch's
        ``torch.distributed.tensor.full``); a pending sum holds it on the first member, zeros on the others."""
        _check_placement(mesh, layout)
        kind = dtype_arg(dtype)
        name = dtype_name(kind)
        if isinstance(value, np.generic):
            value = value.item()
        if not isinstance(value, (int, float, bool)) or (kind.kind in "iub" and isinstance(value, float)
                                                         and value != int(value)):
            raise DTypeError(f"fill value {value!r} must be a number that dtype {name!r} holds")
        seeded = SeededTensor(tuple(shape), name if name in _SEEDABLE else "float64")
        shape = layout.check_shape(seeded.shape)
        check_seeded(mesh.comm, layout, seeded)  # the same limits as a generated tensor, on every rank alike
        local = buffers.zeros(layout.local_shape(shape, mesh.rank), kind)
        if value and _holds_value(mesh, layout):
            local[...] = value
        return cls(mesh, local, layout, shape)

    @classmethod
    def zeros(cls, mesh: Mesh, layout: TensorLayout, shape: Sequence[int], dtype: Any = "float64") -> "DTensor":
        """Zeros of `shape`, each rank making only its block (PyTorch's ``torch.distributed.tensor.zeros``)."""
        return cls.full(mesh, layout, shape, 0, dtype)

    @classmethod
    def ones(cls, mesh: Mesh, layout: TensorLayout, shape: Sequence[int], dtype: Any = "float64") -> "DTensor":
        """Ones of `shape`, each rank making only its block (PyTorch's ``torch.distributed.tensor.ones``)."""
        return cls.full(mesh, layout, shape, 1, dtype)

    @classmethod
    def from_global(cls, mesh: Mesh, array: Any, layout: TensorLayout) -> "DTensor":
        """Cut this rank's shard out of a global array every rank has (small demos)."""
        _check_placement(mesh, layout)
        array = np.asarray(array)
        dtype_arg(array.dtype, "array dtype")
        shape = layout.check_shape(array.shape)
        if _holds_value(mesh, layout):
            local = buffers.placed_copy(array[layout.slices(mesh.rank, shape)])
        else:
            local = buffers.zeros(layout.local_shape(shape, mesh.rank), array.dtype)
        return cls(mesh, local, layout, shape)

    # -- views (read-only; attrgetter: C, the operators and autograd read them often) --
    mesh = property(attrgetter("_mesh"))
    local = property(local_of, doc="this rank's block (seen as recorded while this thread captures a step: "
                                   "spmdsim.runtime.replay)")
    layout = property(attrgetter("_layout"))
    global_shape = property(attrgetter("_shape"))
    shape = property(attrgetter("_shape"), doc="the global shape (as PyTorch's DTensor), not this rank's block's")
    ndim = property(lambda self: len(self._shape), doc="the number of global dims")
    dtype = property(attrgetter("_local.dtype"))
    partial = property(attrgetter("_layout.partial"))

    @property
    def slices(self) -> tuple[slice, ...]:
        return self._layout.slices(self._mesh.rank, self._shape)

    @property
    def placements(self) -> tuple:
        """The layout as PyTorch DTensor placements, one per mesh axis (``(Shard(0), Replicate())``); refused
        (DialectError) where DTensor would cut this tensor's shape otherwise (a size that does not divide under
        the balanced cut, which DTensor does not have: docs/explanation/semantics.md, "Uneven shards")."""
        return placements_of(self._layout, self._shape)

    @property
    def partition_spec(self) -> tuple:
        """The layout as a JAX PartitionSpec tuple, one entry per dim (``("dp", None)``); none for a pending sum."""
        return layout_to_partition_spec(self._layout)

    def __repr__(self) -> str:
        return (f"DTensor(shape={self._shape!r}, layout={self._layout}, dtype={self.dtype.name}, "
                f"rank={self._mesh.rank}, local_shape={self._local.shape!r})")

    def redistribute(self, target: TensorLayout) -> "DTensor":
        """This tensor re-laid out as `target` by the least-communication plan (`spmdsim.redistribute`)."""
        return redistribute(self, target)

    def resolved_local(self, label: str | None = None) -> np.ndarray:
        """This rank's shard with pending partial sums added up (the local array if none)."""
        if not self._layout.partial:
            return local_of(self)
        return resolve(self._mesh, local_of(self), self._layout, label)

    # -- autograd and operators: spmdsim.nn.ops.methods.bind_dtensor fills `_OPERATORS` ----------
    def requires_grad_(self, requires_grad: bool = True) -> "DTensor":
        """Ask for ``.grad`` after ``loss.backward()`` (floating tensors only); returns self."""
        return _OPERATORS.requires_grad_(self, requires_grad)

    requires_grad = property(lambda self: self._ag is not None,
                             lambda self, flag: _OPERATORS.requires_grad_(self, flag, "requires_grad = "),
                             doc="whether gradients are recorded for it; ``x.requires_grad = True`` is "
                                 "``x.requires_grad_()``")
    grad = property(lambda self: getattr(self._ag, "grad", None), lambda self, value: _OPERATORS.set_grad(self, value),
                    doc="the gradient, in this layout; ``p.grad = None`` forgets it (a DTensor of the "
                        "parameter's global shape and layout sets it)")

    def backward(self, gradient: "DTensor | None" = None, explain: list | None = None,
                 bucket: bool | int = False, keep_pending: Any = (), *, retain_graph: Any = None,
                 create_graph: Any = False) -> None:
        """Gradients of this scalar loss into every leaf's ``.grad`` (collective; see autograd.backward).

        `gradient`: the upstream gradient of a non-scalar tensor (a DTensor of its global shape, any
        layout). ``bucket=True``: gradients summed over the same axes share one Allreduce; an int caps
        a bucket's bytes. `keep_pending`: leaves whose gradients stay pending sums, accumulated, for
        spmdsim.nn.autograd.reduce_grads (gradient accumulation). PyTorch's `retain_graph` and
        `create_graph` are refused when true (the walk frees the graph; no gradient of a gradient).
        """
        _OPERATORS.backward(self, explain, bucket, gradient, keep_pending, retain_graph, create_graph)

    # arithmetic (spmdsim.nn.ops.pointwise: broadcasting; a number is a replicated 0-d operand). numpy's ufuncs
    # (np.exp(x), np.float64(2) * x), np.asarray's refusal, abs(), len(), .T and PyTorch's spellings of the
    # operators are given by spmdsim.nn.ops.methods.
    def __add__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("add", self, other)

    def __radd__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("add", other, self)

    def __sub__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("sub", self, other)

    def __rsub__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("sub", other, self)

    def __mul__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("mul", self, other)

    def __rmul__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("mul", other, self)

    def __truediv__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("div", self, other)

    def __rtruediv__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("div", other, self)

    def __floordiv__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("floordiv", self, other)

    def __rfloordiv__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("floordiv", other, self)

    def __mod__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("mod", self, other)

    def __rmod__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("mod", other, self)

    # Bitwise (on bool DTensors: and, or, exclusive or, not; masks), as numpy's: no gradient.
    def __and__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("and", self, other)

    def __rand__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("and", other, self)

    def __or__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("or", self, other)

    def __ror__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("or", other, self)

    def __xor__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("xor", self, other)

    def __rxor__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("xor", other, self)

    def __invert__(self) -> "DTensor":
        return _OPERATORS.pointwise("invert", self)

    def __pow__(self, other: Any) -> "DTensor":
        """numpy's ``x ** y`` (spmdsim.nn.ops.ufuncs.power: ``mask ** 2`` is numpy's int8, as np.square's)."""
        return _OPERATORS.power(self, other)

    def __rpow__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("pow", other, self)

    def __neg__(self) -> "DTensor":
        return _OPERATORS.pointwise("neg", self)

    def __matmul__(self, other: Any) -> "DTensor":
        return _OPERATORS.matmul(self, other)

    # Comparisons give bool DTensors (no gradient), e.g. a padding mask; == and != too, as PyTorch's and numpy's
    # (`pred == labels`). Hashing stays by identity: a DTensor is still a dict key or a set member.
    def __eq__(self, other: Any) -> "DTensor":  # type: ignore[override]
        return _OPERATORS.pointwise("eq", self, other)

    def __ne__(self, other: Any) -> "DTensor":  # type: ignore[override]
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

    def __lt__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("lt", self, other)

    def __le__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("le", self, other)

    def __gt__(self, other: Any) -> "DTensor":
        return _OPERATORS.pointwise("gt", self, other)

    def __ge__(self, other: Any) -> "DTensor":
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

    def __abs__(self) -> "DTensor":
        return _OPERATORS.abs(self)

    def __pos__(self) -> "DTensor":
        return _OPERATORS.pos(self)

    def __round__(self, ndigits: Any = None) -> "DTensor":
        return _OPERATORS.round(self, ndigits)

    def __getitem__(self, index: Any) -> "DTensor":
        """``x[..., a:b]``: ints, step-1 slices, ``...`` and None (`spmdsim.nn.ops.narrow` on each cut dim; a
        split one moves the rows each rank's new block lacks)."""
        return _OPERATORS.getitem(self, index)

    def reshape(self, *shape: Any) -> "DTensor":
        """`spmdsim.nn.ops.reshape`: ``x.reshape(T, H, D)`` or ``x.reshape((T, H, D))``; no communication."""
        return _OPERATORS.reshape(self, shape[0] if len(shape) == 1 else shape)

    def transpose(self, *perm: Any) -> "DTensor":
        """`spmdsim.nn.ops.transpose` as numpy's: ``x.transpose(1, 0)``, ``x.transpose((1, 0))`` or all dims
        reversed; the arguments are the new order of every dim (PyTorch's two dims to swap: `swapaxes`).

        ``x.transpose(0, 1)`` of a 2-d tensor, which numpy keeps as it is and PyTorch swaps, is refused."""
        if len(self._shape) == 2 and perm in ((0, 1), (-2, -1)):
            raise OperatorError(f"x.transpose{perm!r} of a 2-d DTensor: numpy keeps it as it is, PyTorch swaps the "
                                "two dims; write x.T (or x.swapaxes(0, 1), x.t()) to swap them, nothing to keep them")
        return _OPERATORS.transpose(self, (perm[0] if len(perm) == 1 else perm) if perm else None)

    def sum(self, dims: Any = None, keepdims: bool = False, **aliases: Any) -> "DTensor":
        """`spmdsim.nn.ops.sum`: over a split dim, a pending sum. numpy's ``axis=`` and PyTorch's ``dim=``,
        ``keepdim=`` are taken too (so ``np.sum(x, axis=1)`` works)."""
        return _OPERATORS.reduce("sum", self, *_reduce_args("sum", dims, keepdims, aliases))

    def mean(self, dims: Any = None, keepdims: bool = False, **aliases: Any) -> "DTensor":
        """`spmdsim.nn.ops.mean`: over a split dim, a pending sum (``axis=``, ``dim=``, ``keepdim=`` too)."""
        return _OPERATORS.reduce("mean", self, *_reduce_args("mean", dims, keepdims, aliases))

    def max(self, dims: Any = None, keepdims: bool = False, **aliases: Any) -> "DTensor":
        """`spmdsim.nn.ops.max`: over a split dim, one Allreduce(MAX) (``axis=``, ``dim=``, ``keepdim=`` too)."""
        return _OPERATORS.reduce("max", self, *_reduce_args("max", dims, keepdims, aliases))

    def min(self, dims: Any = None, keepdims: bool = False, **aliases: Any) -> "DTensor":
        """`spmdsim.nn.ops.min`: over a split dim, one Allreduce(MIN) (``axis=``, ``dim=``, ``keepdim=`` too)."""
        return _OPERATORS.reduce("min", self, *_reduce_args("min", dims, keepdims, aliases))

    def argmax(self, dim: Any = None, keepdims: bool = False) -> "DTensor":
        """`spmdsim.nn.ops.argmax`: int64 indices, the first on ties; over a split dim two Allreduces."""
        return _OPERATORS.arg("argmax", self, dim, keepdims)

    def argmin(self, dim: Any = None, keepdims: bool = False) -> "DTensor":
        """`spmdsim.nn.ops.argmin`: int64 indices, the first on ties; over a split dim two Allreduces."""
        return _OPERATORS.arg("argmin", self, dim, keepdims)

    # -- whole-tensor views ------------------------------------------------------------
    def item(self) -> float | int | bool:
        """A 0-d tensor's value as a Python number (a loss); no communication, so any rank may call it.

        A pending sum is refused: adding it up is a collective every rank must enter
        (``ops.resolved(x).item()`` on every rank).
        """
        if self._shape != ():
            raise OperatorError(f"item() needs a 0-d DTensor (a scalar such as a loss), got global shape "
                                f"{self._shape!r}; gather() returns the whole tensor")
        if self._layout.partial:
            raise OperatorError(f"item(): the scalar is a pending sum over {self._layout.partial!r}; add it up "
                                "first on every rank (a collective): ops.resolved(x).item()")
        return local_of(self).item()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        """``int(x)`` of a 0-d tensor, as numpy's (a float truncated toward zero): `item`'s refusals otherwise."""
        return int(self.item())

    def gather(self, root: int | None = None) -> np.ndarray | None:
        """The global tensor on every rank (root=None) or on mesh rank `root` (None elsewhere)."""
        mesh = self._mesh
        if root is not None:
            # Checked on every rank before the first collective: a root that only
            # passed a range check (1.5) would send ranks down different paths.
            index = as_int(root)
            if index is None or not 0 <= index < mesh.size:
                raise RankError(f"gather root {root!r} is not a mesh rank (an integer with "
                                 f"0 <= root < {mesh.size})")
            root = index
        local = np.ascontiguousarray(self.resolved_local(label="gather"))
        uneven = self._layout.uneven_dims(self._shape)
        if uneven:  # shards of unequal sizes travel padded to the largest (every rank's slot alike)
            padded = np.zeros(self._layout.max_local_shape(self._shape), local.dtype)
            padded[tuple(slice(0, n) for n in local.shape)] = local
            local = padded
        stack = buffers.empty((mesh.size,) + local.shape, local.dtype) if root in (None, mesh.rank) else None
        comm, polite = mesh.comm, mesh.polite
        if root is None:
            door.transfer(comm, "gather", (), local, (), polite, mesh.engine.all_gather, local, stack)
        else:
            door.transfer(comm, "gather", (), local, (root,), polite, mesh.engine.gather_to, local, stack, root)
        if stack is None:
            return None
        out = np.empty(self._shape, local.dtype)
        block = self._local.shape  # a 0-d shard travels as one element
        for rank in range(mesh.size):
            if uneven:
                region = self._layout.slices(rank, self._shape)
                out[region] = stack[rank][tuple(slice(0, s.stop - s.start) for s in region)]
            else:
                out[self._layout.slices(rank, self._shape)] = stack[rank].reshape(block)
        return out

    def check(self, reference: Reference, rtol: float | None = None,
              atol: float | None = None, scale: Any = None) -> Verdict:
        """Compare this rank's region with `reference`; all ranks return the same Verdict (collective).

        `reference`: a SeededTensor, a global ndarray, or a callable taking a
        tuple of slices and returning that region; only this rank's region is
        made. Partial values are summed first (traced with label "check").
        `scale`: the magnitudes that entered each element (a global ndarray of
        the tensor's shape, or a callable of the region's slices; for a sum or
        product, the sum of its terms' absolute values): an element passes
        within atol + rtol x the larger of it and |reference| (docs/explanation/semantics.md,
        "Tolerances").
        """
        # Checked before the first collective, on every rank alike: a negative or NaN
        # tolerance fails even exact values ("FAILED ... max abs err 0").
        rtol = None if rtol is None else tolerance_arg(rtol, "rtol")
        atol = None if atol is None else tolerance_arg(atol, "atol")
        if isinstance(reference, (SeededTensor, np.ndarray)) and tuple(reference.shape) != self._shape:
            # A whole-tensor reference every rank passes alike: refused before any collective.
            raise ShapeError(
                f"check: reference of shape {tuple(reference.shape)!r} does not match the tensor's "
                f"global shape {self._shape!r}; expected the whole global tensor (a SeededTensor or "
                "an ndarray of that shape), or a function of the region's slices")
        if scale is not None and not callable(scale) and np.shape(scale) != self._shape:
            raise ShapeError(f"check: scale of shape {np.shape(scale)!r} does not match the tensor's "
                             f"global shape {self._shape!r}")
        actual = self.resolved_local(label="check")
        region = self.slices
        # Tolerances depend only on dtypes every rank knows, so the verdict agrees.
        known = [actual.dtype]
        if isinstance(reference, SeededTensor):
            known.append(np.dtype(reference.dtype))
        elif isinstance(reference, np.ndarray):
            known.append(reference.dtype)
        d_rtol, d_atol = default_tolerances(*known)
        rtol = d_rtol if rtol is None else rtol
        atol = d_atol if atol is None else atol
        dry = _context().dry_run
        try:
            if dry:  # a dry run has no values to check: its reference is not made, nothing is compared
                stats = np.array([1.0, 0.0, 0.0, 0.0, float(actual.size), 1.0])  # (local_stats' record)
            elif isinstance(reference, SeededTensor):
                expected = reference.region(region)
            elif callable(reference):
                expected = np.asarray(reference(region))
            else:
                reference = np.asarray(reference)
                if reference.shape != self._shape:
                    raise ShapeError(f"reference shape {reference.shape!r} differs from {self._shape!r}")
                expected = reference[region]
            if not dry:
                region_scale = None
                if scale is not None:
                    region_scale = np.asarray(scale(region) if callable(scale) else np.asarray(scale)[region])
                stats = local_stats(actual, expected, rtol, atol, region_scale)
        except ShapeError:
            # A mismatch on some ranks only must not skip the agreeing Allgather.
            stats = np.array([0.0, np.inf, np.inf, 0.0, float(actual.size), 0.0])
        if not _primary(self._mesh, self._layout):
            stats[3] = stats[4] = 0.0  # count each global element once, not once per replica
        # A dry run's verdict (agree's): passed, dry_run=True, its text saying no check was made; each
        # global element counted once (the dry communicator's table holds rank 0's record for every rank).
        return agree(self._mesh.comm, stats, rtol, atol, self._mesh.polite, scaled=scale is not None,
                     elements=math.prod(self._shape) if dry else None)


def _check_dtype(dtype: np.dtype, layout: TensorLayout) -> None:
    """Raise unless a shard of `dtype` can move (and, under a partial layout, be summed) by MPI."""
    dtype_arg(dtype, "local shard dtype")  # names the dtype and what is supported
    if dtype.kind == "b" and layout.partial:
        raise DTypeError(f"a bool tensor cannot be a pending sum ({layout}); MPI has no sum of "
                         "bools: use an integer dtype")


def _check_placement(mesh: Any, layout: Any) -> None:
    if type(layout) is TensorLayout and type(mesh) is Mesh and layout.layout is mesh.layout:
        return  # the usual case, in three identity tests
    if not isinstance(mesh, Mesh):
        raise LayoutError(f"mesh must be a spmdsim Mesh, got {describe(mesh)}; make one with "
                          "Mesh(Layout((2, 4), ('dp', 'tp'))), and pass it first")
    if not isinstance(layout, TensorLayout):
        raise LayoutError(_not_a_tensor_layout(layout))
    if layout.layout != mesh.layout:
        raise LayoutError(f"tensor layout is over {layout.layout} but the mesh is {mesh.layout}")


def _not_a_tensor_layout(layout: Any) -> str:
    """The refusal of a `layout` that is no TensorLayout, saying how to make one from what was given (a
    PartitionSpec tuple, DTensor placements, a device matrix's Layout) rather than only its type."""
    if isinstance(layout, Layout):
        how = ("a Layout is the device matrix alone; call it with each tensor dim's mesh axis (or None): "
               f"layout({layout.alias_name[0]!r}, None)")
    else:
        how = ("make one with mesh.layout('dp', None) (a mesh axis or None per tensor dim), or from a dialect "
               "with spmdsim.layouts.dialects' placements_to_layout(placements, mesh, ndim) or "
               "partition_spec_to_layout(spec, mesh, ndim)")
    return f"layout must be a TensorLayout, got {describe(layout)}; {how}"


def _shape_note(value: Any) -> str:
    shape = getattr(value, "shape", None)
    return "" if shape is None else f" of shape {tuple(shape)!r}"


def _primary(mesh: Mesh, layout: TensorLayout) -> bool:
    """True on the first replica of this shard (over replicated and partial axes)."""
    axes = layout.replicated_axes + layout.partial
    return not axes or layout.layout.group_index(mesh.rank, axes) == 0


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


def _holds_value(mesh: Mesh, layout: TensorLayout) -> bool:
    """True unless this rank is a non-zero member over the partial axes (those hold zeros)."""
    return not layout.partial or layout.layout.group_index(mesh.rank, layout.partial) == 0
