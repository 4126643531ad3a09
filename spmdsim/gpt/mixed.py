"""The reference GPT step under a low-precision policy (fp32, bf16-mixed): the ranks' rounding points, in one process.

spmdsim.gpt.reference computes in float64. Under ``fp32`` or ``bf16-mixed`` (spmdsim.precision) the
ranks compute otherwise, and this module follows them operation by operation, with the same kernels
where they are pure (spmdsim.activations' GELU) and the same formulas elsewhere:

- each operator of the distributed model reads its operands widened to float32 and rounds its
  result once to the activations' dtype: the embeddings' sum, each dropout (x times its float32
  factor), each layer norm's normalized values (statistics in float32), its times-weight and
  plus-bias, each product (a float32 BLAS product of the widened blocks) and its plus-bias, the
  attention core's probabilities, their dropped-out values and its output, GELU, the residual sums,
  the logits; cross-entropy in float32;
- in the backward, each activation's gradient is summed in float32 over its consumers and rounded
  once to the activations' dtype before its own rule runs, which computes in float32; a
  parameter's gradient stays float32 (Megatron's main_grad).

A sharded run differs from this only in the order of its float32 sums before each rounding: a
contraction split over ranks is summed from float32 partial products by its Allreduce or
Reduce_scatter, a parameter's gradient from each rank's rows, the loss from each rank's tokens. Where
two orders round a value to different neighbours (one bfloat16 ulp, 2**-7 of it), the difference
carries on through the step; spmdsim.gpt.train's tolerance for the policy says how far (`tolerance`).
Pure: numpy.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from .. import activations
from ..precision import Precision, product, rounded, unit_roundoff, wide
from .config import GPTConfig
from .params import param_specs

__all__ = ["loss_and_grads", "tolerance", "mixed_problem"]

_F32 = np.float32


def mixed_problem(precision: Any, zero: int = 0, replay: bool = False, kept: str = "graph",
                  pipeline: bool = False) -> Optional[str]:
    """Why the GPT's training cannot run these options under `precision` (one line), or None."""
    name = getattr(precision, "name", precision)
    if name == "fp64":
        return None
    if kept != "graph":
        return f"precision {name!r} runs with kept 'graph' (the fused pieces of kept {kept!r} are float64 only)"
    if replay:
        return f"precision {name!r} is not replayed yet: leave out --replay"
    if pipeline:
        return f"precision {name!r} does not run over a pipeline yet: leave out --pp and --microbatches"
    if zero and name == "bf16-mixed":
        return ("precision 'bf16-mixed' with ZeRO-1 is not done yet (its buckets hold one dtype, the parameters' "
                "bfloat16 and the gradients' float32 are two): leave out --zero")
    return None


def tolerance(policy: Precision, cfg: GPTConfig) -> float:
    """The largest difference a checked step may show, relative to the tensor's largest entry, under `policy`.

    At float64 spmdsim.gpt.train.TOLERANCE (1e-10). Otherwise from the unit roundoff u of the activations'
    dtype (2**-8 for bfloat16, 2**-24 for float32): a value rounded from two float32 sums that differ
    only in their order lands on the same neighbour or on the next one, 2u of the value apart; a
    forward and backward pass rounds each residual-stream value 6 times a layer (the block's two
    layer norms' outputs, two residual sums and their two gradients), and the difference one flip
    makes carries on through the later layers at most once each: 2u times 6 per layer, plus the
    embeddings' and the head's 4 roundings. Relative to the tensor's largest entry, a flip at a
    value smaller than it counts for less, so this bounds the elementwise worst case.
    """
    if policy.activation == "float64":
        return 1e-10
    u = unit_roundoff(policy.dtype("activation"))
    return 2 * u * (6 * cfg.layers + 4)


