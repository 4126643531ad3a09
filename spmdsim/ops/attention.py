"""Scaled dot-product attention on DTensors: one operator and one autograd node for a transformer's core.

``attention(q, k, v, causal=, scale=, dropout=, seed=)`` is
``softmax(q k^T * scale [+ causal mask]) [dropout] v`` per sample and head,
on (batch, sequence, heads, head dim) operands: PyTorch's
``scaled_dot_product_attention`` with the heads as the third dim. Its
sharding rule is spmdsim.infer.attention's (batch, query rows and heads may
be split; keys and head dims are whole); operands laid out otherwise are
redistributed first. Each rank computes its own samples', heads' and query
rows' scores, softmax and weighted values locally: nothing moves forward.

The values are the composite's (``einsum``, ``* scale``, ``masked_fill``,
``softmax``, ``dropout``, ``einsum``: examples/causal_attention.py), the
dropout mask included (``SeededTensor((B, H, Tq, Tk), seed)`` at this rank's
region, as ``ops.dropout`` draws it on the probabilities), but one node
instead of six, so a transformer's step records and walks fewer.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import Any, Optional

import numpy as np

from ..autograd.graph import record, with_partial
from ..autograd.rules import grad_tensor
from ..engines import local as _engine_local  # the kernel; the dry engine's zeros, not computed
from ..errors import OperatorError
from ..infer.attention import infer_attention
from ._common import keep_mask, make_dtensor, raise_if_not_dtensors, require_float, seed_arg

__all__ = ["attention"]


def attention(q: Any, k: Any, v: Any, *, causal: bool = False, scale: Optional[float] = None,
              dropout: float = 0.0, seed: Optional[int] = None, training: bool = True, mask: Any = None) -> Any:
    """softmax(q k^T * scale, masked above the diagonal if `causal`), dropped out, times v.

    q (B, Tq, H, D), k (B, Tk, H, D), v (B, Tk, H, E) -> (B, Tq, H, E). `scale`: default 1 / sqrt(D).
    `dropout`: the probabilities' dropout rate (while `training`), with `seed` as ops.dropout's.
    `mask`: a bool DTensor (B, Tk), True where a key takes part and False for padding (PyTorch's
    boolean convention), moved to q's batch split with the keys whole; a query row that sees no key
    gets NaN, as a softmax over nothing.
    """
    raise_if_not_dtensors("attention", ("q", "k", "v"), q, k, v)
    if not isinstance(causal, (bool, np.bool_)):
        raise OperatorError(f"attention: causal {causal!r} must be True or False")
    if not isinstance(dropout, Real) or isinstance(dropout, bool) or not 0 <= dropout < 1:
        raise OperatorError(f"attention: dropout {dropout!r} must be a number with 0 <= p < 1")
    drop = float(dropout) if training else 0.0
    if drop and seed is None:
        raise OperatorError("attention: dropout needs a seed (an integer, different per layer and step), so "
                            "every rank draws the same mask")
    if seed is not None:
        seed_arg(seed, "attention")
    for name, t in (("q", q), ("k", k), ("v", v)):
        require_float("attention", t.local)
        if t.mesh is not q.mesh:
            raise OperatorError(f"attention: {name} is on another mesh than q; expected one mesh")
    if mask is not None:
        raise_if_not_dtensors("attention", ("mask",), mask)
        if mask.local.dtype != np.dtype(bool):
            raise OperatorError(f"attention: mask must be a bool DTensor (True where a key takes part), got dtype "
                                f"{mask.local.dtype.name!r}")
        if mask.mesh.layout != q.mesh.layout:
            raise OperatorError("attention: mask is on another mesh than q; expected one mesh")
    plan = infer_attention(q.layout, k.layout, v.layout, tuple(q.global_shape), tuple(k.global_shape),
                           tuple(v.global_shape), bool(causal), None if mask is None else mask.layout,
                           None if mask is None else tuple(mask.global_shape))
    d = q.global_shape[3]
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    elif not isinstance(scale, Real) or isinstance(scale, bool) or not math.isfinite(scale):
        raise OperatorError(f"attention: scale {scale!r} must be a finite number")
    q, k, v = _moved(q, plan.q), _moved(k, plan.kv), _moved(v, plan.kv)
    mesh = q.mesh
    b_, t_, h_ = q.slices[:3]
    tk = k.global_shape[1]
    above = None
    if causal:  # this rank's query rows (global indices) against every key
        rows = np.arange(t_.start, t_.stop)[:, None]
        above = np.arange(tk)[None, :] > rows
    if mask is not None:  # (b, 1, 1, Tk): padding keys, for every head and query row
        padding = ~_moved(mask, plan.mask).local[:, None, None, :]
        above = padding if above is None else above | padding
    keep = None
    if drop:
        probs_shape = (q.global_shape[0], q.global_shape[2], q.global_shape[1], tk)
        region = (b_, h_, t_, slice(0, tk))
        keep = keep_mask(probs_shape, seed, region, drop)
    factor = np.asarray(1.0 / (1.0 - drop), q.dtype) if drop else None
    kept: dict = {}  # the probabilities, before and after dropout, for the backward (a dry run keeps none)

    # Per sample and head, (Tq, D) @ (D, Tk) and (Tq, Tk) @ (Tk, E): batched BLAS products on the blocks'
    # (b, h, ...) views (np.einsum's own loops took several times as long).
    def forward(qb: np.ndarray, kb: np.ndarray, vb: np.ndarray) -> np.ndarray:
        s = np.matmul(qb.transpose(0, 2, 1, 3), kb.transpose(0, 2, 3, 1)) * scale
        if above is not None:
            s = np.where(above, -np.inf, s)
        e = np.exp(s - np.max(s, axis=-1, keepdims=True))
        p = e / np.sum(e, axis=-1, keepdims=True)
        pd = p if keep is None else p * keep * factor
        kept["p"], kept["pd"] = p, pd
        return np.matmul(pd, vb.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)

    like = np.broadcast_to(np.zeros((), q.dtype), plan.out.local_shape(plan.shape))  # the result's block
    out = make_dtensor(mesh, _engine_local(forward, like, q.local, k.local, v.local), plan.out, plan.shape)
    if q._ag is None and k._ag is None and v._ag is None:
        return out

    def grads(dy: np.ndarray) -> tuple:
        p, pd = kept["p"], kept["pd"]
        dyh = dy.transpose(0, 2, 1, 3)  # (b, h, q, e)
        dpd = np.matmul(dyh, v.local.transpose(0, 2, 3, 1))
        dv = np.matmul(pd.transpose(0, 1, 3, 2), dyh).transpose(0, 2, 1, 3)
        dp = dpd if keep is None else dpd * keep * factor
        ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True)) * scale
        dq = np.matmul(ds, k.local.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        dk = np.matmul(ds.transpose(0, 1, 3, 2), q.local.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        return dq, dk, dv

    def backward(dy: Any) -> tuple:
        if not kept:  # a dry run: zeros of each operand's block
            dq, dk, dv = (np.zeros(t.local.shape, t.dtype) for t in (q, k, v))
        else:
            dq, dk, dv = grads(dy.local)
        pending = dy.layout.partial
        return (grad_tensor(q, dq, pending) if q._ag is not None else None,
                grad_tensor(k, dk, pending, plan.query_axes) if k._ag is not None else None,
                grad_tensor(v, dv, pending, plan.query_axes) if v._ag is not None else None)

    return record(out, plan.why, (q, k, v), backward, with_partial(plan.out, ()))


def _moved(x: Any, target: Any) -> Any:
    if x.layout == target:
        return x
    from ..runtime.executor import redistribute

    return redistribute(x, target)
