"""Ops that need no communication but work along whole dims: transpose, reshape and softmax.

transpose permutes the dims and the tensor map with them (each rank permutes
its own shard); reshape splits and merges dims when each rank's block stays a
block (the head split of attention, (S, H*D) -> (S, H, D) with H split);
softmax normalises along a dim that is whole on every rank and
refuses a split one, where no rank could see a whole row. With matmul's
``transpose_b`` they let an attention block stay on DTensors.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from ...references import forward as reference
from ..autograd.rules.norms import record_softmax
from ..autograd.rules.shapes import record_reshape, record_transpose
from ...programs.infer import infer_reshape, infer_softmax, infer_transpose
from ...runtime.engines import local as engine_local
from ...base.flops import any_open, sweep
from ...base.buffers import CAPTURE
from ._common import _ints, make_dtensor
from ._operands import raise_if_not_dtensors, require_float
from ...base.tables import put

__all__ = ["transpose", "reshape", "softmax"]


def transpose(x: Any, perm: Optional[Sequence[int]] = None) -> Any:
    """x with its dims permuted by `perm` (None reverses them), like numpy.transpose; no communication."""
    try:
        layout, dims = infer_transpose(x.layout, perm)
    except AttributeError:
        raise_if_not_dtensors("transpose", ("x",), x)
        raise
    # make_dtensor copies the permuted view into C order, as the collectives read it.
    out = make_dtensor(x.mesh, np.transpose(x.local, dims), layout, tuple(x.global_shape[d] for d in dims))
    return out if x._ag is None else record_transpose(out, x, dims)


def reshape(x: Any, shape: Any) -> Any:
    """x with global shape `shape` (one -1 allowed), like numpy.reshape; no communication.

    Each rank reshapes its own shard; refused when its block would not be a
    block of the new dims (then redistribute the named dims whole first).
    """
    try:
        source, old_shape, rank = x._layout, x._shape, x._mesh.rank
    except AttributeError:
        raise_if_not_dtensors("reshape", ("x",), x)
        raise
    # By the layout object, for shapes of Python ints (16.0 equals 16 and hashes alike, and must be refused
    # again): the entry holds the layout, so its id is not reused; a model reshapes the same few ways.
    # The sizes' types in the key (in C, cheaper than a call to _ints): 16.0 finds no entry of 16.
    key = (id(source), old_shape, shape, rank, tuple(map(type, shape))) if type(shape) is tuple else None
    try:
        seen = _RESHAPED.get(key) if key is not None else None
    except TypeError:  # a size that does not hash (x.reshape([4], 4)): refused by infer_reshape below, not kept
        key = seen = None
    if seen is not None and seen[0] is source:
        layout, new_shape, block_shape = seen[1]
        if not CAPTURE.on:
            block = x._local.reshape(block_shape)
            if block.flags.c_contiguous:  # make_dtensor's checks, passed by this key's first result: built here
                out = _new(type(x))
                out._mesh, out._local, out._layout, out._shape, out._ag = x._mesh, block, layout, new_shape, None
                return out if x._ag is None else record_reshape(out, x)
    else:
        layout, new_shape = infer_reshape(source, old_shape, shape)
        block_shape = layout.local_shape(new_shape, rank)
    out = make_dtensor(x._mesh, x.local.reshape(block_shape), layout, new_shape)
    if key is not None and seen is None and _ints(shape) and type(out) is type(x):
        put(_RESHAPED, key, (source, (layout, new_shape, block_shape)), 1024)
    return out if x._ag is None else record_reshape(out, x)


_new = object.__new__
# (id(layout), global shape, new shape, rank, the sizes' types) -> (that layout, (the result's layout, its
# global shape, this rank's block shape)): infer_reshape's answer and the block's shape, the pure function of
# its key, kept once make_dtensor built a result of them (its checks passed: a repeated call builds its own).
_RESHAPED: dict = {}


def softmax(x: Any, dim: int = -1) -> Any:
    """softmax along `dim` of a floating x; `dim` must be whole on every rank (not split, not a pending sum)."""
    try:
        layout, d = infer_softmax(x.layout, dim)
    except AttributeError:
        raise_if_not_dtensors("softmax", ("x",), x)
        raise
    local = x._local if not CAPTURE.on else x.local  # this rank's block, read once (captured: its record's view)
    require_float("softmax", local)
    out = make_dtensor(x.mesh, engine_local(reference.softmax, local, local, d), layout, x.global_shape)
    if any_open():  # else nothing is counted: no blocks to gather
        sweep("softmax", (local,), (out.local,))
    return out if x._ag is None else record_softmax(out, x, d)
