"""Reductions over any dims of a DTensor: sum, mean, max, min (rules in spmdsim.programs.infer.pointwise).

Over a split dim, ``sum`` and ``mean`` leave a pending sum over its axes (no
communication: the next op that needs the whole value resolves it, or
``redistribute`` does); ``max`` and ``min`` finish with one
Allreduce(MAX/MIN). Gradients (spmdsim.nn.autograd.rules.reduce): ``sum``
spreads dY over the reduced dims, ``mean`` divides by the global count,
``max``/``min`` send dY to the positions that attain the extreme, shared
equally among ties (counted over the whole group, as ``numpy``'s ``amax``
derivative and JAX do).
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from functools import partial
from typing import Any, Callable

import numpy as np

from ..autograd.rules.grads import axes_of
from ..autograd.rules.reduce import record_prod, record_reduce
from ...programs.infer.pointwise import infer_reduce, reduce_dims
from ...base.buffers import as_array, broadcast_zero, contiguous
from ...base.flops import sweep
from ...base.precision import is_float, is_low
from ._common import DRY_ZEROS_BYTES, make_dtensor
from ._operands import raise_if_not_dtensors
from ...runtime.dtensor_methods import _reduce_args
from ...runtime.executor import execute, pending, redistribute, resolve
from ...errors import DTypeError, OperatorError
from ...base.validate import as_int
from . import ufuncs as P
from .local import reshape

__all__ = ["sum", "mean", "max", "min", "prod", "var", "argmax", "argmin", "reduce"]


def lowest(dtype: np.dtype) -> Any:
    """The identity of a maximum in `dtype`: what an empty block (an uneven cut's empty shard) contributes."""
    return -np.inf if dtype.kind in "fc" or is_low(dtype) else (False if dtype.kind == "b" else np.iinfo(dtype).min)


def highest(dtype: np.dtype) -> Any:
    """The identity of a minimum in `dtype`."""
    return np.inf if dtype.kind in "fc" or is_low(dtype) else (True if dtype.kind == "b" else np.iinfo(dtype).max)


def _max(a: np.ndarray, axis: Any, keepdims: bool) -> np.ndarray:
    return np.max(a, axis=axis, keepdims=keepdims, initial=lowest(a.dtype)) if a.size == 0 else \
        np.max(a, axis=axis, keepdims=keepdims)


def _min(a: np.ndarray, axis: Any, keepdims: bool) -> np.ndarray:
    return np.min(a, axis=axis, keepdims=keepdims, initial=highest(a.dtype)) if a.size == 0 else \
        np.min(a, axis=axis, keepdims=keepdims)


def _mean_sum(a: np.ndarray, axis: Any, keepdims: bool) -> np.ndarray:
    """The sum a mean divides: numpy's np.mean adds float16 in float32 (its sum alone stays float16: a row of
    four float16 entries of 60000 has the mean 60000, not inf) and integers and bools in float64 (an int64 sum
    wraps past 2**63), every other dtype in its own."""
    wider = _MEAN_SUMS.get(a.dtype.kind) if a.dtype != _HALF else np.float32
    return np.sum(a, axis=axis, keepdims=keepdims, dtype=wider)


_HALF = np.dtype(np.float16)
_MEAN_SUMS = {"i": np.float64, "u": np.float64, "b": np.float64}  # numpy's _mean: integers and bools in float64
_KERNELS = {"sum": np.sum, "mean": _mean_sum, "max": _max, "min": _min, "prod": np.prod}


#: x.any() and x.all() (spmdsim.nn.ops.methods): a bool x's max and min, over no entries False and True.
_BOOLEAN = {"any": "max", "all": "min"}


def reduce(kind: str, x: Any, dims: Any = None, keepdims: bool = False) -> Any:
    """Reduce `x` by `kind` ("sum", "mean", "max", "min"; "any", "all" of a bool x) over `dims` (None: all dims),
    like numpy: a max or min over a dim of size 0 is refused, as numpy refuses it (the maximum of no entries)."""
    layout = _checked(kind, x, keepdims)
    axes = reduce_dims(dims, layout.ndim, kind)
    if kind == "max" or kind == "min":
        refuse_empty(kind, x, axes)
    kind = _BOOLEAN.get(kind, kind)
    if (kind == "max" or kind == "min") and x.local.dtype.kind == "b":
        # A bool's max and min (numpy's any and all) travel as uint8 and come back bool: MPI reduces no bool by
        # MAX or MIN, and over a split dim the Allreduce refused it as if summed ("cannot sum dtype 'bool'").
        return _reduce(kind, x.astype(np.uint8), axes, keepdims).astype(bool)
    return _reduce(kind, x, axes, keepdims)


def refuse_empty(kind: str, x: Any, axes: tuple) -> None:
    """The OperatorError of a max, min, argmax or argmin (`kind`) of x over `axes` where one has no entries (numpy's
    ValueError: "zero-size array to reduction operation maximum which has no identity"), before any collective."""
    shape = tuple(x.global_shape)
    empty = [d for d in axes if shape[d] == 0]
    if empty and len(axes) == len(shape):
        raise OperatorError(f"{kind} of an empty tensor (shape {shape!r}) has no answer, as numpy's: it has no "
                            "entries to take it of")
    if empty:
        raise OperatorError(f"{kind} over dim {empty[0]} of a tensor of shape {shape!r} has no answer, as numpy's: "
                            f"dim {empty[0]} has size 0")


def refuse_unordered(kind: str, x: Any, plan: Any) -> None:
    """The DTypeError of a max, min, argmax or argmin (`kind`) of complex x whose `plan` compares across ranks
    (an Allreduce(MAX/MIN): MPI orders no complex numbers), before any collective; within a rank numpy's order
    (real part first) is taken. It named the Allreduce, not `kind`."""
    if plan.steps and x.local.dtype.kind == "c":
        raise DTypeError(f"{kind} of dtype {x.local.dtype.name!r} over a dim split across ranks: ranks compare "
                         "with MPI's MAX/MIN, which orders no complex numbers; expected an integer or real float "
                         "dtype, or the reduced dims held whole on every rank (redistribute first)")


def _reduce(kind: str, x: Any, axes: tuple, keepdims: bool) -> Any:
    """`reduce` of x by `kind` ("sum", "mean", "max", "min") over the dims `axes`, its arguments checked."""
    layout = x.layout
    plan = infer_reduce(kind, layout, axes, keepdims)
    if kind == "max" or kind == "min":
        refuse_unordered(kind, x, plan)
    if layout != plan.target:
        x = redistribute(x, plan.target)
    shape = tuple(1 if d in axes else s for d, s in enumerate(x.global_shape) if keepdims or d not in axes)
    block = _reduced(x, kind, axes, keepdims)
    sweep(kind, (x.local,), (block,))
    count = math.prod(x.global_shape[d] for d in axes)
    if kind == "mean":  # (no entries: 0 / 0, NaN as numpy's, without numpy's warning from this line)
        with np.errstate(invalid="ignore") if not count else nullcontext():
            block = block / np.asarray(count, block.dtype) if block.dtype.kind == "f" else block / count
        if x.local.dtype == _HALF:  # (numpy's: the float32 mean rounded once to float16; a pending sum's parts too)
            block = block.astype(_HALF)
    if plan.steps and (kind == "max" or kind == "min") and is_float(block.dtype):
        block = _nan_kept(block, kind, lambda both: execute(x.mesh, both, plan.steps, shape, kind, owned=True))
    elif plan.steps:  # collectives take at least one dim: a 0-d result travels as one element
        local_shape = block.shape
        block = execute(x.mesh, contiguous(block).reshape(-1) if not local_shape else
                        contiguous(block), plan.steps, shape, kind, owned=True).reshape(local_shape)
    out = make_dtensor(x.mesh, block, plan.out, shape)
    if x._ag is None:
        return out
    return record_reduce(kind, out, x, plan, axes, keepdims, count)


def _nan_kept(values: np.ndarray, reduction: str, allreduce: Callable[[np.ndarray], np.ndarray],
             dtype: Any = None) -> np.ndarray:
    """The group's maximum or minimum (`reduction`) of each of `values` (floats), a NaN kept as numpy's max and
    min keep it: MPI's MAX drops one where it compares it second (MPICH's a > b ? a : b), so each element
    travels beside a NaN flag, flags then values in `dtype` (None: the values'), in the one Allreduce
    `allreduce` runs (an executor's program of `reduction`, twice the bytes); the flag's extreme says whether
    any rank held a NaN there. max and min (execute) and argmax and argmin (resolve, in float64) send it."""
    flat = contiguous(values).reshape(-1)
    dtype = flat.dtype if dtype is None else np.dtype(dtype)
    nan = np.isnan(flat)
    sign = 1 if reduction == "max" else -1  # a flag of 1 wins a MAX, of -1 a MIN; a NaN's value loses both
    both = np.concatenate([nan.astype(dtype) * sign, np.where(nan, -sign * np.inf, flat).astype(dtype)])
    done = allreduce(both)
    return np.where(done[:flat.size] != 0, np.nan, done[flat.size:]).astype(dtype).reshape(np.shape(values))


def _reduced(x: Any, kind: str, axes: tuple, keepdims: bool) -> np.ndarray:
    """x's block reduced by `kind`'s kernel over `axes`; a dry run's large block (zeros) gives the engine's
    zeros of the result (its pages not read: a private mapping's page faults on each), the kernel's shape and
    dtype worked out on one element."""
    kernel, local = _KERNELS[kind], x.local
    if x.mesh.engine.dry and local.nbytes >= DRY_ZEROS_BYTES:
        like = np.asanyarray(kernel(np.zeros((1,) * local.ndim, local.dtype), axis=axes, keepdims=keepdims))
        shape = tuple(1 if d in axes else n for d, n in enumerate(local.shape) if keepdims or d not in axes)
        return x.mesh.engine.local(partial(kernel, local, axis=axes, keepdims=keepdims),
                                   broadcast_zero(shape, like.dtype))
    return np.asanyarray(kernel(local, axis=axes, keepdims=keepdims))


def _checked(kind: str, x: Any, keepdims: Any) -> Any:
    """x's layout, once x is a DTensor and `keepdims` a bool (else the one-line error every rank raises)."""
    try:
        layout = x.layout
    except AttributeError:
        raise_if_not_dtensors(kind, ("x",), x)
        raise
    if not isinstance(keepdims, bool):
        raise OperatorError(f"{kind}: keepdims {keepdims!r} must be True or False")
    return layout


def sum(x: Any, dims: Any = None, keepdims: bool = False, **aliases: Any) -> Any:  # noqa: A001 - numpy's name
    """Sum over `dims`; over a split dim the result is a pending sum over its axes."""
    if aliases:  # numpy's axis=, PyTorch's dim= and keepdim=, as the DTensor methods take them
        dims, keepdims = _reduce_args("sum", dims, keepdims, aliases)
    return reduce("sum", x, dims, keepdims)


def mean(x: Any, dims: Any = None, keepdims: bool = False, **aliases: Any) -> Any:
    """Mean over `dims` (divided by the global count); over a split dim a pending sum, as for sum."""
    if aliases:  # numpy's axis=, PyTorch's dim= and keepdim=, as the DTensor methods take them
        dims, keepdims = _reduce_args("mean", dims, keepdims, aliases)
    return reduce("mean", x, dims, keepdims)


def max(x: Any, dims: Any = None, keepdims: bool = False, **aliases: Any) -> Any:  # noqa: A001 - numpy's name
    """Maximum over `dims`; over a split dim one Allreduce(MAX)."""
    if aliases:  # numpy's axis=, PyTorch's dim= and keepdim=, as the DTensor methods take them
        dims, keepdims = _reduce_args("max", dims, keepdims, aliases)
    return reduce("max", x, dims, keepdims)


def min(x: Any, dims: Any = None, keepdims: bool = False, **aliases: Any) -> Any:  # noqa: A001 - numpy's name
    """Minimum over `dims`; over a split dim one Allreduce(MIN)."""
    if aliases:  # numpy's axis=, PyTorch's dim= and keepdim=, as the DTensor methods take them
        dims, keepdims = _reduce_args("min", dims, keepdims, aliases)
    return reduce("min", x, dims, keepdims)


def prod(x: Any, dims: Any = None, keepdims: bool = False) -> Any:
    """Product over `dims` (None: all dims), numpy's ``prod``: its dtype (a bool or a narrower integer is
    int64, a narrower unsigned one uint64), 1 over no entries. A pending sum is resolved first.

    Over a split dim each rank multiplies its block, the ranks' partial products (one entry per rank) are
    gathered over the dim's axes (an Allgather of those alone, not of the rows) and multiplied on every rank;
    the result is replicated over those axes. Its gradient: dY times the product of the other entries (made
    without dividing, so a zero entry takes the product of the rest)."""
    layout = _checked("prod", x, keepdims)
    axes = reduce_dims(dims, layout.ndim, "prod")
    if layout.partial:  # a product of a sum's addends is not the product of the sum
        x = redistribute(x, layout.with_partial(()))
        layout = x.layout
    mesh, shape = layout.layout, tuple(x.global_shape)
    split = [d for d in axes if mesh.group_size(layout.tensor_map[d]) > 1]
    if split:
        # Each rank's product of its block: a tensor of one entry per shard along each split reduced dim,
        # laid out as x, then gathered whole over those dims' axes and multiplied as below.
        sizes = tuple(mesh.group_size(e) if d in axes else n for d, (e, n) in enumerate(zip(layout.tensor_map, shape)))
        x = redistribute(_local_prod(x, axes, True, layout, sizes),
                         layout.layout(*[None if d in split else e or None for d, e in enumerate(layout.tensor_map)]))
        layout, shape = x.layout, sizes
    kept = [() if d in axes else e for d, e in enumerate(layout.tensor_map)]
    out_map = kept if keepdims else [e for d, e in enumerate(kept) if d not in axes]
    out_shape = tuple(1 if d in axes else n for d, n in enumerate(shape) if keepdims or d not in axes)
    return _local_prod(x, axes, keepdims, mesh(*[e or None for e in out_map]), out_shape)


def _local_prod(x: Any, axes: tuple, keepdims: bool, layout: Any, shape: tuple) -> Any:
    """Each rank's product of its block over `axes`, as a DTensor of `layout` and global `shape`."""
    block = _reduced(x, "prod", axes, keepdims)
    sweep("prod", (x.local,), (block,))
    out = make_dtensor(x.mesh, block, layout, shape)
    return out if x._ag is None else record_prod(out, x, axes, keepdims)


def var(x: Any, dims: Any = None, keepdims: bool = False, correction: int = 0) -> Any:
    """Variance over `dims` (numpy's ``var``; ``correction=1`` for PyTorch's default, Bessel's), built from
    mean and the elementwise rules: over a split dim the mean is a pending sum, resolved where a square
    needs a whole value, so no rank gathers a row."""
    try:
        layout = x.layout
    except AttributeError:
        raise_if_not_dtensors("var", ("x",), x)
        raise
    axes = reduce_dims(dims, layout.ndim, "var")
    c = as_int(correction)
    if c is None or isinstance(correction, bool) or c < 0:
        raise OperatorError(f"var: correction {correction!r} must be a non-negative integer")
    count = math.prod(x.global_shape[d] for d in axes)
    if count - c <= 0:
        raise OperatorError(f"var: correction {c} leaves no degrees of freedom over {count} entries")
    centred = P.sub(x, mean(x, axes, keepdims=True))
    if centred.dtype.kind == "c":  # numpy's and PyTorch's: the mean of |x - mean|**2, real (not of (x - mean)**2)
        centred = P.abs(centred)
    return P.mul(sum(P.mul(centred, centred), axes, keepdims), 1.0 / (count - c))


def argmax(x: Any, dim: Any = None, keepdims: bool = False, **aliases: Any) -> Any:
    """Index of the largest entry along `dim` (the first one on ties, NaN counted largest, as numpy's and
    PyTorch's argmax), an int64 DTensor with no gradient; `dim` None: the index into the flattened tensor.

    Over a split dim: each rank's best value and its global index, then one Allreduce(MAX) of the value
    (and of a NaN flag) and one Allreduce(MIN) of the indices that attain it, over the dim's axes. numpy's
    ``axis=`` and PyTorch's ``keepdim=`` are taken, as the methods take them.
    """
    if aliases:
        dim, keepdims = _reduce_args("argmax", dim, keepdims, aliases)
    return arg_reduce("argmax", x, dim, keepdims)


def argmin(x: Any, dim: Any = None, keepdims: bool = False, **aliases: Any) -> Any:
    """Index of the smallest entry along `dim` (first on ties, NaN counted smallest, as numpy's argmin);
    int64, no gradient; over a split dim two Allreduces (MIN of the value, MIN of the index).

    ``axis=`` and ``keepdim=`` as argmax's."""
    if aliases:
        dim, keepdims = _reduce_args("argmin", dim, keepdims, aliases)
    return arg_reduce("argmin", x, dim, keepdims)


def _losing(kind: str, dtype: np.dtype) -> Any:
    """The value every entry of `dtype` beats or ties for `kind` (argmax: -inf or the least integer)."""
    if dtype.kind == "f" or dtype.kind == "V":  # (ml_dtypes' bfloat16 and FP8 are numpy kind 'V')
        return -np.inf if kind == "argmax" else np.inf
    info = np.iinfo(dtype)
    return info.min if kind == "argmax" else info.max


def arg_reduce(kind: str, x: Any, dim: Any, keepdims: bool) -> Any:
    """`argmax` or `argmin` (`kind`) of x along `dim` (None: the flattened tensor); DTensor's methods call it."""
    layout = _checked(kind, x, keepdims)
    if x.local.dtype.kind == "b":  # numpy's: the first True (argmax) or False (argmin); MPI compares no bools
        x = x.astype(np.uint8)
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, (int, np.integer))):
        raise OperatorError(f"{kind}: dim {dim!r} must be an integer or None (the flattened tensor)")
    dims = reduce_dims(dim, layout.ndim, kind)
    # numpy's argmax(keepdims=True) without an axis keeps every dim as 1: the 0-d answer, reshaped at the end.
    flat_keep, keepdims = dim is None and keepdims, keepdims and dim is not None
    refuse_empty(kind, x, dims)
    plan = infer_reduce("max", layout, dims, keepdims)  # the splits of max: the input resolved, dims gone
    refuse_unordered(kind, x, plan)
    if layout != plan.target:
        x = redistribute(x, plan.target)
    shape = tuple(1 if k in dims else n for k, n in enumerate(x.global_shape) if keepdims or k not in dims)
    block = x.local
    pick = np.argmax if kind == "argmax" else np.argmin
    starts = [a for a, _ in x.layout.bounds(x.mesh.rank, x.global_shape)]
    last = np.iinfo(np.int64).max
    if (block.size == 0) if dim is None else (block.shape[dims[0]] == 0):
        # An uneven cut's empty shard of the reduced dim (chunk, balanced) has no candidate: the value that
        # loses every comparison and the index no candidate has (the other shards answer).
        kept = () if dim is None else block.shape[:dims[0]] + block.shape[dims[0] + 1:]
        value = np.full(kept, _losing(kind, block.dtype), block.dtype)
        index = np.full(kept, last, np.int64)
    elif dim is None:  # one entry: its place in the flattened global tensor
        at = np.unravel_index(int(pick(block)), block.shape) if block.ndim else ()
        value = block[at]
        index = np.int64(np.ravel_multi_index(tuple(a + s for a, s in zip(at, starts)), x.global_shape)
                         if block.ndim else 0)
    else:
        d = dims[0]
        local_index = pick(block, axis=d)
        value = np.take_along_axis(block, np.expand_dims(local_index, d), d).squeeze(d)
        index = local_index.astype(np.int64) + starts[d]
    axes = axes_of(x.layout, tuple(x.layout.tensor_map[d] for d in dims)) if plan.steps else ()
    if axes:
        values = np.asanyarray(value)
        group, reduction = pending(x.mesh.layout, 1, axes), "max" if kind == "argmax" else "min"
        if is_float(values.dtype):  # NaN wins (numpy's rule): the group's extreme is NaN where a rank holds one
            top = _nan_kept(values, reduction, lambda both: resolve(x.mesh, both, group, f"{kind}.value",
                                                                   reduction=reduction, owned=True), np.float64)
            mine = (values == top) | np.isnan(values)  # (a NaN here made the top NaN)
        else:  # integers in their own dtype: exact
            top = resolve(x.mesh, contiguous(values).reshape(-1), group, f"{kind}.value",
                          reduction=reduction).reshape(values.shape)
            mine = values == top
        candidates = np.where(mine, np.asanyarray(index), last).astype(np.int64).reshape(-1)
        index = resolve(x.mesh, candidates, group, f"{kind}.index", reduction="min",
                        owned=True).reshape(values.shape)
    index = as_array(index, np.int64)
    if keepdims:
        index = np.expand_dims(index, dims[0])
    out = make_dtensor(x.mesh, index, plan.out, shape)
    if flat_keep:  # argmax(x, None, keepdims=True): shape (1, ..., 1)
        out = reshape(out, (1,) * layout.ndim)
    return out