def loss_and_grads(params: dict, x: np.ndarray, y: np.ndarray, cfg: GPTConfig, step: Optional[int],
                   policy: Precision, masks: Optional[dict]) -> tuple[float, dict]:
    """(loss, {name: float32 gradient}) of one step under `policy`; `params`: each parameter's values in
    the policy's parameter dtype (or exactly representable there); `masks`: spmdsim.gpt.reference's
    keep masks of the step (None without dropout)."""
    act = policy.dtype("activation")
    P = {s.name: np.asarray(params[s.name]).astype(policy.dtype("param")) for s in param_specs(cfg)}
    r = _Rounder(act, cfg, masks)
    B, T = x.shape
    D = cfg.d_model
    h = r(wide(P["wte"][x]) + wide(P["wpe"])[None])
    h = r.drop(h, "emb").reshape(B * T, D)
    caches = []
    for layer in range(cfg.layers):
        h, c = _block(P, f"h{layer}.", h, B, cfg, r)
        caches.append(c)
    hf, lnf = _ln(P, "lnf", h, cfg, r)
    z = r(product(hf, P["wte"].T))
    # Cross-entropy in float32, as the vocab-parallel kernel: shifted exponentials, their row sums.
    zw = wide(z)
    n = zw.shape[0]
    rows, ids = np.arange(n), y.reshape(-1)
    shift = zw.max(axis=1)
    e = np.exp(zw - shift[:, None])
    nll = np.log(e.sum(axis=1)) - (zw[rows, ids] - shift)
    loss = nll.sum() / np.asarray(float(n), _F32)
    g = e / e.sum(axis=1)[:, None]
    g[rows, ids] -= 1.0
    dz = r.grad(g * (np.ones((), _F32) / float(n)))
    grads: dict = {"wte": product(dz.T, hf)}
    dh = _ln_backward(P, "lnf", product(dz, P["wte"]), lnf, grads, r)
    for layer in reversed(range(cfg.layers)):
        dh = _block_backward(P, f"h{layer}.", dh, caches[layer], cfg, r, grads)
    dh0 = wide(r.grad(r.undrop(dh, "emb"))).reshape(B, T, D)
    np.add.at(grads["wte"], x.reshape(-1), dh0.reshape(B * T, D))
    grads["wpe"] = dh0.sum(axis=0)
    return float(loss), {s.name: grads[s.name].astype(_F32) for s in param_specs(cfg)}


class _Rounder:
    """Rounding to the activations' dtype, the dropout masks as the ranks' float32 factors."""

    def __init__(self, act: np.dtype, cfg: GPTConfig, masks: Optional[dict]) -> None:
        self.act, self.masks = act, masks
        self.scale = np.asarray(1.0 / (1.0 - cfg.dropout), _F32)

    def __call__(self, a: np.ndarray) -> np.ndarray:
        return rounded(a, self.act)

    def grad(self, g: np.ndarray) -> np.ndarray:
        """A gradient summed in float32, rounded once where its activation's rule reads it (widened)."""
        return wide(rounded(g, self.act))

    def factors(self, site: str, shape: tuple) -> Optional[np.ndarray]:
        if self.masks is None:
            return None
        return np.multiply(self.masks[site].reshape(shape) != 0, self.scale)

    def drop(self, a: np.ndarray, site: str) -> np.ndarray:
        f = self.factors(site, a.shape)
        return a if f is None else self(wide(a) * f)

    def undrop(self, g: np.ndarray, site: str) -> np.ndarray:
        f = self.factors(site, g.shape)
        return g if f is None else g * f


def _ln(P: dict, pre: str, h: np.ndarray, cfg: GPTConfig, r: _Rounder) -> tuple:
    """The layer norm as the ranks' three nodes: normalized (float32 statistics), times weight, plus bias."""
    n = h.shape[-1]
    inv = 1.0 / n
    block = wide(h)
    c = block - np.sum(block, axis=-1, keepdims=True) * inv
    root = np.sqrt(np.sum(c * c, axis=-1, keepdims=True) * inv + cfg.ln_eps)
    yn = r(c / root)
    yw = r(wide(yn) * wide(P[pre + ".w"]))
    return r(wide(yw) + wide(P[pre + ".b"])), (yn, 1.0 / root)


def _ln_backward(P: dict, pre: str, da: np.ndarray, cache: tuple, grads: dict, r: _Rounder) -> np.ndarray:
    """The layer norm's input gradient (float32, not rounded: summed with the residual's first)."""
    yn, rstd = cache
    da = r.grad(da)
    grads[pre + ".b"] = da.sum(axis=0)
    grads[pre + ".w"] = (da * yn).sum(axis=0)
    dy = r.grad(da * wide(P[pre + ".w"]))
    inv = 1.0 / yn.shape[-1]
    g = dy - np.sum(dy * yn, axis=-1, keepdims=True) * inv * yn
    g = g - np.sum(dy, axis=-1, keepdims=True) * inv
    return g * rstd


def _linear(P: dict, name: str, bias: Optional[str], a: np.ndarray, r: _Rounder) -> np.ndarray:
    out = r(product(a, P[name]))
    return out if bias is None else r(wide(out) + wide(P[bias]))


