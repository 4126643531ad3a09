"""Layer and RMS norms' row normalization along a whole dim: one local kernel and one autograd node.

spmdsim.nn.ops.norms (layer_norm, rms_norm) and spmdsim.nn.ops.fused (norm_affine) call it where a row is
whole on every rank (sequence parallel, replicated)."""
from __future__ import annotations

from typing import Any

import numpy as np

from ...base.buffers import CAPTURE, broadcast_zero
from ...base.context import _THREAD  # the running thread's context (its engine, without current()'s call)
from ..autograd.rules.norms import record_normalized
from ...runtime.engines import local as _engine_local  # the kernel; the dry engine's zeros, not computed
from ...base import flops as _flops
from ...base.flops import sweep
from ...base.precision import is_low, rounded, wide
from . import _common
from ._common import shaped_as

_SUM = np.add.reduce  # ndarray.sum's own kernel, without its Python wrapper (numpy's _methods._sum)
_ndarray = np.ndarray
_new = object.__new__


def _normalize(block: np.ndarray, d: int, n: int, eps: float, centre: bool) -> tuple[np.ndarray, np.ndarray]:
    """(y, 1 / sqrt(var + eps)) of rows along a whole dim `d` of `n` entries, in the composite's order of
    operations (its sums, products and quotient), so the values are the composite's."""
    inv = 1.0 / n
    c = block - _SUM(block, axis=d, keepdims=True) * inv if centre else block
    var = _SUM(c * c, axis=d, keepdims=True) * inv
    root = np.sqrt(var + eps)
    return c / root, 1.0 / root


def _normalized(x: Any, d: int, eps: float, centre: bool, op: str) -> Any:
    """layer_norm's (``centre``) or rms_norm's normalization along a whole dim: one local kernel and one
    autograd node (spmdsim.nn.autograd.rules.norms: dX = r (dY - mean(dY) - y mean(dY y)), rms without
    mean(dY), shard by shard).

    The composite of the general rules would take nine operators (and their nodes) where a row is whole on
    every rank: the sequence-parallel and replicated layer norms of a transformer.
    """
    out, y, kept = normal_values(x, d, eps, centre, op)
    if x._ag is None:
        return out
    return record_normalized(out, x, y, kept, d, centre, op)


def normal_values(x: Any, d: int, eps: float, centre: bool, op: str) -> tuple:
    """`_normalized`'s forward without its node: (the normalized DTensor, its block, {"rstd": 1 / sqrt(var +
    eps)} kept for the rule where x takes a gradient: a dry run's zeros), its kernel counted
    (spmdsim.nn.ops.norm_affine records it with its weight and bias as one node)."""
    n = x._shape[d]
    kept: dict[str, np.ndarray] = {}  # 1 / sqrt(var + eps), for the gradient rule (a dry run's: zeros)
    if not CAPTURE.on and (local := x._local).dtype.kind != "V" and not _THREAD.context.engine.dry:
        # The kernel below on the running engine, called as that engine calls it, without its frames: no
        # bfloat16 block to widen, y rounded only where its dtype is not the block's (`rounded`'s test)
        # `_normalize` written out (its numpy calls, in its order: the same values), without its frame and tuple
        inv = 1.0 / n
        c = local - _SUM(local, axis=d, keepdims=True) * inv if centre else local
        root = np.sqrt(_SUM(c * c, axis=d, keepdims=True) * inv + eps)
        y = c / root
        kept["rstd"] = 1.0 / root
        if type(y) is _ndarray and y.dtype is local.dtype and y.shape == local.shape and y.flags.c_contiguous \
                and _common._DTENSOR is not None:  # shaped_as's usual case, its DTensor built here
            out = _new(_common._DTENSOR)
            out._mesh, out._local, out._layout, out._shape, out._ag = x._mesh, y, x._layout, x._shape, None
        else:
            if y.dtype != local.dtype:
                y = rounded(y, local.dtype)
            out = shaped_as(x, y, x._layout)
    else:
        def kernel(block: np.ndarray) -> np.ndarray:
            # bfloat16: the statistics and y in float32, y rounded once (spmdsim.base.precision)
            y, kept["rstd"] = _normalize(wide(block), d, n, eps, centre)
            return rounded(y, block.dtype)

        local = x._local if not CAPTURE.on else x.local  # this rank's block, read once (captured: its record's view)
        y = _engine_local(kernel, local, local)
        out = shaped_as(x, y, x._layout)
    if _flops._OPEN:  # (any_open()'s test, without its call) else nothing is counted: no blocks to gather
        rows = local.shape[:d] + (1,) + local.shape[d + 1:]
        sweep(op, (local,), (y, (rows, y.dtype) if x._ag is not None else None))  # y and the kept 1 / root
    if x._ag is not None and x.mesh.engine.dry:  # the rstd the rule keeps, sized (the dry engine's zeros): kept
        rows = local.shape[:d] + (1,) + local.shape[d + 1:]
        stat = np.float32 if is_low(y.dtype) else y.dtype  # bytes measure alike (bfloat16's statistics: float32)
        kept["rstd"] = _engine_local(np.copy, broadcast_zero(rows, stat), y)
    return out, y, kept
