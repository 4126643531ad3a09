"""The reference GPT's pieces, forward and backward: layer norm, tanh-GELU, one pre-LN block.

Activations are (B*T, D) matrices so every linear layer is one matmul; attention works on
(B, H, T, Dh) stacks with batched matmuls. Each forward returns what its backward needs.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np

from ..moe.reference import moe_backward, moe_forward
from .config import GPTConfig

_GELU_C = math.sqrt(2.0 / math.pi)
_CAUSAL: dict[int, np.ndarray] = {}  # T -> (T, T) additive mask: 0 on and below the diagonal, -inf above

Drop = Callable[[np.ndarray, str], np.ndarray]


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> tuple[np.ndarray, tuple]:
    """(x - mean) / sqrt(biased var + eps) * w + b over the last dim of x (N, D)."""
    xc = x - x.mean(axis=-1, keepdims=True)
    rstd = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    xhat = xc * rstd
    return xhat * w + b, (xhat, rstd, w)


def layer_norm_backward(dy: np.ndarray, cache: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of x, w and b from dy (N, D)."""
    xhat, rstd, w = cache
    dxhat = dy * w
    dx = rstd * (dxhat - dxhat.mean(axis=-1, keepdims=True)
                 - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True))
    return dx, (dy * xhat).sum(axis=0), dy.sum(axis=0)


def gelu(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3))), and the tanh (its backward needs it)."""
    t = z * z
    t *= 0.044715
    t *= z
    t += z
    t *= _GELU_C
    np.tanh(t, out=t)
    m = t + 1.0
    m *= z
    m *= 0.5
    return m, t


def gelu_backward(dm: np.ndarray, z: np.ndarray, t: np.ndarray) -> np.ndarray:
    """dm times d gelu(z) / dz = 0.5 (1 + t) + 0.5 z (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 z^2)."""
    du = z * z  # in place from here on: this runs on the (B*T, 4D) activations, the largest
    du *= 3 * 0.044715 * _GELU_C
    du += _GELU_C
    du *= z
    tail = t * t
    np.subtract(1.0, tail, out=tail)
    tail *= du
    tail *= 0.5
    out = t + 1.0
    out *= 0.5
    out += tail
    out *= dm
    return out


def _causal(T: int) -> np.ndarray:
    if T not in _CAUSAL:
        _CAUSAL[T] = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, 0.0)
    return _CAUSAL[T]


def block_forward(params: dict, pre: str, h: np.ndarray, B: int, cfg: GPTConfig,
                  drop: Drop, follow: Optional[np.ndarray] = None) -> tuple[np.ndarray, dict[str, Any]]:
    """One pre-LN block on h (B*T, D): causal attention, then the GELU MLP (or the MoE layer, spmdsim.moe),
    each with a residual. `follow`: the ranks' (B, T, k) experts of an MoE layer, followed at near-ties."""
    T, H, Dh = h.shape[0] // B, cfg.heads, cfg.head_dim
    layer = pre[:-1]
    a, ln1 = layer_norm(h, params[pre + "ln1.w"], params[pre + "ln1.b"], cfg.ln_eps)

    def heads(w: str) -> np.ndarray:  # (B, H, T, Dh)
        out = a @ params[pre + "attn.w" + w]
        if w != "k":  # no key bias (spmdsim.gpt.params)
            out = out + params[pre + "attn.b" + w]
        return out.reshape(B, T, H, Dh).transpose(0, 2, 1, 3)

    qh, kh, vh = heads("q"), heads("k"), heads("v")
    probs = qh @ kh.transpose(0, 1, 3, 2)  # the scores, then in place their softmax
    probs *= 1.0 / math.sqrt(Dh)
    probs += _causal(T)
    probs -= probs.max(axis=-1, keepdims=True)  # each row's diagonal is finite
    np.exp(probs, out=probs)
    probs /= probs.sum(axis=-1, keepdims=True)
    pd = drop(probs, layer + ".attn")
    o = (pd @ vh).transpose(0, 2, 1, 3).reshape(B * T, H * Dh)
    h = h + drop(o @ params[pre + "attn.wo"] + params[pre + "attn.bo"], layer + ".resid1")
    a2, ln2 = layer_norm(h, params[pre + "ln2.w"], params[pre + "ln2.b"], cfg.ln_eps)
    cache = {"a": a, "ln1": ln1, "q": qh, "k": kh, "v": vh, "probs": probs, "pd": pd, "o": o, "a2": a2, "ln2": ln2,
             "B": B}
    if cfg.is_moe(int(layer[1:])):
        out, cache["moe"] = moe_forward(params, pre, a2, B, cfg.moe, follow)
        return h + drop(out, layer + ".resid2"), cache
    z = a2 @ params[pre + "mlp.w1"] + params[pre + "mlp.b1"]
    m, t = gelu(z)
    h = h + drop(m @ params[pre + "mlp.w2"] + params[pre + "mlp.b2"], layer + ".resid2")
    cache.update(z=z, t=t, m=m)
    return h, cache