def _block(P: dict, pre: str, h: np.ndarray, B: int, cfg: GPTConfig, r: _Rounder) -> tuple:
    T, H, Dh = h.shape[0] // B, cfg.heads, cfg.head_dim
    layer = pre[:-1]
    a, ln1 = _ln(P, pre + "ln1", h, cfg, r)

    def heads(w: str) -> np.ndarray:
        out = _linear(P, pre + "attn.w" + w, None if w == "k" else pre + "attn.b" + w, a, r)
        return out.reshape(B, T, H, Dh).transpose(0, 2, 1, 3)

    q, k, v = heads("q"), heads("k"), heads("v")
    s = product(q, k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(Dh))
    s = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, s)
    e = np.exp(s - np.max(s, axis=-1, keepdims=True))
    p = r(e / np.sum(e, axis=-1, keepdims=True))
    f = r.factors(layer + ".attn", p.shape)
    pd = p if f is None else r(wide(p) * f)
    o = r(product(pd, v)).transpose(0, 2, 1, 3).reshape(B * T, H * Dh)
    h1 = r(wide(h) + wide(r.drop(_linear(P, pre + "attn.wo", pre + "attn.bo", o, r), layer + ".resid1")))
    a2, ln2 = _ln(P, pre + "ln2", h1, cfg, r)
    zpre = _linear(P, pre + "mlp.w1", pre + "mlp.b1", a2, r)
    t = activations.gelu_tanh(zpre)
    m = activations.gelu_from_tanh(zpre, t)
    out = _linear(P, pre + "mlp.w2", pre + "mlp.b2", m, r)
    h2 = r(wide(h1) + wide(r.drop(out, layer + ".resid2")))
    return h2, {"a": a, "ln1": ln1, "q": q, "k": k, "v": v, "p": p, "pd": pd, "f": f, "o": o, "a2": a2,
                "ln2": ln2, "z": zpre, "t": t, "m": m, "B": B}


def _block_backward(P: dict, pre: str, dh: np.ndarray, c: dict, cfg: GPTConfig, r: _Rounder,
                    grads: dict) -> np.ndarray:
    """The block's input gradient (float32, summed) from its output's (float32, summed)."""
    B, H, Dh = c["B"], cfg.heads, cfg.head_dim
    T, layer = dh.shape[0] // B, pre[:-1]
    dh = r.grad(dh)
    dr = r.grad(r.undrop(dh, layer + ".resid2"))
    grads[pre + "mlp.b2"], grads[pre + "mlp.w2"] = dr.sum(axis=0), product(c["m"].T, dr)
    dm = r.grad(product(dr, P[pre + "mlp.w2"].T))
    dz = r.grad(activations.gelu_backward(c["z"], dm, c["t"]))
    grads[pre + "mlp.b1"], grads[pre + "mlp.w1"] = dz.sum(axis=0), product(c["a2"].T, dz)
    dh1 = r.grad(dh + _ln_backward(P, pre + "ln2", product(dz, P[pre + "mlp.w1"].T), c["ln2"], grads, r))
    dr = r.grad(r.undrop(dh1, layer + ".resid1"))
    grads[pre + "attn.bo"], grads[pre + "attn.wo"] = dr.sum(axis=0), product(c["o"].T, dr)
    do = r.grad(product(dr, P[pre + "attn.wo"].T)).reshape(B, T, H, Dh).transpose(0, 2, 1, 3)
    dpd = product(do, c["v"].transpose(0, 1, 3, 2))
    dv = product(c["pd"].transpose(0, 1, 3, 2), do)
    dp = dpd if c["f"] is None else dpd * c["f"]
    p = wide(c["p"])
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True)) * (1.0 / math.sqrt(Dh))
    dq, dk = product(ds, c["k"]), product(ds.transpose(0, 1, 3, 2), c["q"])
    da = None
    for w, d in (("q", dq), ("k", dk), ("v", dv)):
        d = r.grad(d).transpose(0, 2, 1, 3).reshape(B * T, H * Dh)
        grads[pre + "attn.w" + w] = product(c["a"].T, d)
        if w != "k":
            grads[pre + "attn.b" + w] = d.sum(axis=0)
        part = product(d, P[pre + "attn.w" + w].T)
        da = part if da is None else da + part
    return dh1 + _ln_backward(P, pre + "ln1", da, c["ln1"], grads, r)

