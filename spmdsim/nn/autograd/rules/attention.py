"""Gradient rule of scaled dot-product attention (`spmdsim.nn.ops.attention`), one node for the whole block.

Each rank holds its own samples', heads' and query rows' probabilities from
the forward and works out dQ, dK and dV from them locally: dQ is whole, dK
and dV are pending over the axes that split the query rows (each rank's
queries read every key). With selective recomputation the forward keeps none of the core
(probabilities, dropout mask, dropped-out probabilities): the rule computes them again first.

Grouped-query attention (k and v with H / G heads, each serving G query heads) runs in the products
themselves, as flash attention's kernels do: a group's G query heads are multiplied by their one key/value
head (`grouped_product`), and dK and dV sum the group's G heads within one product over their G·Tq rows
(`grouped_sum`); no key or value head is repeated.

Flash attention (`record_flash`, spmdsim.nn.ops.attention's ``flash=True``) keeps q, k, v, the output O and each
query row's log-sum-exp, and works per tile of query rows as FlashAttention-2's backward: the tile's
probabilities made again as exp(scores - lse) (the dropout mask drawn again at the tile's region), D =
rowsum(dO * O), dS = P * (dP - D) * scale, the tile's dQ rows, and dK, dV summed over the tiles.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ....base.precision import is_low, product, wide  # np.matmul; bfloat16 blocks widened to float32
from ....base import buffers

from ....base.context import current
from ....base.flops import any_open, gemm, sweep
from ..graph import record, with_partial
from .grads import grad_tensor

_SUM = np.add.reduce  # ndarray.sum's own kernel, without its Python wrapper (numpy's _methods._sum)
_matmul = np.matmul

__all__ = ["record_attention", "record_flash", "count_core", "count_core_kernels", "count_flash", "grouped_product",
           "grouped_sum"]


def grouped_product(a: np.ndarray, b: np.ndarray, groups: int) -> np.ndarray:
    """a @ b per sample and head, a (n, h, m, k) and b (n, h / groups, k, p): head i of a times head
    i // groups of b (grouped-query attention), (n, h, m, p); `groups` 1: product(a, b) itself."""
    if groups == 1:
        if a.dtype.kind != "V" and b.dtype.kind != "V" and b.ndim != 2:  # product's and precision.matmul's usual
            return _matmul(a, b)  # case (no bfloat16, no stack of rows times one matrix): numpy's, without their frames
        return product(a, b)
    n, h = a.shape[:2]
    out = product(a.reshape(n, h // groups, groups, *a.shape[2:]), b[:, :, None])
    return out.reshape(n, h, *out.shape[-2:])


def grouped_sum(a: np.ndarray, b: np.ndarray, groups: int) -> np.ndarray:
    """Per sample, the sum over each group of `groups` consecutive heads of a_i^T b_i, a (n, h, m, k) and
    b (n, h, m, p): (n, h / groups, k, p), one product over the group's groups·m rows (dK = dS^T Q and
    dV = Pd^T dY of grouped-query attention); `groups` 1: a^T b per head."""
    if groups == 1:
        if a.dtype.kind != "V" and b.dtype.kind != "V" and b.ndim != 2:  # (as grouped_product's)
            return _matmul(a.transpose(0, 1, 3, 2), b)
        return product(a.transpose(0, 1, 3, 2), b)
    n, h, m = a.shape[:3]
    rows = (n, h // groups, groups * m)
    return product(a.reshape(*rows, a.shape[-1]).transpose(0, 1, 3, 2), b.reshape(*rows, b.shape[-1]))


def _grouped_shapes(a: tuple, b: tuple) -> tuple:
    """The shapes `grouped_product` multiplies for operands shaped a (n, h, m, k) and b (n, hk, k, p)."""
    if a[1] == b[1]:
        return a, b
    return (a[0], b[1], a[1] // b[1]) + a[2:], (b[0], b[1], 1) + b[2:]


def _summed_shapes(a: tuple, b: tuple, heads: int) -> tuple:
    """The shapes `grouped_sum` multiplies for a (n, h, m, k), b (n, h, m, p) into `heads` heads."""
    n, h, m = a[:3]
    if h == heads:
        return a[:2] + a[:-3:-1], b
    return (n, heads, a[3], h // heads * m), (n, heads, h // heads * m, b[3])


def count_core(q: np.ndarray, k: np.ndarray, v: Optional[np.ndarray], order: tuple, saved: Optional[dict] = None,
               out: Optional[np.ndarray] = None) -> None:
    """Count (spmdsim.base.flops) the core's products on these blocks, whether or not its kernel runs (a dry
    run's does not): the scores q k^T and, given `v`, the weighted values probs @ v; `order` as
    record_attention's. Each product is counted with its operands' blocks themselves (spmdsim.base.flops.gemm:
    q, k and v, which the rule keeps, are blocks the rank holds), the dropped-out probabilities as `saved`'s
    "pd" (count_core_kernels's `saved`) and the result as `out` where given, else blocks of their shapes."""
    heads, keys_t, _ = order
    qs, ks = _seen(q.shape, heads), _seen(k.shape, keys_t)  # (b, h, tq, d), (b, hk, d, tk)
    dtype = q.dtype
    scores = (qs[:-1] + ks[-1:], dtype)  # (b, h, tq, tk)
    gemm(*_grouped_shapes(qs, ks), dtype, (q, k, scores))
    if v is not None:
        vs = _seen(v.shape, heads)
        gemm(*_grouped_shapes(scores[0], vs), dtype, (_own(saved, "pd", scores), v,
                                                      (scores[0][:-1] + vs[-1:], dtype) if out is None else out))


def count_core_kernels(block: tuple, drop: float, kept: str, saved: Optional[dict] = None) -> None:
    """Count (spmdsim.base.flops.sweep) the core's element-wise kernels over its (b, h, tq, tk) scores `block`
    (a (shape, dtype) pair), as fused kernels run them: the scaled, masked softmax (scores read,
    probabilities written) and, with dropout, the dropout (probabilities read; dropped-out values and
    the mask written: Megatron's boolean mask under `kept` "megatron", the float factors otherwise).
    `saved`: what the rule keeps for backward (record_attention's `kept`), counted as those blocks themselves
    (spmdsim.base.flops: blocks the rank holds), each where its shape and dtype are the count's."""
    mask = (block[0], bool) if kept == "megatron" else block
    p, pd, bits = (_own(saved, name, like) for name, like in (("p", block), ("pd", block),
                                                              ("keep" if kept == "megatron" else "factors", mask)))
    sweep("attention softmax", (block,), (p,))
    if drop:
        sweep("attention dropout", (p,), (pd, bits))


def _count_backward_kernels(block: tuple, drop: float, kept: str, saved: Optional[dict] = None) -> None:
    """The backward's element-wise kernels over the scores: the dropout's (its gradient and the mask or
    factors read, the probabilities' gradient written) and the softmax's (that gradient and the
    probabilities read, the scores' gradient written, the scale folded in); `saved` as count_core_kernels's."""
    mask = (block[0], bool) if kept == "megatron" else block
    if drop:
        sweep("attention dropout", (block, _own(saved, "keep" if kept == "megatron" else "factors", mask)), (block,))
    sweep("attention softmax", (block, _own(saved, "p", block)), (block,))


def _own(saved: Optional[dict], name: str, like: tuple) -> Any:
    """`saved[name]` where it is an array of `like`'s shape and dtype (the kernel's count unchanged), else `like`."""
    a = saved.get(name) if saved else None
    if getattr(a, "shape", None) == tuple(like[0]) and a.dtype == np.dtype(like[1]):
        return a
    return like


def _seen(shape: tuple, order: tuple) -> tuple:
    return tuple(shape[i] for i in order)


def _count_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, dy: np.ndarray, order: tuple,
                    recomputed: bool, saved: Optional[dict] = None, grads: tuple = (None, None, None)) -> None:
    """Count the backward's products (and, `recomputed`, the scores made again first, as "recompute"), each
    with its blocks as count_core's: q, k, v, `dy`, `saved`'s "pd" where the forward kept it, the gradients
    `grads` (dq, dk, dv) where given; the scores' gradients are blocks of their shapes."""
    heads, keys_t, _ = order
    if recomputed:
        context = current()
        was, context.phase = context.phase, "recompute"
        try:
            count_core(q, k, None, order)
        finally:
            context.phase = was
    dyh, vt = _seen(dy.shape, heads), _seen(v.shape, keys_t)  # (b, h, tq, e), (b, h, e, tk)
    scores = dyh[:-1] + vt[-1:]  # (b, h, tq, tk)
    dtype = q.dtype
    block = (scores, dtype)  # a gradient over the scores, held by nothing
    dq, dk, dv = ((_seen(t.shape, heads), dtype) if g is None else g for t, g in zip((q, k, v), grads))
    kv = vt[1]  # the key/value heads (grouped-query attention: fewer than the query heads)
    gemm(*_grouped_shapes(dyh, vt), dtype, (dy, v, block))  # dpd = dy v^T
    gemm(*_summed_shapes(scores, dyh, kv), dtype, (_own(saved, "pd", block), dy, dv))  # dv = pd^T dy
    gemm(*_grouped_shapes(scores, _seen(k.shape, heads)), dtype, (block, k, dq))  # dq = ds k
    gemm(*_summed_shapes(scores, _seen(q.shape, heads), kv), dtype, (block, q, dk))  # dk = ds^T q


def record_attention(out: Any, q: Any, k: Any, v: Any, plan: Any, kept: dict, core: Optional[Callable],
                     scale: float, order: tuple, traffic: tuple = (), groups: int = 1) -> Any:
    """softmax(q k^T * scale [masked]) [dropped out] v, its operands already in the plan's layouts.

    `kept`: the probabilities "p", after dropout "pd", and the kept entries' dropout factor "factors"
    (None without dropout) per (b, h, query, key), which the forward's kernel keeps (or, in its place,
    the boolean mask "keep" and the factor "scale", a numpy scalar); empty when `core`
    is given (selective recomputation: ``core(q block, k block) -> (p, pd, factors)`` computes them
    again here, the mask drawn again from its seed) and in a dry run (zero gradients); `order`: the
    permutations that see a block as (b, h, t, d), k's as (b, h, d, t), and put a (b, h, t, e) product
    back in the operands' order; `traffic`: (scores block, dropout rate, kept set) for the element-wise
    kernels' count (spmdsim.base.flops.sweep), none counted when empty; `groups`: the query heads each key/value
    head serves (grouped-query attention; 1 without).
    """
    heads, keys_t, back = order

    def grads(dy: np.ndarray, qb: np.ndarray, kb: np.ndarray, vb: np.ndarray) -> tuple:
        if core is not None:
            p, pd, factors = core(qb, kb)
        else:
            p, pd = kept["p"], kept["pd"]
            keep = kept.get("keep")  # a boolean mask (Megatron's kept set): its factor made again
            factors = kept["factors"] if keep is None else np.multiply(keep, kept["scale"])
        dyh = dy.transpose(heads)  # (b, h, q, e)
        dpd = grouped_product(dyh, vb.transpose(keys_t), groups)
        dv = grouped_sum(pd, dyh, groups).transpose(back)
        dp = dpd if factors is None else dpd * factors
        ds = p * (dp - _SUM(dp * p, axis=-1, keepdims=True)) * scale
        dq = grouped_product(ds, kb.transpose(heads), groups).transpose(back)
        dk = grouped_sum(ds, qb.transpose(heads), groups).transpose(back)
        return dq, dk, dv

    def backward(dy: Any) -> tuple:
        engine = dy.mesh.engine
        if engine.dry:  # a dry run: the dry engine's zeros of each operand's block (np.zeros would clear pages)
            dq, dk, dv = (engine.local(np.copy, t.local) for t in (q, k, v))
        elif not buffers.CAPTURE.on:  # the blocks themselves (a captured step reads its record's views)
            dq, dk, dv = grads(dy._local, q._local, k._local, v._local)
        else:
            dq, dk, dv = grads(dy.local, q.local, k.local, v.local)
        if any_open():  # else nothing would be counted: no shapes to gather
            _count_backward(q.local, k.local, v.local, dy.local, order, core is not None, kept, (dq, dk, dv))
            if traffic:
                if core is not None:  # the forward's kernels again, first
                    context = current()
                    was, context.phase = context.phase, "recompute"
                    try:
                        count_core_kernels(*traffic)
                    finally:
                        context.phase = was
                _count_backward_kernels(*traffic, kept)
        pending = dy.layout.partial
        return (grad_tensor(q, dq, pending) if q._ag is not None else None,
                grad_tensor(k, dk, pending, plan.query_axes) if k._ag is not None else None,
                grad_tensor(v, dv, pending, plan.query_axes) if v._ag is not None else None)

    return record(out, plan.why, (q, k, v), backward, with_partial(out.layout, ()))


def count_flash(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray, lse: np.ndarray, order: tuple,
                tile_rows: tuple, causal: bool = False) -> None:
    """Count (spmdsim.base.flops) flash attention's forward on these blocks (q, k, v in the operands' order, `o` the
    output (b, h, tq, e) and `lse` (b, h, tq), which the rule keeps), whether or not its kernel runs: the scores
    q k^T and the weighted values p @ v, each counted as one product of the whole rows (the FLOPs of its tiles),
    a product of the fused attention kernel (``kernel="attention"``: its score tiles stay on chip; with `causal`
    half of it executed, the tiles above the diagonal skipped), whose blocks are a tile's: its q rows, k, a
    block of the tile's scores held by nothing (the moment's transient block), v and its output rows; and the
    kernel's memory traffic once: q, k and v read, the output and the rows' log-sum-exp written (the softmax and
    dropout run on the tiles inside it, no score written; a query tile's k and v come through the L2 cache, as
    the kernel's measured rate has them)."""
    heads, keys_t, _ = order
    qs, ks, vs = _seen(q.shape, heads), _seen(k.shape, keys_t), _seen(v.shape, heads)
    dtype = q.dtype
    scores = qs[:-1] + ks[-1:]
    share = 0.5 if causal else 1.0
    rows = tile_rows[0][0] if tile_rows else qs[2]
    lead = qs[:2] + (rows,)
    qt, st = (lead + qs[3:], dtype, q), (lead + ks[-1:], dtype)
    ot = (lead + vs[-1:], o.dtype, o)
    gemm(*_grouped_shapes(qs, ks), dtype, (qt, k, st), "attention", share)  # the largest tile's blocks
    gemm(*_grouped_shapes(scores, vs), dtype, (st, v, ot), "attention", share)
    sweep("flash attention", (q, k, v), (o, lse))


def _count_flash_backward(q: np.ndarray, k: np.ndarray, v: np.ndarray, dy: np.ndarray, order: tuple, kept: dict,
                          tile_rows: tuple, grads: tuple, causal: bool = False) -> None:
    """Count flash attention's backward as `count_flash` its forward, the gradients `grads` (dq, dk, dv, in the
    operands' order) whole: D = rowsum(dO * O) (one kernel), then the fused kernel's products: the scores again
    (phase "recompute": the hardware's FLOPs, not the model's), dP = dO v^T, dV = Pd^T dO, dQ = dS k and
    dK = dS^T q, each one product of the whole rows whose blocks are the largest tile's: its scores,
    probabilities and their gradients blocks of the tile's shape held by nothing, beside the three gradients (the
    moment's transient blocks); and the kernel's traffic once: q, dO, the log-sum-exp, D, k and v read, dQ, dK
    and dV written."""
    heads, keys_t, _ = order
    qs, ks, kh, vt = _seen(q.shape, heads), _seen(k.shape, keys_t), _seen(k.shape, heads), _seen(v.shape, keys_t)
    dyh = _seen(dy.shape, heads)
    dtype, o, lse = q.dtype, kept["o"], kept["lse"]
    dq, dk, dv = grads
    scores = qs[:-1] + ks[-1:]
    kv = vt[1]
    big = (lse.shape, lse.dtype)  # D, a row's
    sweep("flash attention backward", (o, dy), (big,))
    share, rows = (0.5 if causal else 1.0), (tile_rows[0][0] if tile_rows else qs[2])
    lead = qs[:2] + (rows,)
    qt, st, dyt = (lead + qs[3:], dtype, q), (lead + ks[-1:], dtype), (lead + dyh[3:], dy.dtype, dy)
    context = current()
    was, context.phase = context.phase, "recompute"
    try:
        gemm(*_grouped_shapes(qs, ks), dtype, (qt, k, st), "attention", share)
    finally:
        context.phase = was
    p, dp, ds = st, (st[0], dtype), (st[0], dtype)  # blocks of their own each
    gemm(*_grouped_shapes(dyh, vt), dtype, (dyt, v, dp, p), "attention", share)  # dP = dO v^T
    gemm(*_summed_shapes(scores, dyh, kv), dtype, (p, dyt, dv, dq, dk), "attention", share)  # dV = Pd^T dO
    gemm(*_grouped_shapes(scores, kh), dtype, (ds, k, dq, p, dp, dk, dv), "attention", share)  # dQ = dS k
    gemm(*_summed_shapes(scores, qs, kv), dtype, (ds, qt, dk, dq, dv), "attention", share)  # dK = dS^T q
    # the gradients at the products' dtype (float32 under bfloat16: a dry run's are copies of q, k and v)
    wide_ = np.float32 if is_low(dtype) else dtype
    sweep("flash attention backward", (q, dy, lse, big, k, v),
          ((dq.shape, wide_, dq), (dk.shape, wide_, dk), (dv.shape, wide_, dv)))


def record_flash(out: Any, q: Any, k: Any, v: Any, plan: Any, kept: dict, scores: Callable, probs: Callable,
                 tiles: tuple, scale: float, order: tuple, groups: int, tile_rows: tuple, causal: bool = False) -> Any:
    """Flash attention's node (spmdsim.nn.ops.attention, ``flash=True``), its operands in the plan's layouts.

    `kept`: the output "o" (b, h, tq, e) and the rows' log-sum-exp "lse" (b, h, tq); `scores(q tile, k^T, start,
    stop)` a tile's scaled, masked scores, `probs(p, region)` a tile's (p, dropped-out p, factors or None) with
    the mask drawn at `region`; `tiles`: (local start, stop, region) of each tile of query rows; `tile_rows` as
    `count_flash`'s; `causal` whether the core is causal (its counted products half executed); the rest as
    `record_attention`'s.
    """
    heads, keys_t, back = order

    def grads(dy: np.ndarray) -> tuple:
        if not tiles:  # no query rows here: no gradient of q, k or v from this rank (k's, v's pending elsewhere)
            return tuple(np.zeros_like(t.local) for t in (q, k, v))
        qh, kh = q.local.transpose(heads), k.local.transpose(heads)
        kt, vt = k.local.transpose(keys_t), v.local.transpose(keys_t)
        dyh, lse = dy.transpose(heads), kept["lse"]
        big = _SUM(wide(dyh) * wide(kept["o"]), axis=-1)  # D = rowsum(dO * O)
        dq = dk = dv = None
        for start, stop, region in tiles:
            qt, dyt = qh[:, :, start:stop], dyh[:, :, start:stop]
            p, pd, factors = probs(np.exp(scores(qt, kt, start, stop) - lse[:, :, start:stop, None]), region)
            dpd = grouped_product(dyt, vt, groups)
            dp = dpd if factors is None else dpd * factors
            ds = p * (dp - big[:, :, start:stop, None]) * scale
            rows = grouped_product(ds, kh, groups)
            if dq is None:
                dq = buffers.empty(qh.shape[:3] + rows.shape[3:], rows.dtype)
                dv, dk = grouped_sum(pd, dyt, groups), grouped_sum(ds, qt, groups)
            else:
                dv += grouped_sum(pd, dyt, groups)
                dk += grouped_sum(ds, qt, groups)
            dq[:, :, start:stop] = rows
        return dq.transpose(back), dk.transpose(back), dv.transpose(back)

    def backward(dy: Any) -> tuple:
        engine = dy.mesh.engine
        if engine.dry:  # a dry run: the dry engine's zeros of each operand's block
            dq, dk, dv = (engine.local(np.copy, t.local) for t in (q, k, v))
        else:
            dq, dk, dv = grads(dy.local)
        if any_open():
            _count_flash_backward(q.local, k.local, v.local, dy.local, order, kept, tile_rows, (dq, dk, dv),
                                  causal)
        pending = dy.layout.partial
        return (grad_tensor(q, dq, pending) if q._ag is not None else None,
                grad_tensor(k, dk, pending, plan.query_axes) if k._ag is not None else None,
                grad_tensor(v, dv, pending, plan.query_axes) if v._ag is not None else None)

    return record(out, plan.why, (q, k, v), backward, with_partial(out.layout, ()))
