"""An MoE layer in one numpy process, forward and hand-written backward (float64; pure).

The ranks' layer (spmdsim.models.moe.layer) is checked against this at every step.
Rows are tokens batch-first, (B * T, D): sequence b's tokens are rows
b*T .. b*T + T - 1, a routing group each (spmdsim.models.moe.routing). Each expert
is a GELU MLP, x @ w1[e] + b1[e], GELU, @ w2[e] + b2[e], or, where the
parameters have moe.w3 (the model's mlp "swiglu"), a SwiGLU MLP,
silu(x @ w1[e] + b1[e]) * (x @ w3[e] + b3[e]) @ w2[e] + b2[e], Mixtral's; a
bias the parameters lack (the model's bias False) is not added. Each runs on
the tokens routed to it, added to their output times the gate. The router is a
linear layer without bias, its softmax in float64; the load-balancing loss is
E * sum_e f_e P_e (f_e: the fraction of the k * N assignments routed to e
before dropping; P_e: e's mean probability over the N tokens) and the z-loss
the mean over tokens of logsumexp(logits)^2.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ...references.activations import gelu, gelu_backward, sigmoid
from .config import MoEConfig
from .routing import by_expert, followed, gates_backward, ranked, route, tie_margin

__all__ = ["moe_forward", "moe_backward", "router_losses", "chosen", "in_groups", "unrouted"]

Params = dict


def router_losses(logits: np.ndarray, probs: np.ndarray, counts: np.ndarray, top_k: int) -> tuple[float, float]:
    """(load-balancing loss, z-loss) of (N, E) logits and probabilities and (E,) assignment counts."""
    N, E = probs.shape
    f = counts / (top_k * N)
    aux = float(E * np.dot(f, probs.mean(axis=0)))
    lse = _logsumexp(logits)
    return aux, float(np.mean(lse * lse))


def chosen(logits: np.ndarray, probs: np.ndarray, x: np.ndarray, router: np.ndarray, B: int, top_k: int,
           follow: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """The (B, T, k) experts a reference routes (N, E) `logits` and `probs` of tokens x (N, D) to when it
    follows the ranks' `follow` at near-ties (spmdsim.models.moe.routing.followed); None (its own top-k) without."""
    if follow is None:
        return None
    N, E = logits.shape
    shape = (B, N // B, E)
    return followed(logits.reshape(shape), tie_margin(x, router, x.dtype).reshape(shape),
                    ranked(probs.reshape(shape), top_k), follow)


def _logsumexp(z: np.ndarray) -> np.ndarray:
    top = z.max(axis=-1)
    return top + np.log(np.exp(z - top[:, None]).sum(axis=-1))


def in_groups(x: np.ndarray, B: int, follow: Optional[np.ndarray], groups: tuple) -> tuple:
    """(rows, x's rows in that order, B x g sequences, `follow` in that order or None): the rows (batch-first,
    b T + t) in the order ranks route them where each sequence's `groups` = (its positions in the ranks' order, g)
    are g chunks of T / g tokens routed apart (context parallelism), each chunk a sequence of its own."""
    order, g = groups
    T = x.shape[0] // B
    rows = (np.arange(B)[:, None] * T + np.asarray(order)[None]).ravel()
    return rows, x[rows], B * g, None if follow is None else follow[:, list(order)].reshape(B * g, T // g, -1)


def unrouted(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`a`, rows in `in_groups`' order, back in the rows' own order."""
    out = np.empty_like(a)
    out[rows] = a
    return out


def moe_forward(params: Params, pre: str, x: np.ndarray, B: int, moe: MoEConfig,
                follow: Optional[np.ndarray] = None, groups: Optional[tuple] = None) -> tuple[np.ndarray, dict]:
    """The layer's output (N, D) for tokens x (N, D) in B sequences, and what the backward needs
    (its "aux" and "z": the two router losses, not yet weighted). `follow`: the ranks' (B, T, k) experts,
    taken where rounding alone can explain them (spmdsim.models.moe.routing.followed). `groups`: each sequence
    routed as chunks apart, each with its own capacity (`in_groups`; spmdsim.models.gpt.context.Laid)."""
    if groups is not None:
        rows, xg, Bg, mine = in_groups(x, B, follow, groups)
        out, cache = moe_forward(params, pre, xg, Bg, moe, mine)
        cache["rows"] = rows
        return unrouted(out, rows), cache
    N, D = x.shape
    T, E = N // B, moe.experts
    logits = x @ params[pre + "moe.router"]
    lse = _logsumexp(logits)
    probs = np.exp(logits - lse[:, None])
    routing = route(probs.reshape(B, T, E), moe.top_k, moe.capacity(T),
                    chosen(logits, probs, x, params[pre + "moe.router"], B, moe.top_k, follow))
    out = np.zeros_like(x)
    experts = []
    swiglu = pre + "moe.w3" in params
    for e, (where, tok, gate) in enumerate(by_expert(routing)):
        h = _biased(x[tok] @ params[pre + "moe.w1"][e], params, pre + "moe.b1", e)
        if swiglu:  # silu(h) * u
            u = _biased(x[tok] @ params[pre + "moe.w3"][e], params, pre + "moe.b3", e)
            s = sigmoid(h)
            a = h * s * u
        else:
            u = s = None
            a = gelu(h)
        y = _biased(a @ params[pre + "moe.w2"][e], params, pre + "moe.b2", e)
        np.add.at(out, tok, gate[:, None] * y)
        experts.append((where, tok, h, a, y, u, s))
    aux, z = router_losses(logits, probs, routing.counts.sum(axis=0), moe.top_k)
    return out, {"x": x, "logits": logits, "lse": lse, "probs": probs, "routing": routing, "experts": experts,
                 "aux": aux, "z": z, "B": B}


def _biased(y: np.ndarray, params: Params, name: str, e: int) -> np.ndarray:
    """y plus expert e's row of the bias `name` where the model has it (GPTConfig.bias)."""
    b = params.get(name)
    return y if b is None else y + b[e]


def moe_backward(params: Params, pre: str, dout: np.ndarray, c: dict[str, Any], moe: MoEConfig,
                 grads: Params) -> np.ndarray:
    """The input's gradient (N, D) from the output's (N, D), the router losses' weights included (their
    gradients join the router's); parameter gradients into `grads`."""
    rows = c.get("rows")
    if rows is not None:  # routed in chunks (`moe_forward`'s groups): its rows' order and back
        return unrouted(moe_backward(params, pre, dout[rows], {**c, "rows": None}, moe, grads), rows)
    x, probs, routing, B = c["x"], c["probs"], c["routing"], c["B"]
    N, D = x.shape
    E, T = moe.experts, N // B
    w1, w2, w3 = params[pre + "moe.w1"], params[pre + "moe.w2"], params.get(pre + "moe.w3")
    dx = np.zeros_like(x)
    dgates = np.zeros(routing.gates.shape)
    names = [n for n in ("w1", "b1", "w3", "b3", "w2", "b2") if pre + "moe." + n in params]
    parts = {n: np.zeros_like(params[pre + "moe." + n]) for n in names}
    for e, (where, tok, h, a, y, u, s) in enumerate(c["experts"]):
        gate = routing.gates[where]
        dgates[where] = np.einsum("nd,nd->n", dout[tok], y)
        dy = gate[:, None] * dout[tok]
        parts["w2"][e] = a.T @ dy
        da = dy @ w2[e].T
        if w3 is not None:  # a = silu(h) u: d u = da silu(h), d h = da u silu'(h), silu' = s (1 + h (1 - s))
            du = da * h * s
            dh = da * u * s * (1.0 + h * (1.0 - s))
            parts["w3"][e] = x[tok].T @ du
        else:
            dh = gelu_backward(h, da)
        parts["w1"][e] = x[tok].T @ dh
        for n, d in (("b1", dh), ("b2", dy)) + ((("b3", du),) if w3 is not None else ()):
            if n in parts:
                parts[n][e] = d.sum(axis=0)
        dxe = dh @ w1[e].T
        if w3 is not None:
            dxe += du @ w3[e].T
        np.add.at(dx, tok, dxe)
    for n in names:
        grads[pre + "moe." + n] = parts[n]
    dprobs = gates_backward(probs.reshape(B, T, E), routing, dgates).reshape(N, E)
    f = routing.counts.sum(axis=0) / (moe.top_k * N)
    dprobs += moe.aux_loss_coeff * E * f / N  # d(E * sum_e f_e mean(p_e)) / dp
    dlogits = probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True))
    dlogits += (moe.z_loss_coeff * 2.0 / N) * c["lse"][:, None] * probs  # d mean(lse^2) / dlogits
    grads[pre + "moe.router"] = x.T @ dlogits
    return dx + dlogits @ params[pre + "moe.router"].T
