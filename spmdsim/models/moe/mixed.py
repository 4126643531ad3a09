"""An MoE layer in one numpy process under a low-precision policy (fp32, bf16-mixed): the ranks' rounding points.

spmdsim.models.moe.reference computes in float64; under a policy (spmdsim.base.precision) the ranks' layer
(spmdsim.models.moe.layer) computes otherwise, and this module follows it operation by operation, as
spmdsim.models.gpt.mixed follows the dense blocks (its `_Rounder` `r` rounds to the activations' dtype):

- the router in float32 (Megatron's ``--moe-router-dtype fp32``): the tokens and the router weight
  widened, a float32 product, a float32 softmax, the top-k on float32 probabilities (bfloat16 ones
  would tie most choices) and float32 gates; the router losses in float32;
- each expert as the ranks' Linear: the product float32 BLAS on the widened blocks, rounded once to
  the activations' dtype, then its bias added and rounded again (no bias, GPTConfig bias False: the
  one rounding); GELU as spmdsim.references.activations computes a bfloat16 block (tanh in float32, the result
  rounded once), or a SwiGLU expert's gate (moe.w3 in the parameters): the sigmoid of fc1's output
  in float32, silu rounded once, times fc3's output in float32, rounded once; the output is each
  token's experts' outputs times their gates, summed in float32 and rounded once;
- backward: the output's gradient arrives rounded (the engine's rule); each expert's output rows'
  gradient (gate times it) rounded once, as the ranks round it before sending it back; GELU's output's
  and fc1's output's gradients rounded once before the rule reading them (SwiGLU: the gate's output's,
  silu's output's, fc1's and fc3's outputs' each once); each token row's gradient
  from its experts rounded once (the ranks' d xe, after its sum over tp), summed over the token's
  experts in float32; the weights' gradients float32 (Megatron's main_grad); the router's in float32.

The ranks differ from this only in the order of their float32 sums (an expert's slots batched, a
product split over tp summed by its collective), so the check's tolerances are spmdsim.models.gpt.mixed's;
where that order decides a near-tie between two experts' router logits, `follow` (the ranks' experts)
is taken (spmdsim.models.moe.routing.followed).
Pure: numpy.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ...references import activations
from ...base.precision import product, wide
from ...references.forward import softmax
from .config import MoEConfig
from .reference import chosen, in_groups, unrouted
from .routing import by_expert, gates_backward, route

__all__ = ["moe_forward_mixed", "moe_backward_mixed"]

_F32 = np.float32
_NAMES = ("w1", "b1", "w3", "b3", "w2", "b2")


def _f32(a: np.ndarray) -> np.ndarray:
    return wide(a).astype(_F32, copy=False)


def _linear(a: np.ndarray, w: np.ndarray, b: Optional[np.ndarray], r: Any) -> np.ndarray:
    return r(product(a, w)) if b is None else r(wide(r(product(a, w))) + wide(b))


def _bias(P: dict, name: str, e: int) -> Optional[np.ndarray]:
    b = P.get(name)
    return None if b is None else b[e]


def moe_forward_mixed(P: dict, pre: str, x: np.ndarray, B: int, moe: MoEConfig, r: Any,
                      follow: Optional[np.ndarray] = None, groups: Optional[tuple] = None) -> tuple[np.ndarray, dict]:
    """The layer's output (N, D), in the activations' dtype, for tokens x (N, D) in B sequences (batch-first
    rows), and what the backward needs, its "losses" the weighted router losses (float32). `follow`: the
    ranks' (B, T, k) experts, taken where rounding alone can explain them (spmdsim.models.moe.routing.followed);
    `groups`: each sequence routed as chunks apart (spmdsim.models.moe.reference.moe_forward's)."""
    if groups is not None:
        rows, xg, Bg, mine = in_groups(x, B, follow, groups)
        out, cache = moe_forward_mixed(P, pre, xg, Bg, moe, r, mine)
        cache["rows"] = rows
        return unrouted(out, rows), cache
    N, D = x.shape
    T, E = N // B, moe.experts
    x32, router = _f32(x), _f32(P[pre + "moe.router"])
    logits = product(x32, router)
    probs = softmax(logits, -1)
    routing = route(probs.reshape(B, T, E), moe.top_k, moe.capacity(T),
                    chosen(logits, probs, x, P[pre + "moe.router"], B, moe.top_k, follow))
    acc = np.zeros((N, D), _F32)
    experts = []
    swiglu = pre + "moe.w3" in P
    for e, (where, tok, gate) in enumerate(by_expert(routing)):
        h = _linear(x[tok], P[pre + "moe.w1"][e], _bias(P, pre + "moe.b1", e), r)
        if swiglu:  # the gate's sigmoid kept in float32 (t), silu rounded, times u rounded
            u = _linear(x[tok], P[pre + "moe.w3"][e], _bias(P, pre + "moe.b3", e), r)
            t = activations.sigmoid(wide(h))
            a = r(wide(r(wide(h) * t)) * wide(u))
        else:
            u = None
            t = activations.gelu_tanh(h)
            a = activations.gelu_from_tanh(h, t)
        y = _linear(a, P[pre + "moe.w2"][e], _bias(P, pre + "moe.b2", e), r)
        np.add.at(acc, tok, gate[:, None] * wide(y))
        experts.append((where, tok, h, t, a, y, u))
    # The router losses as the ranks' float32 operators: E * sum_e f_e mean(p_e), mean over tokens of lse^2.
    f = (routing.counts.sum(axis=0) / (moe.top_k * N)).astype(_F32)
    aux = np.sum(probs.mean(axis=0) * f) * _F32(E)
    top = logits.max(axis=-1, keepdims=True)
    lse = np.log(np.sum(np.exp(logits - top), axis=-1, keepdims=True)) + top
    z = np.mean(lse * lse)
    losses = aux * _F32(moe.aux_loss_coeff) + z * _F32(moe.z_loss_coeff)
    return r(acc), {"x": x, "x32": x32, "router": router, "lse": lse[:, 0], "probs": probs, "f": f,
                    "routing": routing, "experts": experts, "losses": losses, "B": B}


def moe_backward_mixed(P: dict, pre: str, dout: np.ndarray, c: dict, moe: MoEConfig, r: Any,
                       grads: dict) -> np.ndarray:
    """The input's gradient (N, D), float32 and not rounded (summed with the layer norm's other consumers
    first), from the output's `dout` (float32, rounded to the activations' dtype: the engine's rounding);
    the router losses' gradients (weighted) join the router's; parameter gradients (float32) into `grads`."""
    rows = c.get("rows")
    if rows is not None:  # routed in chunks (`moe_forward_mixed`'s groups): its rows' order and back
        return unrouted(moe_backward_mixed(P, pre, dout[rows], {**c, "rows": None}, moe, r, grads), rows)
    probs, routing, B = c["probs"], c["routing"], c["B"]
    N, D = c["x"].shape
    E, T = moe.experts, N // B
    w1, w2, w3 = P[pre + "moe.w1"], P[pre + "moe.w2"], P.get(pre + "moe.w3")
    dx = np.zeros((N, D), _F32)
    dgates = np.zeros(routing.gates.shape, _F32)
    names = [n for n in _NAMES if pre + "moe." + n in P]
    parts = {n: np.zeros(P[pre + "moe." + n].shape, _F32) for n in names}
    for e, (where, tok, h, t, a, y, u) in enumerate(c["experts"]):
        gate = routing.gates[where]
        g = dout[tok]
        dgates[where] = np.einsum("nd,nd->n", g, wide(y))
        dy = r.grad(gate[:, None] * g)  # the rows' gradient, rounded once where the ranks send it back
        parts["w2"][e] = product(a.T, dy)
        da = r.grad(product(dy, w2[e].T))
        if w3 is not None:  # a = silu(h) u, each factor's gradient rounded once, then silu's rule's
            du = r.grad(da * wide(r(wide(h) * t)))
            dh = r.grad(r.grad(da * wide(u)) * activations.silu_slope(wide(h), t))
            parts["w3"][e] = product(c["x"][tok].T, du)
        else:
            dh = r.grad(activations.gelu_backward(h, da, t))
        parts["w1"][e] = product(c["x"][tok].T, dh)
        for n, d in (("b1", dh), ("b2", dy)) + ((("b3", du),) if w3 is not None else ()):
            if n in parts:
                parts[n][e] = d.sum(axis=0)
        d = product(dh, w1[e].T)
        if w3 is not None:
            d += product(du, w3[e].T)
        np.add.at(dx, tok, r.grad(d))
    for n in names:
        grads[pre + "moe." + n] = parts[n]
    dprobs = gates_backward(probs.reshape(B, T, E), routing, dgates).reshape(N, E)
    # the router losses' gradients, seeded as the loss's (r.seed: a pipeline's microbatch, 1 / microbatches)
    dprobs += _F32(moe.aux_loss_coeff * E) * c["f"] / _F32(N) * r.seed  # d(E sum_e f_e mean(p_e)) / dp
    dlogits = probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True))
    # d mean(lse^2) / dlogits
    dlogits += (_F32(moe.z_loss_coeff * 2.0) / _F32(N)) * c["lse"][:, None] * probs * r.seed
    grads[pre + "moe.router"] = product(c["x32"].T, dlogits)
    return dx + product(dlogits, c["router"].T)
