"""The reference GPT step under a low-precision policy (fp32, bf16-mixed): the ranks' rounding points, in one process.

spmdsim.models.gpt.reference computes in float64. Under ``fp32`` or ``bf16-mixed`` (spmdsim.base.precision) the
ranks compute otherwise, and this module follows them operation by operation, with the same kernels
where they are pure (spmdsim.references.activations' GELU) and the same formulas elsewhere:

- each operator of the distributed model reads its operands widened to float32 and rounds its
  result once to the activations' dtype: the embeddings' sum, each dropout (x times its float32
  factor), each layer norm's (or RMSNorm's) output (TransformerEngine's fused norms: the statistics, the
  normalized values, times weight and plus bias in float32), each product (a float32 BLAS product of the
  widened blocks) and its plus-bias, the
  attention core's probabilities, their dropped-out values and its output, GELU (or SwiGLU's silu and
  its product), the rotary embeddings' two products and their sum (bfloat16 tables), the residual
  sums, the logits; cross-entropy in float32;
- under Megatron's kept set (``kept="megatron"``, spmdsim.nn.ops.megatron) the fused kernels that round
  otherwise than the graph's nodes: SwiGLU (bias_swiglu) as silu(gate) * up in float32, rounded once, its
  backward's two halves in float32 (rounded where fc1's rule reads them); grouped-query attention in the
  core's products (no repeated key/value heads: a group's gradient summed in float32, rounded once);
  the rotary embeddings (TransformerEngine's fused RoPE) on float32 tables, x cos + rotate_half(x) sin in
  float32, rounded once, their backward in float32;
- with ring attention over cp (``ring``, spmdsim.nn.ops.ring_attention) the core as the ring computes it:
  the probabilities and their dropped-out values in float32, never rounded, the output rounded once, and
  in the backward each row's sum of dO x O from the rounded output (flash attention's);
- in the backward, each activation's gradient is summed in float32 over its consumers and rounded
  once to the activations' dtype before its own rule runs, which computes in float32; a
  parameter's gradient stays float32 (Megatron's main_grad).

A sharded run differs from this only in the order of its float32 sums before each rounding: a
contraction split over ranks is summed from float32 partial products by its Allreduce or
Reduce_scatter, a parameter's gradient from each rank's rows, the loss from each rank's tokens. Where
two orders round a value to different neighbours (one bfloat16 ulp, 2**-7 of it), the difference
carries on through the step; spmdsim.models.gpt.tolerances says how far the check lets it go.
Pure: numpy.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from ...references import activations
from ...base.precision import Precision, product, rounded, wide
from .config import GPTConfig
from .params import padded_params, param_specs, unpadded_params
from ..moe.mixed import moe_backward_mixed, moe_forward_mixed
from ._blocks import rope_tables
from .mixed_fp8 import Linears, biased

__all__ = ["loss_and_grads", "architecture_problem"]

_F32 = np.float32


#: Llama's options this reference computes (GPTConfig): the MLP's width, grouped-query attention, an untied head,
#: no biases, RMSNorm (in float32, its output rounded once, as layer norm's), SwiGLU (silu
#: in float32, rounded; times the second product, rounded), rotary embeddings (bfloat16 tables; each product and
#: the sum rounded).
CHECKED = ("ffn", "kv_heads", "tied", "bias", "norm", "mlp", "positions")

#: Those it does not, by name (what it has instead): none now; an option added to GPTConfig whose rounding
#: points are not mirrored here goes here, and a checked low-precision run of it is refused in one line.
REFUSED: dict = {}


def architecture_problem(cfg: GPTConfig) -> Optional[str]:
    """Why this reference cannot check `cfg` (one line), or None: it computes the GPT's architecture with
    Llama's options CHECKED, not those REFUSED (checked at float64 only, spmdsim.models.gpt.reference)."""
    default = GPTConfig()
    changed = [f"{name} {getattr(cfg, name)!r}" for name in REFUSED if getattr(cfg, name) != getattr(default, name)]
    if not changed:
        return None
    return (f"a low-precision step is checked against spmdsim.models.gpt.mixed, which has the GPT's "
            f"{' and '.join(REFUSED.values())} only, not {', '.join(changed)}; check it at fp64, or run without "
            f"the check")


