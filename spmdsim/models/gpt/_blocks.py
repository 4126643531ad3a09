"""The reference GPT's pieces, forward and backward: the block's norm, tanh-GELU, one pre-LN block.

The norms themselves are spmdsim.references.norms'. Llama's options (spmdsim.models.gpt.GPTConfig) are pieces
here too: RMSNorm (`norm`), the SwiGLU MLP
(`silu`), rotary embeddings (`rope_tables`, `rope`) and grouped-query attention (each key/value head
repeated for its heads / kv_heads query heads, its gradient the sum of theirs).

Activations are (B*T, D) matrices so every linear layer is one matmul; attention works on
(B, H, T, Dh) stacks with batched matmuls. Each forward returns what its backward needs.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy as np

from ...references.norms import layer_norm, layer_norm_backward, rms_norm, rms_norm_backward
from ..moe.reference import moe_backward, moe_forward
from .config import GPTConfig
from .config import ROPE_BASE

_GELU_C = math.sqrt(2.0 / math.pi)
_CAUSAL: dict[int, np.ndarray] = {}  # T -> (T, T) additive mask: 0 on and below the diagonal, -inf above

Drop = Callable[[np.ndarray, str], np.ndarray]


def norm(params: dict, name: str, x: np.ndarray, cfg: GPTConfig) -> tuple[np.ndarray, tuple]:
    """The block's norm `name` ("h0.ln1", "lnf") on x: cfg.norm's, layer norm or RMSNorm."""
    if cfg.norm == "rms":
        return rms_norm(x, params[name + ".w"], cfg.ln_eps)
    return layer_norm(x, params[name + ".w"], params[name + ".b"], cfg.ln_eps)


def norm_backward(dy: np.ndarray, cache: tuple, name: str, cfg: GPTConfig, grads: dict) -> np.ndarray:
    """`norm`'s input gradient; its weight's (and bias's) into grads."""
    if cfg.norm == "rms":
        dx, grads[name + ".w"] = rms_norm_backward(dy, cache)
        return dx
    dx, grads[name + ".w"], grads[name + ".b"] = layer_norm_backward(dy, cache)
    return dx


#: The largest rope table (seq x head_dim elements, float64) `rope_tables` keeps: 4096 x 128 is 4 MiB a table. A
#: model made again (every dry run a search or an estimate makes, one a pipeline stage) asked for the same tables
#: each time, and at seq 4096 their cos and sin cost ~20 ms a model (docs/howto/estimate.md's Llama: 120 models, 2.5 s).
_ROPE_KEPT_ELEMENTS = 1 << 20
_ROPE: dict = {}  # (seq, head_dim) -> (cos, sin), read-only; at most 4, the oldest out first


def rope_tables(seq: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), each (seq, head_dim): position t's angle t * ROPE_BASE ** (-i / (head_dim / 2)) for
    frequency i, the halves alike (the rotate-half convention of Llama's Hugging Face port and Megatron).
    Read-only arrays, shared by the calls of one size (up to `_ROPE_KEPT_ELEMENTS` a table)."""
    key = (seq, head_dim)
    known = _ROPE.get(key)
    if known is not None:
        return known

    half = head_dim // 2
    angle = np.arange(seq, dtype=np.float64)[:, None] * ROPE_BASE ** -(np.arange(half) / half)
    both = np.concatenate([angle, angle], axis=1)
    out = (np.cos(both), np.sin(both))
    for t in out:
        t.flags.writeable = False  # shared: a caller that wrote into one would change every later model's
    if seq * head_dim <= _ROPE_KEPT_ELEMENTS:
        while len(_ROPE) >= 4:
            try:
                del _ROPE[next(iter(_ROPE))]
            except (KeyError, RuntimeError, StopIteration):  # another thread's simulation took it first
                break
        _ROPE[key] = out
    return out


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x * cos + rotate_half(x) * sin over x's last dim (x (..., T, Dh); rotate_half: [-x2, x1])."""
    half = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


def rope_backward(dy: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """`rope`'s input gradient: dy * cos + rotate_half^T(dy * sin) (rotate_half^T: [u2, -u1])."""
    half = dy.shape[-1] // 2
    u = dy * sin
    return dy * cos + np.concatenate([u[..., half:], -u[..., :half]], axis=-1)


def silu(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """z * sigmoid(z), and the sigmoid (its backward needs it)."""
    sig = 1.0 / (1.0 + np.exp(-z))
    return z * sig, sig


def _biased(y: np.ndarray, params: dict, name: str) -> np.ndarray:
    """y plus the bias `name` where the model has one (GPTConfig.bias)."""
    b = params.get(name)
    return y if b is None else y + b


def _bias_grad(grads: dict, params: dict, name: str, d: np.ndarray) -> None:
    if name in params:
        grads[name] = d.sum(axis=0)


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


def block_forward(params: dict, pre: str, h: np.ndarray, B: int, cfg: GPTConfig, drop: Drop,
                  follow: Optional[np.ndarray] = None, laid: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
    """One pre-LN block on h (B*T, D): causal attention, then the GELU MLP (or the MoE layer, spmdsim.models.moe),
    each with a residual. `follow`: the ranks' (B, T, k) experts of an MoE layer, followed at near-ties; `laid`:
    a context-parallel run's order (spmdsim.models.gpt.context.Laid: its groups, the chunks experts route apart)."""
    T, H, Dh, KV = h.shape[0] // B, cfg.heads, cfg.head_dim, cfg.kv
    layer = pre[:-1]
    a, ln1 = norm(params, pre + "ln1", h, cfg)

    def heads(w: str, n: int) -> np.ndarray:  # (B, n, T, Dh)
        out = a @ params[pre + "attn.w" + w]
        if w != "k":  # no key bias (spmdsim.models.gpt.params)
            out = _biased(out, params, pre + "attn.b" + w)
        return out.reshape(B, T, n, Dh).transpose(0, 2, 1, 3)

    qh, kh, vh = heads("q", H), heads("k", KV), heads("v", KV)
    if cfg.positions == "rope":
        cos, sin = rope_tables(T, Dh)
        qh, kh = rope(qh, cos, sin), rope(kh, cos, sin)
    if KV != H:  # grouped-query attention: key/value head j serves query heads j G .. j G + G - 1
        kh, vh = np.repeat(kh, H // KV, axis=1), np.repeat(vh, H // KV, axis=1)
    probs = qh @ kh.transpose(0, 1, 3, 2)  # the scores, then in place their softmax
    probs *= 1.0 / math.sqrt(Dh)
    probs += _causal(T)
    probs -= probs.max(axis=-1, keepdims=True)  # each row's diagonal is finite
    np.exp(probs, out=probs)
    probs /= probs.sum(axis=-1, keepdims=True)
    pd = drop(probs, layer + ".attn")
    o = (pd @ vh).transpose(0, 2, 1, 3).reshape(B * T, H * Dh)
    h = h + drop(_biased(o @ params[pre + "attn.wo"], params, pre + "attn.bo"), layer + ".resid1")
    a2, ln2 = norm(params, pre + "ln2", h, cfg)
    cache = {"a": a, "ln1": ln1, "q": qh, "k": kh, "v": vh, "probs": probs, "pd": pd, "o": o, "a2": a2, "ln2": ln2,
             "B": B}
    if cfg.is_moe(int(layer[1:])):
        out, cache["moe"] = moe_forward(params, pre, a2, B, cfg.moe, follow, getattr(laid, "groups", None))
        return h + drop(out, layer + ".resid2"), cache
    z = _biased(a2 @ params[pre + "mlp.w1"], params, pre + "mlp.b1")
    if cfg.mlp == "swiglu":  # silu(a2 w1 + b1) * (a2 w3 + b3)
        g, sig = silu(z)
        u = _biased(a2 @ params[pre + "mlp.w3"], params, pre + "mlp.b3")
        m = g * u
        cache.update(g=g, sig=sig, u=u)
    else:
        m, t = gelu(z)
        cache.update(t=t)
    h = h + drop(_biased(m @ params[pre + "mlp.w2"], params, pre + "mlp.b2"), layer + ".resid2")
    cache.update(z=z, m=m)
    return h, cache


def block_backward(params: dict, pre: str, dh: np.ndarray, c: dict[str, Any], cfg: GPTConfig,
                   undrop: Drop, grads: dict[str, np.ndarray]) -> np.ndarray:
    """The block's input gradient from its output gradient dh (B*T, D); parameter gradients into grads."""
    B, H, Dh, KV = c["B"], cfg.heads, cfg.head_dim, cfg.kv
    T, layer = dh.shape[0] // B, pre[:-1]
    # MLP: h_out = h_mid + drop(gelu(ln2(h_mid) @ w1 + b1) @ w2 + b2) (or SwiGLU's)
    dr = undrop(dh, layer + ".resid2")
    if "moe" in c:
        da2 = moe_backward(params, pre, dr, c["moe"], cfg.moe, grads)
    else:
        grads[pre + "mlp.w2"] = c["m"].T @ dr
        _bias_grad(grads, params, pre + "mlp.b2", dr)
        dm = dr @ params[pre + "mlp.w2"].T
        if cfg.mlp == "swiglu":
            du = dm * c["g"]
            sig = c["sig"]
            dz = dm * c["u"] * (sig * (1.0 + c["z"] * (1.0 - sig)))
            grads[pre + "mlp.w3"] = c["a2"].T @ du
            _bias_grad(grads, params, pre + "mlp.b3", du)
        else:
            dz = gelu_backward(dm, c["z"], c["t"])
        grads[pre + "mlp.w1"] = c["a2"].T @ dz
        _bias_grad(grads, params, pre + "mlp.b1", dz)
        da2 = dz @ params[pre + "mlp.w1"].T
        if cfg.mlp == "swiglu":
            da2 += du @ params[pre + "mlp.w3"].T
    dh = dh + norm_backward(da2, c["ln2"], pre + "ln2", cfg, grads)
    # Attention: h_mid = h_in + drop(attn(ln1(h_in)) @ wo + bo)
    dr = undrop(dh, layer + ".resid1")
    grads[pre + "attn.wo"] = c["o"].T @ dr
    _bias_grad(grads, params, pre + "attn.bo", dr)
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
    if KV != H:  # each key/value head's gradient: the sum of its query heads'
        dk = dk.reshape(B, KV, H // KV, T, Dh).sum(axis=2)
        dv = dv.reshape(B, KV, H // KV, T, Dh).sum(axis=2)
    if cfg.positions == "rope":
        cos, sin = rope_tables(T, Dh)
        dq, dk = rope_backward(dq, cos, sin), rope_backward(dk, cos, sin)
    da = 0.0
    for w, d, n in (("q", dq, H), ("k", dk, KV), ("v", dv, KV)):
        d = d.transpose(0, 2, 1, 3).reshape(B * T, n * Dh)
        grads[pre + "attn.w" + w] = c["a"].T @ d
        if w != "k":
            _bias_grad(grads, params, pre + "attn.b" + w, d)
        da = da + d @ params[pre + "attn.w" + w].T
    return dh + norm_backward(da, c["ln1"], pre + "ln1", cfg, grads)
