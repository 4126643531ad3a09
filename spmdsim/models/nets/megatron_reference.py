"""The Megatron block's reference (examples/train_megatron_block.py): its loss and gradients in one numpy process,
and the magnitudes that entered each, from which the check's tolerances scale."""
from __future__ import annotations

import numpy as np
from ...references import forward as reference
from ...references import backward as rg
from .reference import _cross_entropy_scale


def _megatron_scales(p: dict, x: np.ndarray, labels: np.ndarray, heads: int) -> tuple[float, dict]:
    """(the magnitudes that entered `megatron_block`'s loss, those of each gradient): the block on absolute
    values, each operand's magnitudes in place of |operand| (so that an error it carries is covered as its
    rounding is), GELU's slope at most 1.13 and its curvature at most 1, a softmax moving each weight by its
    score's error and by the weighted errors of its row, cross-entropy's as `_cross_entropy_scale`."""
    seq = x.shape[0]
    width = p["Wq"].shape[1] // heads
    c = width ** -0.5
    a = {k: np.abs(v) for k, v in p.items()}

    def per_head(t: np.ndarray) -> np.ndarray:
        return t.reshape(seq, heads, width).transpose(1, 0, 2)

    def merge(t: np.ndarray) -> np.ndarray:
        return t.transpose(1, 0, 2).reshape(seq, heads * width)

    mx = np.abs(x)
    q, k, v = (per_head(x @ p[n]) for n in ("Wq", "Wk", "Wv"))
    mq, mk, mv = (per_head(mx @ a[n]) for n in ("Wq", "Wk", "Wv"))
    probs = reference.softmax(q @ k.transpose(0, 2, 1) * c)
    ms = (mq @ np.abs(k).transpose(0, 2, 1) + np.abs(q) @ mk.transpose(0, 2, 1)) * c
    mp = probs * (1 + ms + np.sum(probs * ms, axis=-1, keepdims=True))
    merged, mmerged = merge(probs @ v), merge(mp @ np.abs(v) + probs @ mv)
    x1, mx1 = x + merged @ p["Wo"], mx + mmerged @ a["Wo"]
    a1, ma1 = reference.linear(x1, p["W1"], p["b1"]), mx1 @ a["W1"] + a["b1"]
    act, mact = reference.gelu(a1), 1.13 * ma1 + np.abs(reference.gelu(a1))
    x2, mx2 = x1 + reference.linear(act, p["W2"], p["b2"]), mx1 + mact @ a["W2"] + a["b2"]
    z, mz = x2 @ p["Wh"], mx2 @ a["Wh"]
    loss_scale, dz = _cross_entropy_scale(z, mz, np.asarray(labels))
    _, dlogits = rg.cross_entropy(z, labels)
    s: dict = {"Wh": mx2.T @ dz}
    dx2, ddx2 = dlogits @ p["Wh"].T, dz @ a["Wh"].T
    s["W2"], s["b2"] = mact.T @ ddx2, ddx2.sum(0)
    dact, ddact = dx2 @ p["W2"].T, ddx2 @ a["W2"].T
    dda1 = ddact * (np.abs(rg.gelu_grad(a1)) + ma1) + np.abs(dact) * ma1  # GELU's curvature at most 1
    s["W1"], s["b1"] = mx1.T @ dda1, dda1.sum(0)
    ddx1 = ddx2 + dda1 @ a["W1"].T
    dx1 = dx2 + (dact * rg.gelu_grad(a1)) @ p["W1"].T
    s["Wo"] = mmerged.T @ ddx1
    dctx, ddctx = per_head(dx1 @ p["Wo"].T), per_head(ddx1 @ a["Wo"].T)
    dprobs = dctx @ v.transpose(0, 2, 1)
    ddprobs = ddctx @ np.abs(v).transpose(0, 2, 1) + np.abs(dctx) @ mv.transpose(0, 2, 1)
    dv = mp.transpose(0, 2, 1) @ np.abs(dctx) + probs.transpose(0, 2, 1) @ ddctx
    row = np.sum(probs * ddprobs + mp * np.abs(dprobs), axis=-1, keepdims=True)
    dds = c * (mp * (np.abs(dprobs) + np.sum(probs * np.abs(dprobs), axis=-1, keepdims=True))
               + probs * (ddprobs + row))
    dq, dk = dds @ mk, dds.transpose(0, 2, 1) @ mq
    ddx = ddx1.copy()
    for name, d in (("Wq", dq), ("Wk", dk), ("Wv", dv)):
        s[name] = mx.T @ merge(d)
        ddx = ddx + merge(d) @ a[name].T
    s["x"] = ddx
    return loss_scale, s


def megatron_block(params: dict, x: np.ndarray, labels: np.ndarray, heads: int,
                   scales: bool = False) -> tuple:
    """Loss and gradients of a transformer block with a language-model head, in numpy float64.

    ``x + attn(x)`` (multi-head attention, Wq/Wk/Wv (d, H*D), Wo (H*D, d), no biases),
    then ``+ mlp`` (W1, b1, GELU, W2, b2), then logits = x2 @ Wh and cross-entropy
    against `labels`. Returns (loss, {name: gradient}) for every entry of `params`
    and for "x"; with `scales`, (loss, gradients, the magnitudes that entered the
    loss, those that entered each gradient): as `ReferenceStep`'s scales, the
    step on absolute values (`_megatron_scales`), the scale a check follows.
    """
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    seq = x.shape[0]
    width = p["Wq"].shape[1] // heads

    def per_head(t: np.ndarray) -> np.ndarray:
        return t.reshape(seq, heads, width).transpose(1, 0, 2)

    q, k, v = (per_head(x @ p[n]) for n in ("Wq", "Wk", "Wv"))
    c = width ** -0.5
    probs = reference.softmax(q @ k.transpose(0, 2, 1) * c)
    merged = (probs @ v).transpose(1, 0, 2).reshape(seq, heads * width)
    x1 = x + merged @ p["Wo"]
    a1 = reference.linear(x1, p["W1"], p["b1"])
    x2 = x1 + reference.linear(reference.gelu(a1), p["W2"], p["b2"])
    loss, dlogits = rg.cross_entropy(x2 @ p["Wh"], labels)
    g: dict = {}
    dx2, g["Wh"] = rg.matmul_grads(x2, p["Wh"], dlogits)
    dg, g["W2"], g["b2"] = rg.linear_grads(reference.gelu(a1), p["W2"], p["b2"], dx2)
    da1 = dg * rg.gelu_grad(a1)
    dx1_mlp, g["W1"], g["b1"] = rg.linear_grads(x1, p["W1"], p["b1"], da1)
    dx1 = dx2 + dx1_mlp
    dmerged, g["Wo"] = rg.matmul_grads(merged, p["Wo"], dx1)
    dctx = per_head(dmerged)
    dprobs, dv = rg.matmul_grads(probs, v, dctx)
    dscores = rg.softmax_grad(probs, dprobs) * c
    dq, dk = rg.matmul_grads(q, k, dscores, transpose_b=True)
    g["x"] = dx1
    for name, d in (("Wq", dq), ("Wk", dk), ("Wv", dv)):
        dx, g[name] = rg.matmul_grads(x, p[name], d.transpose(1, 0, 2).reshape(seq, heads * width))
        g["x"] = g["x"] + dx
    if scales:
        return (loss, g) + _megatron_scales(p, x, labels, heads)
    return loss, g