def loss_and_grads(params: dict, x: np.ndarray, y: np.ndarray, cfg: GPTConfig, step: Optional[int],
                   policy: Precision, masks: Optional[dict], routes: Optional[dict] = None,
                   kept: str = "graph", fp8: Optional[dict] = None, laid: Any = None,
                   ring: bool = False, seed: float = 1.0) -> tuple[float, dict]:
    """(loss, {name: float32 gradient}) of one step under `policy`; `params`: each parameter's values in
    the policy's parameter dtype (or exactly representable there); `masks`: spmdsim.models.gpt.reference's
    keep masks of the step (None without dropout). With vocabulary padding (cfg.vocab_pad_to), the unpadded
    model's from the padded model's `params`, wte's padded rows' gradients zero (spmdsim.models.gpt.reference's).
    `routes`: MoE layer ("h1") -> the ranks' (B, T, k) experts, followed at near-ties (spmdsim.models.moe.routing).
    `kept`: the ranks' kept set (spmdsim.models.gpt.parallel.GPT's), "megatron" rounding where its fused kernels round.
    `fp8`: under an FP8 policy, the run's scales at the step's start (spmdsim.models.gpt.mixed_fp8.Linears).
    `laid`: a context-parallel run's order (spmdsim.models.gpt.context.Laid: the chunks its experts route apart).
    `ring`: the run's attention core is ring attention (spmdsim.nn.ops.ring_attention: its probabilities in
    float32, never rounded; each row's dO x O summed from the rounded output, as flash attention's backward).
    `seed`: the loss's gradient, as the run scales it before its backward (a pipeline's microbatch: 1 / microbatches;
    the gradients returned are the scaled loss's: under FP8 the casts of the backward see the scaled values)."""
    if cfg.unpadded() is not cfg:
        loss, grads = loss_and_grads(unpadded_params(params, cfg), x, y, cfg.unpadded(), step, policy, masks,
                                     routes, kept, fp8, laid, ring, seed)
        return loss, padded_params(grads, cfg)
    act = policy.dtype("activation")
    P = {s.name: np.asarray(params[s.name]).astype(policy.dtype("param")) for s in param_specs(cfg)}
    r = _Rounder(act, cfg, masks, kept, Linears(policy.fp8, fp8), ring, seed)
    B, T = x.shape
    D = cfg.d_model
    # The token's embedding (rows of a bfloat16 table: the ranks' vocab-parallel sum of one row and zeros is exact),
    # plus its position's, rounded (rotary embeddings: none; they turn q and k in each block).
    h = P["wte"][x] if "wpe" not in P else r(wide(P["wte"][x]) + wide(P["wpe"])[None])
    h = r.drop(h, "emb").reshape(B * T, D)
    caches = []
    for layer in range(cfg.layers):
        h, c = _block(P, f"h{layer}.", h, B, cfg, r, (routes or {}).get(f"h{layer}"), getattr(laid, "groups", None))
        caches.append(c)
    hf, lnf = _ln(P, "lnf", h, cfg, r)
    head = "wte" if cfg.tied else "head.w"  # an untied head: its own (padded_vocab, D) weight
    z = r(product(hf, P[head].T))
    # Cross-entropy in float32, as the vocab-parallel kernel: shifted exponentials, their row sums.
    zw = wide(z)
    n = zw.shape[0]
    rows, ids = np.arange(n), y.reshape(-1)
    shift = zw.max(axis=1)
    e = np.exp(zw - shift[:, None])
    nll = np.log(e.sum(axis=1)) - (zw[rows, ids] - shift)
    loss = nll.sum() / np.asarray(float(n), _F32)
    for c in caches:  # the MoE layers' router losses, weighted, added as the ranks add them (float32)
        if "moe" in c:
            loss = loss + c["moe"]["losses"]
    g = e / e.sum(axis=1)[:, None]
    g[rows, ids] -= 1.0
    dz = r.grad(g * (np.asarray(r.seed) / float(n)))  # the upstream the ranks' rule divides by the tokens
    grads = _Grads()
    grads.dot(head, dz, hf)
    if not cfg.tied:  # the embedding's gradient from its lookups alone
        grads["wte"] = np.zeros(P["wte"].shape, _F32)
    dh = _ln_backward(P, "lnf", product(dz, P[head]), lnf, grads, r)
    for layer in reversed(range(cfg.layers)):
        dh = _block_backward(P, f"h{layer}.", dh, caches[layer], cfg, r, grads)
    dh0 = wide(r.grad(r.undrop(dh, "emb"))).reshape(B, T, D)
    np.add.at(grads["wte"], x.reshape(-1), dh0.reshape(B * T, D))
    if "wpe" in P:
        grads.total("wpe", dh0)
    return float(loss), {s.name: grads[s.name].astype(_F32) for s in param_specs(cfg)}


