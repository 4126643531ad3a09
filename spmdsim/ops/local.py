"""Ops that need no communication but work along whole dims: transpose and softmax.

transpose permutes the dims and the tensor map with them (each rank permutes
its own shard); softmax normalises along a dim that is whole on every rank and
refuses a split one, where no rank could see a whole row. With matmul's
``transpose_b`` they let an attention block stay on DTensors.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from .. import reference
from ._common import make_dtensor, raise_if_not_dtensors
from .infer import infer_softmax, infer_transpose

__all__ = ["transpose", "softmax"]


def transpose(x: Any, perm: Optional[Sequence[int]] = None) -> Any:
    """x with its dims permuted by `perm` (None reverses them), like numpy.transpose; no communication."""
    try:
        layout, dims = infer_transpose(x.layout, perm)
    except AttributeError:
        raise_if_not_dtensors("transpose", ("x",), x)
        raise
    # make_dtensor copies the permuted view into C order, as the collectives read it.
    return make_dtensor(x.mesh, np.transpose(x.local, dims), layout, tuple(x.global_shape[d] for d in dims))


def softmax(x: Any, dim: int = -1) -> Any:
    """softmax along `dim`, which must be whole on every rank (not split, not a pending sum)."""
    try:
        layout, d = infer_softmax(x.layout, dim)
    except AttributeError:
        raise_if_not_dtensors("softmax", ("x",), x)
        raise
    return make_dtensor(x.mesh, reference.softmax(x.local, d), layout, x.global_shape)
