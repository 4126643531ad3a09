"""Scaled dot-product attention's sharding rule (pure): which layouts its operands must take, and its output's.

Operands are laid out (batch, sequence, heads, head dim), as a transformer
holds them after splitting its projections into heads: q (B, Tq, H, D),
k (B, Tk, H, D), v (B, Tk, H, E); the output is (B, Tq, H, E).

| dim of q | may be split? | k and v there |
| --- | --- | --- |
| batch B | yes, any axes | split alike (each rank's samples) |
| query sequence Tq | yes (each rank its own query rows) | whole: every key is read by every query |
| heads H | yes (tensor parallel: each rank its own heads) | split alike |
| head dim D | no: a score sums over it, and softmax needs whole scores | whole |

k and v may have fewer heads than q, Hk dividing H (grouped-query attention, as flash attention takes
it): query head i reads key/value head i // (H / Hk). Their heads are split as q's (each rank its own
query heads and the key/value heads they read) where those axes divide Hk; else every operand's heads are
whole.

A key mask (B, Tk), bool, True where a key takes part (PyTorch's boolean
convention; False: padding), goes to q's batch split with the keys whole.

An operand laid out otherwise, or holding a pending sum, is redistributed to
its target first (the least-bytes plan of spmdsim.programs.plan). The output takes q's
target layout. In the backward, the gradients of k and v sum over the query
rows, so where Tq is split they are pending sums over its axes (the engine
resolves them where their layout needs it); q's gradient is whole.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from ...errors import OperatorError, ShapeError
from ...layouts.layout import TensorLayout

__all__ = ["AttentionPlan", "infer_attention", "refuse_empty"]


@dataclass(frozen=True)
class AttentionPlan:
    """Where q, k and v go, the output's layout and shape, and the axes the query rows are split over."""

    q: TensorLayout
    kv: TensorLayout
    out: TensorLayout
    shape: tuple
    query_axes: tuple  # the mesh axes splitting Tq (of size above one): k's and v's gradients are pending there
    mask: Optional[TensorLayout] = None  # where a key mask (B, Tk) goes: q's batch split, keys whole

    def why(self) -> str:
        split = f"query rows split over {self.query_axes!r}" if self.query_axes else "query rows whole"
        return f"attention: batch and heads as q's, keys and head dims whole, {split}"


@lru_cache(maxsize=1024)  # a transformer asks the same question in every layer of every step
def infer_attention(q: TensorLayout, k: TensorLayout, v: TensorLayout, q_shape: tuple, k_shape: tuple,
                    v_shape: tuple, causal: bool = False, mask: Optional[TensorLayout] = None,
                    mask_shape: Optional[tuple] = None) -> AttentionPlan:
    """The plan of attention(q, k, v) on these layouts and global shapes (see the module's table)."""
    for name, layout, shape in (("q", q, q_shape), ("k", k, k_shape), ("v", v, v_shape)):
        if len(shape) != 4:
            raise ShapeError(f"attention: {name} of global shape {tuple(shape)!r} has {len(shape)} dims; expected "
                             "4, (batch, sequence, heads, head dim)")
    for name, layout in (("k", k), ("v", v)):
        if layout.layout != q.layout:
            raise OperatorError(f"attention: {name} is on {layout.layout} but q on {q.layout}; expected one "
                                "device matrix")
    (b, tq, h, d), (kb, tk, kh, kd), (vb, vt, vh, e) = q_shape, k_shape, v_shape
    if (kb, kd) != (b, d) or not kh or h % kh:
        raise ShapeError(f"attention: k of global shape {tuple(k_shape)!r} does not fit q's {tuple(q_shape)!r}; "
                         "expected the same batch and head dim, and heads that divide q's (grouped-query "
                         "attention: each key/value head serves H / Hk query heads)")
    if (vb, vt, vh) != (kb, tk, kh):
        raise ShapeError(f"attention: v of global shape {tuple(v_shape)!r} does not fit k's {tuple(k_shape)!r}; "
                         "expected the same batch, sequence and heads")
    if causal and tq != tk:
        raise ShapeError(f"attention: causal with {tq} queries and {tk} keys; expected as many queries as keys")
    matrix = q.layout
    qmap = q.tensor_map
    heads = qmap[2]
    if kh != h and kh % math.prod(matrix.axis_size(a) for a in heads):
        heads = ()  # grouped-query attention: each rank the key/value heads its query heads read, or all heads whole
    target_q = matrix(qmap[0], qmap[1], heads, None)
    target_kv = matrix(qmap[0], None, heads, None)
    query_axes = tuple(a for a in qmap[1] if matrix.axis_size(a) > 1)
    target_q.check_shape(q_shape)  # each raises a ShapeError naming the dim that does not divide
    target_kv.check_shape(k_shape)
    target_kv.check_shape(v_shape)
    target_mask = None
    if mask is not None:
        if mask.layout != q.layout:
            raise OperatorError(f"attention: mask is on {mask.layout} but q on {q.layout}; expected one device matrix")
        if tuple(mask_shape) != (b, tk):
            raise ShapeError(f"attention: mask of global shape {tuple(mask_shape)!r}; expected (batch, keys) "
                             f"{(b, tk)!r}, True where a key takes part")
        target_mask = matrix(qmap[0], None)
    return AttentionPlan(target_q, target_kv, target_q, (b, tq, h, e), query_axes, target_mask)


def refuse_empty(op: str, q_shape: tuple, k_shape: tuple, sequence: int = 1) -> None:
    """`op`'s ShapeError where q or k of these global shapes (4 dims, the sequence dim `sequence`, heads and head
    dim last) has no heads or a head dim of 0, or k no keys: its scores (sums of no products, scaled by 1 /
    sqrt(0)) or each query row's softmax (over no keys) have no answer. No query rows, or no batch, pass: their
    result is the empty one. Other shapes pass (infer_attention refuses them)."""
    for name, shape in (("q", q_shape), ("k", k_shape)):
        if len(shape) != 4:
            return
        if not shape[2]:
            raise ShapeError(f"{op}: {name} of global shape {tuple(shape)!r} has 0 heads (dim 2); expected at least 1 "
                             "head")
        if not shape[3]:
            raise ShapeError(f"{op}: {name} of global shape {tuple(shape)!r} has a head dim of 0 (dim 3): its scores "
                             "would be sums of no products, scaled by 1 / sqrt(0); expected a head dim of at least 1")
    if not k_shape[sequence]:
        raise ShapeError(f"{op}: k of global shape {tuple(k_shape)!r} has 0 keys (dim {sequence}): each query row's "
                         "softmax would be over no keys; expected at least 1 key")