class _Grads(dict):
    """The parameters' gradients (float32), by name."""

    def dot(self, name: str, a: np.ndarray, d: np.ndarray) -> None:
        """A weight's gradient: a^T d over the tokens (a float32 product)."""
        self[name] = product(a.T, d)

    def total(self, name: str, d: np.ndarray, params: Optional[dict] = None) -> None:
        """A bias's (or layer norm weight's) gradient: d summed over the tokens; with `params`, only where
        the model has the bias (GPTConfig.bias)."""
        if params is None or name in params:
            self[name] = d.sum(axis=0)


class _Rounder:
    """Rounding to the activations' dtype, the dropout masks as the ranks' float32 factors."""

    def __init__(self, act: np.dtype, cfg: GPTConfig, masks: Optional[dict], kept: str = "graph",
                 lin: Optional[Linears] = None, ring: bool = False, seed: float = 1.0) -> None:
        self.act, self.masks, self.lin = act, masks, lin or Linears()
        self.fused = kept == "megatron"  # Megatron's fused kernels' rounding points (spmdsim.nn.ops.megatron)
        self.ring = ring  # ring attention's rounding points (spmdsim.nn.ops.ring_attention)
        self.seed = _F32(seed)  # the loss's gradient (a pipeline's microbatch: 1 / microbatches)
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
    """The norm (GPTConfig.norm) as the ranks' fused node (spmdsim.nn.ops.norms, TransformerEngine's fused
    LayerNorm and RMSNorm, in either kept set): the statistics (layer norm's mean and variance, RMSNorm's mean
    square, in the kernel's order), the normalized values, times weight and plus bias (layer norm's) in float32,
    the output rounded once."""
    n = h.shape[-1]
    inv = 1.0 / n
    block = wide(h)
    centre = pre + ".b" in P  # layer norm (RMSNorm has no bias: spmdsim.models.gpt.params)
    c = block - np.sum(block, axis=-1, keepdims=True) * inv if centre else block
    root = np.sqrt(np.sum(c * c, axis=-1, keepdims=True) * inv + cfg.ln_eps)
    yn = c / root
    out = yn * wide(P[pre + ".w"])
    return r(out + wide(P[pre + ".b"]) if centre else out), (yn, 1.0 / root)


def _ln_backward(P: dict, pre: str, da: np.ndarray, cache: tuple, grads: dict, r: _Rounder) -> np.ndarray:
    """The norm's input gradient (float32, not rounded: summed with the residual's first), as the fused node's
    rule (spmdsim.nn.autograd.rules.norms): the output's gradient rounded where the walk reads it, all else
    float32 (the normalized values, dY w); RMSNorm's without mean(dY)."""
    yn, rstd = cache
    da = r.grad(da)
    centre = pre + ".b" in P
    grads.total(pre + ".b", da, P)
    grads.total(pre + ".w", da * yn)
    dy = da * wide(P[pre + ".w"])
    inv = 1.0 / yn.shape[-1]
    g = dy - np.sum(dy * yn, axis=-1, keepdims=True) * inv * yn
    if centre:
        g = g - np.sum(dy, axis=-1, keepdims=True) * inv
    return g * rstd


