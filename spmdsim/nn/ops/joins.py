"""Slicing one dim (`narrow`) and joining DTensors along one (`concatenate`), by spmdsim.programs.infer.concat.

A slice of a dim whole on every rank is local. A slice of a split dim moves
the rows each rank's new block lacks from the rank of its group that holds
them (one Alltoallv, the lower bound: spmdsim.programs.plan.shift), and its gradient
moves them back, zeros elsewhere; a join along a split dim moves every
operand's rows into the result's blocks the same way, in one Alltoallv, and
a join along a whole dim is local. The other dims keep their splits and pending sums stay
pending. Rotary embeddings' halves are ``narrow(q, -1, 0, d // 2)`` and
``narrow(q, -1, d // 2, d // 2)``, joined back by ``concatenate``.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..autograd.rules.shapes import (record_broadcast_to, record_concatenate, record_concatenate_split, record_narrow,
                                     record_narrow_split)
from ...base import buffers
from ...base.buffers import broadcast_zero
from ...runtime.engines import local as _engine_local  # the kernel; the dry engine's zeros, not computed
from ...errors import DTypeError, OperatorError
from ...programs.infer.concat import infer_broadcast_to, infer_concatenate, infer_narrow
from ...programs.infer.reshape import infer_reshape
from ...programs.plan.shift import Shift
from ...base.validate import as_int, counted, dims_expected, dtype_name
from .local import reshape as _reshape
from ._common import describe, dim_or_axis, dry_zeros, make_dtensor
from ._operands import check_dtensor, raise_if_not_dtensors, result_dtype, same_mesh
from ...runtime.exchange import shifted, shifted_many
from ...runtime.executor import redistribute

__all__ = ["narrow", "concatenate", "stack", "broadcast_to", "getitem"]


def narrow(x: Any, dim: int, start: int, length: int) -> Any:
    """x[..., start:start + length, ...] along `dim` (PyTorch's narrow).

    Along a split dim the result keeps the split where `length` divides among its shards (else the dim
    is whole on every rank) and the rows move by one Alltoallv, each rank receiving only the rows of its
    new block it lacks; nothing moves along a whole dim.
    """
    try:
        layout, d, s, shape = infer_narrow(x.layout, x.global_shape, dim, start, length)
    except AttributeError:
        raise_if_not_dtensors("narrow", ("x",), x)
        raise
    if x.layout.num_shards(d) > 1:
        return _narrow_split(x, layout, d, s, shape)
    index = (slice(None),) * d + (slice(s, s + shape[d]),)
    out = make_dtensor(x.mesh, x.local[index], layout, shape)
    return out if x._ag is None else record_narrow(out, x, index)


def _narrow_split(x: Any, layout: Any, d: int, s: int, shape: tuple) -> Any:
    """`narrow` of a split dim: its rows moved by `Shift` (its gradient: moved back, zeros elsewhere)."""
    rows = f"[{s}:{s + shape[d]}]"
    move = Shift(x.layout, tuple(x.global_shape), layout, shape, d, s)
    out = make_dtensor(x.mesh, shifted(x.mesh, x.local, move, f"narrow dim {d} {rows}"), layout, shape)
    return out if x._ag is None else record_narrow_split(out, x, d, s, shape, rows, shifted)


def chunk(x: Any, chunks: int, dim: int = 0) -> tuple:
    """`x` cut along `dim` into `chunks` pieces of ceil(size / chunks) (the last smaller, fewer pieces if the
    dim runs out), as PyTorch's chunk: a `narrow` each."""
    n = as_int(chunks)
    if n is None or isinstance(chunks, bool) or n < 1:
        raise OperatorError(f"chunk: chunks {chunks!r} must be a positive integer")
    try:
        ndim = x.layout.ndim
    except AttributeError:
        raise_if_not_dtensors("chunk", ("x",), x)
        raise
    d = as_int(dim)
    if d is None or isinstance(dim, bool) or not -ndim <= d < ndim:
        raise OperatorError(f"chunk: dim {dim!r} is out of range for a tensor of {ndim} dims "
                            + dims_expected(ndim))
    size = x.global_shape[d % ndim]
    step = -(-size // n) if size else 0
    if step == 0:
        return (x,)
    return tuple(narrow(x, d, start, min(step, size - start)) for start in range(0, size, step))


def concatenate(xs: Sequence[Any], dim: int = 0, *, axis: Any = None) -> Any:
    """The DTensors `xs` joined along `dim` (numpy.concatenate).

    Operands that disagree on the other dims' splits move by the least-bytes rule (as for ``add``);
    one pending sum over the same axes in every operand stays pending, any other mix is resolved first.
    Along a split dim each operand's rows move to the ranks whose block of the result holds them. numpy's
    ``axis=`` is taken for `dim`.
    """
    dim = dim_or_axis("concatenate", dim, axis, 0)
    if isinstance(xs, (str, bytes)) or not hasattr(xs, "__iter__") or hasattr(xs, "_ag"):
        raise OperatorError(f"concatenate: xs must be a sequence of DTensors, got {describe(xs)}")
    xs = list(xs)
    for k, x in enumerate(xs):
        check_dtensor(x, f"concatenate: operand {k}")
    if not xs:
        raise OperatorError("concatenate: no operands; give a sequence of DTensors")
    mesh = same_mesh(*xs)
    try:
        dtype = result_dtype(*[x.local.dtype for x in xs])
    except DTypeError as e:  # numpy has no common dtype of them (before ml_dtypes 0.7: bfloat16, float16)
        raise DTypeError(f"concatenate: {e}") from None
    plan = infer_concatenate(tuple(x.layout for x in xs), tuple(tuple(x.global_shape) for x in xs), dim,
                             dtype_name(dtype))
    if any(x.layout != t for x, t in zip(xs, plan.targets)):
        xs = [x if x.layout == t else redistribute(x, t) for x, t in zip(xs, plan.targets)]
    if not plan.local:
        return _concatenate_split(mesh, xs, plan, dtype)
    d = plan.dim
    blocks = [x.local for x in xs]
    # A dry run's large join: the engine's zeros of its block (spmdsim.runtime.sim.dry), nothing copied.
    block = dry_zeros(mesh, plan.out.local_shape(plan.shape, mesh.rank), dtype, np.concatenate, blocks, d)
    if block is None:
        block = np.concatenate(blocks, axis=d).astype(dtype, copy=False)
    out = make_dtensor(mesh, block, plan.out, plan.shape)
    return out if all(x._ag is None for x in xs) else record_concatenate(out, xs, d)


def _concatenate_split(mesh: Any, xs: list, plan: Any, dtype: Any) -> Any:
    """`concatenate` along a dim split somewhere: each operand's rows moved into the result's blocks by a
    `Shift`, all in one Alltoallv (its gradient: the result's rows moved back to each operand, one too)."""
    d, shape = plan.dim, plan.shape
    local_shape = plan.out.local_shape(shape, mesh.rank)
    # Every row written below (a dry run's: the engine's zeros, written by no row: spmdsim.runtime.exchange)
    block = buffers.fresh(_engine_local(np.empty, broadcast_zero(local_shape, dtype), local_shape, dtype))
    shifted_many(mesh, [(x.local, Shift(x.layout, tuple(x.global_shape), plan.out, shape, d, -at), block)
                        for x, at in zip(xs, plan.offsets)], f"concatenate dim {d}")
    out = make_dtensor(mesh, block, plan.out, shape)
    return out if all(x._ag is None for x in xs) else record_concatenate_split(out, xs, plan, shifted_many)


def stack(xs: Sequence[Any], dim: int = 0, *, axis: Any = None) -> Any:
    """`xs` (DTensors of one shape) joined along a new dim `dim`, like numpy.stack (reshape, then concatenate).

    numpy's ``axis=`` is taken for `dim`."""
    dim = dim_or_axis("stack", dim, axis, 0)
    if isinstance(xs, (str, bytes)) or not hasattr(xs, "__iter__") or hasattr(xs, "_ag"):
        raise OperatorError(f"stack: xs must be a sequence of DTensors, got {describe(xs)}")
    xs = list(xs)
    if not xs:
        raise OperatorError("stack: no operands; give a sequence of DTensors")
    for k, x in enumerate(xs):
        check_dtensor(x, f"stack: operand {k}")
        if tuple(x.global_shape) != tuple(xs[0].global_shape):
            raise OperatorError(f"stack: operand {k} of shape {tuple(x.global_shape)!r} differs from operand 0 "
                                f"of shape {tuple(xs[0].global_shape)!r}; stack takes tensors of one shape")
    ndim = len(xs[0].global_shape) + 1
    d = as_int(dim)
    if d is None or isinstance(dim, bool) or not -ndim <= d < ndim:
        raise OperatorError(f"stack: dim {dim!r} is out of range for a result of {ndim} dims "
                            + dims_expected(ndim))
    d %= ndim
    try:
        result_dtype(*[x.local.dtype for x in xs])
    except DTypeError as e:  # (as concatenate's, naming stack)
        raise DTypeError(f"stack: {e}") from None
    shape = tuple(xs[0].global_shape)
    return concatenate([_reshape(x, shape[:d] + (1,) + shape[d:]) for x in xs], d)


def broadcast_to(x: Any, shape: Any) -> Any:
    """x broadcast to `shape` (numpy.broadcast_to, PyTorch's expand): the grown dims whole on every rank, local.

    Its gradient sums the grown dims back, on each rank's own block (they are whole there).
    """
    try:
        layout, new = infer_broadcast_to(x.layout, x.global_shape, shape)
    except AttributeError:
        raise_if_not_dtensors("broadcast_to", ("x",), x)
        raise
    local_shape = layout.local_shape(new, x.mesh.rank)
    # A dry run's large result: the engine's zeros of its block (spmdsim.runtime.sim.dry), not copied out of x's.
    block = dry_zeros(x.mesh, local_shape, x.local.dtype, np.broadcast_to, x.local, local_shape)
    if block is None:
        block = np.broadcast_to(x.local, local_shape).copy()
    out = make_dtensor(x.mesh, block, layout, new)
    return out if x._ag is None else record_broadcast_to(out, x, new)


def getitem(x: Any, index: Any) -> Any:
    """``x[index]`` for ints, slices of step 1, ``...`` and None, by `narrow` on each cut dim."""
    items = index if isinstance(index, tuple) else (index,)
    shape = tuple(x.global_shape)
    used = sum(1 for item in items if item is not None and item is not Ellipsis)
    if sum(1 for item in items if item is Ellipsis) > 1:
        raise OperatorError(f"index {index!r} has more than one '...'")
    if used > len(shape):
        raise OperatorError(f"index {index!r} has {counted(used, 'entry')} for a tensor of "
                            f"{counted(len(shape), 'dim')}")
    at = next((k for k, item in enumerate(items) if item is Ellipsis), len(items))  # the dims '...' stands for
    items = items[:at] + (slice(None),) * (len(shape) - used) + items[at + 1:]
    out_shape: list[int] = []
    cuts: list[tuple[int, int, int]] = []  # (dim, start, length): a narrow each, made once all are checked
    d = 0
    for item in items:
        if item is None:
            out_shape.append(1)
            continue
        size = shape[d]
        if isinstance(item, slice):
            try:
                start, stop, step = item.indices(size)
            except (TypeError, ValueError):  # a step of 0, a bound no integer: Python's words, a traceback
                raise OperatorError(f"index {index!r}: slice {item!r} is not one DTensor slices take: integer "
                                    "bounds (or None) and step 1") from None
            if step != 1:
                raise OperatorError(f"index {index!r}: slice {item!r} has step {step!r}; DTensor slices take "
                                    "step 1 only")
            length = max(stop - start, 0)
            if length != size:
                cuts.append((d, start if length else 0, length))
            out_shape.append(length)
        elif as_int(item) is not None and not isinstance(item, bool):
            i = as_int(item)
            if not -size <= i < size:
                raise _OutOfRange(f"index {item!r} is out of range for dim {d} of size {size}")
            cuts.append((d, i % size, 1))
        elif getattr(getattr(item, "dtype", None), "kind", None) == "b":  # x[mask]: numpy's shape follows the values
            raise OperatorError(f"x[mask] of a DTensor: a bool mask picks a number of elements that depends on the "
                                f"values, which no layout holds; keep the shape with ops.where(mask, x, 0.0) (or "
                                f"x * mask), then reduce (index {index!r})")
        else:
            raise OperatorError(f"index {index!r}: entry {item!r} is not an int, a slice, '...' or None "
                                "(DTensors take no fancy or bool indexing)")
        d += 1
    target = tuple(out_shape)
    if cuts and target != _cut_shape(shape, cuts):
        _check_reshape(x, index, cuts, target)  # refused here, on every rank, before a narrow moves a row
    for d, start, length in cuts:
        x = _cut(x, index, d, start, length)
    return x if target == tuple(x.global_shape) else _reshape(x, target)


def _cut_shape(shape: tuple, cuts: list) -> tuple:
    out = list(shape)
    for d, _, length in cuts:
        out[d] = length
    return tuple(out)


def _check_reshape(x: Any, index: Any, cuts: list, target: tuple) -> None:
    """The layouts ``x[index]``'s narrows leave (pure), and the reshape to `target` after them: its refusal
    raised before the first narrow communicates, naming the index the user wrote."""
    layout, shape = x.layout, tuple(x.global_shape)
    try:
        for d, start, length in cuts:
            layout, _, _, shape = infer_narrow(layout, shape, d, start, length)
        infer_reshape(layout, shape, target)
    except OperatorError as error:
        raise OperatorError(f"x[{_index_text(index)}]: {error}") from None


class _OutOfRange(OperatorError, IndexError):
    """An int index past its dim: an IndexError too, so ``for row in x`` stops there as over a numpy array."""


def _cut(x: Any, index: Any, d: int, start: int, length: int) -> Any:
    """`narrow` for ``x[index]``; its refusal names the index the user wrote."""
    try:
        return narrow(x, d, start, length)
    except OperatorError as error:
        raise OperatorError(f"x[{_index_text(index)}]: {error}") from None


def _index_text(index: Any) -> str:
    """``x[...]``'s index as written: ``..., 2:4`` for (Ellipsis, slice(2, 4))."""
    def one(item: Any) -> str:
        if item is Ellipsis:
            return "..."
        if isinstance(item, slice):
            text = ("" if item.start is None else str(item.start)) + ":" + ("" if item.stop is None else str(item.stop))
            return text if item.step is None else f"{text}:{item.step}"
        return repr(item)
    return ", ".join(one(item) for item in (index if isinstance(index, tuple) else (index,)))
