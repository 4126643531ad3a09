"""Causal masks, masked_fill and dropout on DTensors.

- ``causal_mask`` builds only this rank's block; ``masked_fill`` is ``where``.
- ``dropout``: the mask of element i is a pure function of (seed, i) over the
  global index (spmdsim.SeededTensor), so replicas of a region draw the same
  mask and different regions independent ones, whatever the layout, and one
  numpy process reproduces it exactly.
"""
from __future__ import annotations

import operator
from numbers import Real
from typing import Any, Optional, Sequence

import numpy as np

from ...base.buffers import broadcast_zero
from ..autograd.kept import kept_problem
from ..autograd.rules.pointwise import record_dropout, record_dropout_mask
from ...runtime.engines import local as _engine_local  # the kernel; the dry engine's zeros, not computed
from ...errors import OperatorError
from ...base.flops import any_open, sweep
from ...base.precision import is_low, rounded, wide
from ...base.validate import shape_arg
from . import ufuncs as P
from ._common import MASKS, describe, dry_zeros, make_dtensor, shaped_as, seed_arg
from ._operands import flag, raise_if_not_dtensors, require_float
from ...base.tables import put

__all__ = ["causal_mask", "masked_fill", "dropout", "dropout_keep"]


def causal_mask(mesh: Any, shape: Any, layout: Any = None) -> Any:
    """A bool DTensor, True where the last dim's index exceeds the second last's (keys after the query).

    `layout`: its TensorLayout (default replicated); only this rank's block is built.
    """
    if not hasattr(mesh, "engine"):  # causal_mask(scores, shape): the mesh comes first
        raise OperatorError(f"causal_mask: mesh must be a spmdsim Mesh, got {describe(mesh)}; e.g. "
                            "ops.causal_mask(x.mesh, (T, T))")
    shape = shape_arg(shape, "causal_mask shape")
    if len(shape) < 2:
        raise OperatorError(f"causal_mask shape {shape!r} needs at least 2 dims (queries, keys)")
    layout = mesh.layout(*([None] * len(shape))) if layout is None else layout
    # a large mask: the engine's zeros of its block (spmdsim.runtime.sim.dry), neither built nor kept
    if mesh.engine.dry:
        dry = dry_zeros(mesh, layout.local_shape(shape, mesh.rank), bool, np.greater)
        if dry is not None:
            return make_dtensor(mesh, dry, layout, shape)
    key = (layout, mesh.rank, shape)
    block = _MASKS.get(key)
    if block is None:
        region = layout.slices(mesh.rank, shape)
        rows = np.arange(region[-2].start, region[-2].stop)[:, None]
        cols = np.arange(region[-1].start, region[-1].stop)[None, :]
        block = np.broadcast_to(cols > rows, layout.local_shape(shape, mesh.rank)).copy()
        put(_MASKS, key, block, 256)
    return make_dtensor(mesh, block.copy(), layout, shape)  # the caller's own block, as before


# (layout, rank, global shape) -> that rank's mask block: a transformer asks for the same one in
# every layer of every step, and working out the region cost more than copying the block.
_MASKS: dict = {}


def masked_fill(x: Any, mask: Any, value: float) -> Any:
    """x with `value` where the bool DTensor `mask` is True (broadcasting), e.g. -inf above the diagonal."""
    raise_if_not_dtensors("masked_fill", ("x", "mask"), x, mask)
    if mask.local.dtype != np.dtype(bool):
        raise OperatorError(f"masked_fill: mask must be a bool DTensor, got dtype {mask.local.dtype.name!r}; "
                            "compare first (ids == 0, x < 0) or use ops.causal_mask")
    if not isinstance(value, (Real, np.generic, np.ndarray)) and not hasattr(value, "global_shape"):
        raise OperatorError(f"masked_fill: value {describe(value)} must be a real number (float('-inf') for minus "
                            "infinity) or a DTensor")
    return P.where(mask, value, x)


def dropout_args(p: Any, seed: Any) -> None:
    """`dropout`'s refusals of its rate and seed (spmdsim.nn.ops.fused's residual makes the same)."""
    if not isinstance(p, Real) or isinstance(p, bool) or not 0 <= p < 1:
        raise OperatorError(f"dropout: p {p!r} must be a number with 0 <= p < 1")
    if seed is None:
        raise OperatorError("dropout: a seed is required (an integer, different per layer and step, e.g. "
                            "ops.dropout(x, 0.1, seed=1000 * step + layer)), so every rank draws the same mask")
    seed_arg(seed, "dropout")