def _linear(P: dict, name: str, bias: Optional[str], a: np.ndarray, r: _Rounder,
            site: Optional[str] = None) -> np.ndarray:
    """a @ P[name], rounded, plus the bias `bias` where the model has one (GPTConfig.bias), rounded (FP8: rounded
    once; `site` names the input's scale: spmdsim.models.gpt.mixed_fp8)."""
    fused = r.lin.recipe is not None and site is not None  # FP8's column layers: the bias in the GEMM's epilogue
    return biased(r.lin.forward(P, name, a, site), P.get(bias) if bias else None, r.act, fused)


def _rope_tables(cfg: GPTConfig, T: int, r: _Rounder) -> tuple[np.ndarray, np.ndarray]:
    """Rotary embeddings' (cos, sin), each (T, 2, head_dim / 2) widened: spmdsim.models.gpt._blocks.rope_tables' float64
    values rounded once to the activations' dtype, as the ranks make their tables (GPT._rope); under Megatron's
    kept set rounded once to float32 (GPT._rotary: the fused kernel's float32 tables)."""
    half = cfg.head_dim // 2
    if r.fused:
        return tuple(t.astype(_F32).reshape(T, 2, half) for t in rope_tables(T, cfg.head_dim))
    return tuple(wide(r(t)).reshape(T, 2, half) for t in rope_tables(T, cfg.head_dim))


