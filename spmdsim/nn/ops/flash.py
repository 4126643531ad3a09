"""FlashAttention-2's forward (`attention(..., flash=True)`, spmdsim.nn.ops.attention's docstring): the scores in
tiles of query rows, each row's log-sum-exp kept, no scores; and the core's result tensor both paths build."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...base import buffers
from ...base.buffers import CAPTURE, broadcast_zero
from ..autograd.rules.attention import count_flash, grouped_product, record_flash
from ...base.flops import any_open
from ...runtime.engines import local as _engine_local  # the kernel; the dry engine's zeros, not computed
from ...base.precision import rounded, wide
from . import _common
from ._common import _PLAIN_DTYPES, MASKS, make_dtensor

_SUM = np.add.reduce  # ndarray.sum's own kernel, without its Python wrapper (numpy's _methods._sum)
_new = object.__new__


def _result(mesh: Any, forward: Callable, like: Any, q: Any, k: Any, v: Any, decided: Any) -> Any:
    """The core's result: `forward` run on the three blocks by the engine (`like` the result's block, a dry run's
    zeros), as a DTensor of the signature's layout and shape (the unfused core's and flash's alike)."""
    blocks = (q._local, k._local, v._local) if not CAPTURE.on else (q.local, k.local, v.local)  # (captured: views)
    block = _engine_local(forward, like, *blocks)
    if type(block) is np.ndarray and block.shape == decided.block and block.dtype in _PLAIN_DTYPES \
            and decided.out.layout is mesh.layout and _common._DTENSOR is not None and not CAPTURE.on \
            and not mesh.engine.dry:
        # make_dtensor's trusted case (the signature's layout and shape, this rank's block shape), the DTensor
        # built here without its frame and its checks' lookup; a strided block copied to C order as its
        # c_order copies it (no dry run's, no capture's here)
        if not block.flags.c_contiguous:
            block = block.copy()
        out = _new(_common._DTENSOR)
        out._mesh, out._local, out._layout, out._shape, out._ag = mesh, block, decided.out, decided.shape, None
        return out
    return make_dtensor(mesh, block, decided.out, decided.shape)


def _flash(q: Any, k: Any, v: Any, decided: Any, seed: Any, padding: Any, causal: bool) -> Any:
    """`attention(..., flash=True)`: FlashAttention-2's forward over `decided.tiles` (the module's docstring),
    the node keeping q, k, v, the output and the rows' log-sum-exp (spmdsim.nn.autograd.rules.attention's
    `record_flash`: its backward per tile)."""
    heads, keys_t, back, groups = decided.heads, decided.keys_t, decided.back, decided.groups
    scale, drop, dtype, low, tk, t_ = decided.scale, decided.drop, decided.dtype, decided.low, decided.tk, decided.t_
    probs_shape, tiles = decided.probs_shape, decided.tiles
    inner = np.dtype(np.float32) if low else dtype  # the scores', softmax's and log-sum-exp's dtype
    factor = np.asarray(1.0 / (1.0 - drop), inner) if drop else None

    def scores(qt: np.ndarray, kt: np.ndarray, start: int, stop: int) -> np.ndarray:
        """The tile of local query rows [start, stop)'s scaled scores against every key, masked to -inf."""
        s = grouped_product(qt, kt, groups) * scale
        where = decided.positions
        if not causal:
            above = None
        elif where is None:
            above = np.arange(tk)[None, :] > np.arange(t_.start + start, t_.start + stop)[:, None]
        else:  # the sequence laid out in another order: its true positions
            above = where[None, :tk] > where[t_.start + start:t_.start + stop][:, None]
        if padding is not None:
            above = padding if above is None else above | padding
        return s if above is None else np.where(above, -np.inf, s)

    def probs(p: np.ndarray, region: tuple) -> tuple:
        """A tile's (p, dropped-out p, factors or None), rounded as the composite's (`attention`'s `masks`)."""
        factors = np.multiply(MASKS.keep_mask(probs_shape, seed, region, drop), factor) if drop else None
        if low:
            p = rounded(p, dtype)
            return p, (p if factors is None else rounded(wide(p) * factors, dtype)), factors
        return p, (p if factors is None else p * factors), factors

    saved: dict = {}  # the output "o" (b, h, tq, e) and the rows' log-sum-exp "lse" (b, h, tq)

    def forward(qb: np.ndarray, kb: np.ndarray, vb: np.ndarray) -> np.ndarray:
        qh, kt, vh = qb.transpose(heads), kb.transpose(keys_t), vb.transpose(heads)
        # the output in the operands' order, written through its (b, h, t, e) view (as FlashAttention-2 writes
        # O): the block the next product reads, a reshape of it a view, so one buffer is kept for both
        result = buffers.empty(decided.block, dtype)
        o = result.transpose(heads)
        lse = buffers.empty(qh.shape[:3], inner)
        for start, stop, region in tiles:
            s = scores(qh[:, :, start:stop], kt, start, stop)
            top = s.max(axis=-1, keepdims=True)
            e = np.exp(s - top)
            total = _SUM(e, axis=-1, keepdims=True)
            lse[:, :, start:stop] = (top + np.log(total))[..., 0]
            pd = probs(e / total, region)[1]
            o[:, :, start:stop] = rounded(grouped_product(pd, vh, groups), dtype)
        saved["o"], saved["lse"] = o, lse
        return result

    mesh = q._mesh
    like = broadcast_zero(decided.block, dtype)  # the result's block
    out = _result(mesh, forward, like, q, k, v, decided)
    grads = not (q._ag is None and k._ag is None and v._ag is None)
    if mesh.engine.dry:  # what the rule keeps, sized: the dry engine's zeros, never touched
        lse_like = broadcast_zero(decided.scores[:3], inner)
        saved.update(o=out.local.transpose(heads), lse=_engine_local(np.copy, lse_like, lse_like))
    if any_open():  # its products and its one kernel a tile (spmdsim.base.flops)
        count_flash(q.local, k.local, v.local, saved["o"], saved["lse"], (heads, keys_t, back), decided.tile_rows,
                    causal)
    if not grads:
        return out
    return record_flash(out, q, k, v, decided.plan, saved, scores, probs, tiles, scale, (heads, keys_t, back),
                        groups, decided.tile_rows, causal)