def block_backward(params: dict, pre: str, dh: np.ndarray, c: dict[str, Any], cfg: GPTConfig,
                   undrop: Drop, grads: dict[str, np.ndarray]) -> np.ndarray:
    """The block's input gradient from its output gradient dh (B*T, D); parameter gradients into grads."""
    B, H, Dh = c["B"], cfg.heads, cfg.head_dim
    T, layer = dh.shape[0] // B, pre[:-1]
    # MLP: h_out = h_mid + drop(gelu(ln2(h_mid) @ w1 + b1) @ w2 + b2)
    dr = undrop(dh, layer + ".resid2")
    if "moe" in c:
        da2 = moe_backward(params, pre, dr, c["moe"], cfg.moe, grads)
    else:
        grads[pre + "mlp.w2"], grads[pre + "mlp.b2"] = c["m"].T @ dr, dr.sum(axis=0)
        dz = gelu_backward(dr @ params[pre + "mlp.w2"].T, c["z"], c["t"])
        grads[pre + "mlp.w1"], grads[pre + "mlp.b1"] = c["a2"].T @ dz, dz.sum(axis=0)
        da2 = dz @ params[pre + "mlp.w1"].T
    dx, grads[pre + "ln2.w"], grads[pre + "ln2.b"] = layer_norm_backward(da2, c["ln2"])
    dh = dh + dx
    # Attention: h_mid = h_in + drop(attn(ln1(h_in)) @ wo + bo)
    dr = undrop(dh, layer + ".resid1")
    grads[pre + "attn.wo"], grads[pre + "attn.bo"] = c["o"].T @ dr, dr.sum(axis=0)
    do = (dr @ params[pre + "attn.wo"].T).reshape(B, T, H, Dh).transpose(0, 2, 1, 3)
    dv = c["pd"].transpose(0, 1, 3, 2) @ do
    dprobs = undrop(do @ c["v"].transpose(0, 1, 3, 2), layer + ".attn")
    probs = c["probs"]
    # Softmax backward; masked entries have probs 0, so their gradient is 0.
    ds = dprobs * probs
    dprobs -= ds.sum(axis=-1, keepdims=True)
    np.multiply(probs, dprobs, out=ds)
    ds *= 1.0 / math.sqrt(Dh)
    dq, dk = ds @ c["k"], ds.transpose(0, 1, 3, 2) @ c["q"]
    da = 0.0
    for w, d in (("q", dq), ("k", dk), ("v", dv)):
        d = d.transpose(0, 2, 1, 3).reshape(B * T, H * Dh)
        grads[pre + "attn.w" + w] = c["a"].T @ d
        if w != "k":
            grads[pre + "attn.b" + w] = d.sum(axis=0)
        da = da + d @ params[pre + "attn.w" + w].T
    dx, grads[pre + "ln1.w"], grads[pre + "ln1.b"] = layer_norm_backward(da, c["ln1"])
    return dh + dx