def _rope(x: np.ndarray, tables: tuple, r: _Rounder) -> np.ndarray:
    """x (B, heads, T, head_dim) turned as the ranks' nodes (GPT._rope) round it: x cos, rounded; rotate_half(x)
    (a product with a 2 x 2 turn of the halves: exact), rounded; times sin, rounded; the sum, rounded."""
    cos, sin = tables
    B, n, T, Dh = x.shape
    xw = wide(x).reshape(B, n, T, 2, Dh // 2)
    turned = np.stack([-xw[..., 1, :], xw[..., 0, :]], axis=-2)  # [x1, x2] -> [-x2, x1]
    if r.fused:  # Megatron's fused rotary (spmdsim.nn.ops.megatron.rotary): in float32, rounded once
        return r(xw * cos + turned * sin).reshape(B, n, T, Dh)
    return r(wide(r(xw * cos)) + wide(r(wide(r(turned)) * sin))).reshape(B, n, T, Dh)


def _rope_backward(d: np.ndarray, tables: tuple, r: _Rounder) -> np.ndarray:
    """`_rope`'s input gradient from its output's `d` (float32, rounded): d cos (the first product's rule, float32)
    plus the turn's transpose of d sin (the second product's rule, rounded at the turn's node), summed in
    float32 (not rounded: the caller rounds it where the ranks' reshape does)."""
    cos, sin = tables
    B, n, T, Dh = d.shape
    dw = d.reshape(B, n, T, 2, Dh // 2)
    u = dw * sin if r.fused else r.grad(dw * sin)  # the fused rotary's backward: float32 throughout
    return (dw * cos + np.stack([u[..., 1, :], -u[..., 0, :]], axis=-2)).reshape(B, n, T, Dh)


def _swiglu(z: np.ndarray, u: np.ndarray, r: _Rounder) -> tuple[np.ndarray, np.ndarray]:
    """(silu(z) * u, silu(z)) as the ranks' two nodes (ops.silu, then a product): silu computed in float32 on the
    widened z (spmdsim.nn.ops.pointwise's kernel, x sigmoid(x)) and rounded, the product of the widened factors
    rounded. Under Megatron's kept set as its fused bias_swiglu (spmdsim.nn.ops.megatron.swiglu): the product of
    the widened z sigmoid(z) and u in float32, rounded once, silu(z) left in float32."""
    zw = wide(z)
    if r.fused:
        s = zw * activations.sigmoid(zw)
        return r(s * wide(u)), s
    s = r(zw * activations.sigmoid(zw))
    return r(wide(s) * wide(u)), s


def _block(P: dict, pre: str, h: np.ndarray, B: int, cfg: GPTConfig, r: _Rounder,
           follow: Optional[np.ndarray] = None, groups: Optional[tuple] = None) -> tuple:
    T, H, Dh, KV = h.shape[0] // B, cfg.heads, cfg.head_dim, cfg.kv
    layer = pre[:-1]
    a, ln1 = _ln(P, pre + "ln1", h, cfg, r)

    def heads(w: str, n: int) -> np.ndarray:
        out = _linear(P, pre + "attn.w" + w, None if w == "k" else pre + "attn.b" + w, a, r, pre + "attn")
        return out.reshape(B, T, n, Dh).transpose(0, 2, 1, 3)

    q, k, v = heads("q", H), heads("k", KV), heads("v", KV)
    rope = _rope_tables(cfg, T, r) if cfg.positions == "rope" else None
    if rope is not None:  # q and k turned before k is repeated for its query heads (the ranks' order)
        q, k = _rope(q, rope, r), _rope(k, rope, r)
    if KV != H:  # grouped-query attention: each key/value head repeated for its query heads (times ones: exact)
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
    s = product(q, k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(Dh))
    s = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, s)
    e = np.exp(s - np.max(s, axis=-1, keepdims=True))
    p = e / np.sum(e, axis=-1, keepdims=True)
    f = r.factors(layer + ".attn", p.shape)
    if r.ring:  # the ring's probabilities and their dropped-out values: float32, never rounded
        pd = p if f is None else p * f
    else:  # the core's: each rounded
        p = r(p)
        pd = p if f is None else r(wide(p) * f)
    o = r(product(pd, v)).transpose(0, 2, 1, 3).reshape(B * T, H * Dh)
    h1 = r(wide(h) + wide(r.drop(_linear(P, pre + "attn.wo", pre + "attn.bo", o, r), layer + ".resid1")))
    a2, ln2 = _ln(P, pre + "ln2", h1, cfg, r)
    if cfg.is_moe(int(layer[1:])):  # the MoE layer (spmdsim.models.moe.mixed), its router losses in the cache
        out, moe = moe_forward_mixed(P, pre, a2, B, cfg.moe, r, follow, groups)
        h2 = r(wide(h1) + wide(r.drop(out, layer + ".resid2")))
        return h2, {"a": a, "ln1": ln1, "q": q, "k": k, "v": v, "p": p, "pd": pd, "f": f, "o": o, "a2": a2,
                    "ln2": ln2, "moe": moe, "B": B, "rope": rope}
    zpre = _linear(P, pre + "mlp.w1", pre + "mlp.b1", a2, r, pre + "mlp")
    gate = {}
    if cfg.mlp == "swiglu":  # silu(z) (its float32 kernel, rounded) times the second product (rounded), rounded
        u = _linear(P, pre + "mlp.w3", pre + "mlp.b3", a2, r, pre + "mlp")
        (m, s), t = _swiglu(zpre, u, r), None
        gate = {"s": s, "u": u}
    else:
        t = activations.gelu_tanh(zpre)
        m = activations.gelu_from_tanh(zpre, t)
    out = _linear(P, pre + "mlp.w2", pre + "mlp.b2", m, r)
    h2 = r(wide(h1) + wide(r.drop(out, layer + ".resid2")))
    return h2, {"a": a, "ln1": ln1, "q": q, "k": k, "v": v, "p": p, "pd": pd, "f": f, "o": o, "a2": a2,
                "ln2": ln2, "z": zpre, "t": t, "m": m, "B": B, "rope": rope, **gate}


def _block_backward(P: dict, pre: str, dh: np.ndarray, c: dict, cfg: GPTConfig, r: _Rounder,
                    grads: dict) -> np.ndarray:
    """The block's input gradient (float32, summed) from its output's (float32, summed)."""
    B, H, Dh, KV = c["B"], cfg.heads, cfg.head_dim, cfg.kv
    T, layer = dh.shape[0] // B, pre[:-1]
    dh = r.grad(dh)
    dr = r.grad(r.undrop(dh, layer + ".resid2"))
    if "moe" in c:
        da2 = moe_backward_mixed(P, pre, dr, c["moe"], cfg.moe, r, grads)
    else:
        grads.total(pre + "mlp.b2", dr, P)
        dm = r.grad(r.lin.back(grads, P, pre + "mlp.w2", c["m"], dr))
        if "s" in c:
            if r.fused:  # Megatron's swiglu_back: both halves in float32 from z and u, rounded once
                du = r.grad(dm * c["s"])
                dz = r.grad(dm * activations.silu_slope(wide(c["z"])) * wide(c["u"]))
            else:  # SwiGLU: the product's rule (float32), each factor's gradient rounded at its node
                du = r.grad(dm * wide(c["s"]))
                ds = r.grad(dm * wide(c["u"]))
                dz = r.grad(ds * activations.silu_slope(wide(c["z"])))
            grads.total(pre + "mlp.b3", du, P)
        else:
            dz = r.grad(activations.gelu_backward(c["z"], dm, c["t"]))
        grads.total(pre + "mlp.b1", dz, P)
        da2 = r.lin.back(grads, P, pre + "mlp.w1", c["a2"], dz)
        if "s" in c:  # a2's gradient summed over its two products (float32)
            da2 = da2 + r.lin.back(grads, P, pre + "mlp.w3", c["a2"], du)
    dh1 = r.grad(dh + _ln_backward(P, pre + "ln2", da2, c["ln2"], grads, r))
    dr = r.grad(r.undrop(dh1, layer + ".resid1"))
    grads.total(pre + "attn.bo", dr, P)
    do = r.grad(r.lin.back(grads, P, pre + "attn.wo", c["o"], dr)).reshape(B, T, H, Dh).transpose(0, 2, 1, 3)
    dpd = product(do, c["v"].transpose(0, 1, 3, 2))
    dv = product(c["pd"].transpose(0, 1, 3, 2), do)
    dp = dpd if c["f"] is None else dpd * c["f"]
    p = wide(c["p"])
    if r.ring:  # each row's sum of dO x O, O the core's rounded output (flash attention's backward)
        delta = np.sum(do * wide(c["o"]).reshape(B, T, H, Dh).transpose(0, 2, 1, 3), axis=-1, keepdims=True)
    else:
        delta = np.sum(dp * p, axis=-1, keepdims=True)
    ds = p * (dp - delta) * (1.0 / math.sqrt(Dh))
    dq, dk = product(ds, c["k"]), product(ds.transpose(0, 1, 3, 2), c["q"])
    da = None
    for w, d, n in (("q", dq, H), ("k", dk, KV), ("v", dv, KV)):
        if n == H:
            d = r.grad(d)
        else:  # the repeat's gradient: its query heads' summed (float32), rounded where the product reads it (each
            # head's rounded first at the repeat's node; under Megatron's kept set the core sums the group in its
            # product, float32, and no repeat rounds them)
            d = d if r.fused else r.grad(d)
            d = r.grad(d.reshape(B, KV, H // KV, T, Dh).sum(axis=2))
        if w != "v" and c["rope"] is not None:  # the turn's gradient, rounded where the product's output is reshaped
            d = r.grad(_rope_backward(d, c["rope"], r))
        d = d.transpose(0, 2, 1, 3).reshape(B * T, n * Dh)
        part = r.lin.back(grads, P, pre + "attn.w" + w, c["a"], d)
        if w != "k":
            grads.total(pre + "attn.b" + w, d, P)
        da = part if da is None else da + part
    return dh1 + _ln_backward(P, pre + "ln1", da, c["ln1"], grads, r)