def dropout(x: Any, p: float, seed: Optional[int] = None, training: bool = True,
            mask_dims: Optional[Sequence[int]] = None, kept: str = "graph") -> Any:
    """Zero each element with probability `p` and scale the rest by 1 / (1 - p); identity when not training.

    The mask is ``SeededTensor(x.global_shape, seed=seed) >= p`` read at this rank's region, so the
    result does not depend on the layout; a pending sum stays pending (dropout is linear). `seed` is
    required: no default could give each layer and step its own mask. `mask_dims`: a permutation of x's
    dims; the mask is then the one ``x.transpose(mask_dims)`` would get, read through a view (a
    sequence-first (T, B, D) x with (1, 0, 2) drops what its batch-first twin drops, with no copy).
    `kept`: what the node keeps for backward: "graph", the kept entries' float factor and x's block;
    "megatron", the 1-byte boolean mask only (the backward multiplies by mask and 1 / (1 - p)).
    """
    dropout_args(p, seed)
    training = flag("dropout", "training", training)
    problem = kept_problem(kept)
    if problem:
        raise OperatorError(f"dropout: {problem}")
    if not hasattr(x, "_layout"):
        raise_if_not_dtensors("dropout", ("x",), x)
    if not training or p == 0:
        return x
    local = x.local  # this rank's block, read once (a captured step: its record's view)
    require_float("dropout", local)
    # The kept entries' factor, once: x * (keep * scale) is x * keep * scale bit for bit (keep is 0 or 1),
    # one product forward and one backward.
    # bfloat16: the factor in float32 and x * factor rounded once (spmdsim.base.precision)
    low = is_low(x.dtype)
    scale = np.asarray(1.0 / (1.0 - p), np.float32 if low else x.dtype)
    # A dry run's large block (spmdsim.nn.ops._common.dry_zeros): zeros, forward and backward, no mask drawn.
    dry = dry_zeros(x.mesh, local.shape, local.dtype, np.multiply, local, scale)
    if kept == "megatron":
        keep = dropout_keep(x, p, seed, mask_dims, dry is not None)
        if dry is not None:
            block = dry
        else:  # bfloat16: x times the float32 factor, rounded once (the graph's values)
            block = rounded(wide(local) * np.multiply(keep, scale), x.dtype) if low else local * np.multiply(
                keep, scale)
        out = shaped_as(x, block, x._layout)
        if any_open():  # else nothing is counted: no blocks to gather
            sweep("dropout", (local,), (out.local, keep))  # the mask drawn in the kernel and written
        return out if x._ag is None else record_dropout_mask(out, x, keep, scale.dtype.type(scale))
    order, mask_shape, mask_region, back = _mask_geometry(x, mask_dims)
    if dry is not None:  # the factors the rule keeps, sized (zeros never touched): kept bytes measure alike
        like = broadcast_zero(dry.shape, scale.dtype)  # the factors' dtype (float32 at bfloat16)
        factors = None if x._ag is None else _engine_local(np.copy, like, dry)
    elif order is None:
        factors = np.multiply(MASKS.keep_mask(mask_shape, seed, mask_region, p), scale)
    else:
        factors = np.multiply(MASKS.keep_mask(mask_shape, seed, mask_region, p), scale).transpose(back)
    if dry is not None:
        block = dry
    else:
        block = rounded(wide(local) * factors, x.dtype) if low else local * factors
    out = shaped_as(x, block, x._layout)
    # the kept entries' factors drawn in the kernel and written beside the result
    if any_open():  # else nothing is counted: no blocks to gather
        sweep("dropout", (local,), (out.local, local))
    return out if x._ag is None else record_dropout(out, x, factors, scale)


def dropout_keep(x: Any, p: float, seed: Any, mask_dims: Optional[Sequence[int]], dry: bool) -> np.ndarray:
    """This rank's boolean keep mask of `dropout` on x (shaped like x's block; with `mask_dims`, a view);
    `dry`: a dry run's zeros of its size, not drawn (pages never touched)."""
    if dry:
        like = broadcast_zero(x.local.shape, bool)
        return _engine_local(np.copy, like, like)
    order, mask_shape, mask_region, back = _mask_geometry(x, mask_dims)
    keep = MASKS.keep_mask(mask_shape, seed, mask_region, p)
    return keep if order is None else keep.transpose(back)


def _mask_geometry(x: Any, mask_dims: Any) -> tuple:
    """(the permutation `mask_dims` checked, or None; the mask's global shape and this rank's region of it,
    in that order; the permutation that puts the mask's dims back in x's) for dropout on x: a function of
    x's layout, global shape and rank and of `mask_dims`, remembered by the layout object (a step's
    dropouts ask for the same few; the entry holds the layout, so its id is not reused)."""
    layout, shape, rank = x._layout, x._shape, x._mesh.rank
    key = (id(layout), shape, rank, mask_dims)
    try:
        seen = _GEOMETRY.get(key)
    except TypeError:  # mask_dims as a list: worked out each time
        seen = key = None
    if seen is not None and seen[0] is layout:
        return seen[1]
    region = layout.slices(rank, shape)
    if mask_dims is None:
        out = (None, tuple(shape), region, None)
    else:
        order = _permutation(mask_dims, len(region))
        out = (order, tuple(shape[d] for d in order), tuple(region[d] for d in order),
               tuple(np.argsort(order).tolist()))
    if key is not None and type(shape) is tuple:
        put(_GEOMETRY, key, (layout, out), 1024)
    return out


_GEOMETRY: dict = {}  # (id(layout), global shape, rank, mask_dims) -> (that layout, _mask_geometry's answer)


def _permutation(dims: Any, ndim: int) -> tuple:
    """`dims` as a tuple of ints, checked to be a permutation of range(ndim)."""
    try:
        order = tuple(operator.index(d) for d in dims)
    except TypeError:
        order = None
    if order is None or sorted(order) != list(range(ndim)):
        raise OperatorError(f"dropout: mask_dims {dims!r} must be a permutation of the tensor's {ndim} dims, "
                            f"e.g. {tuple(range(ndim))[::-1]!r}")
    return order
