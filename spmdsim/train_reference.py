"""Single-process training of a seed `Network` in numpy float64: the reference the MPI trainer is checked against.

Pure numpy; never imports mpi4py. `ReferenceTrainer(net)` holds every
parameter whole (from the same SeededTensors the ranks cut their shards
from), runs the stages forward on the global batch, cross-entropy of the
output's last dim against the labels, the backward through `reference_grad`
and the optimizer update (textbook SGD with momentum and Adam, written
independently of `spmdsim.optim`). Each `step` returns the loss, every
parameter's gradient and every parameter after the update.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import reference
from . import reference_grad as rg
from .errors import OperatorError
from .nets.model import Network
from .engines.once import once

__all__ = ["ReferenceStep", "ReferenceTrainer", "OPTIMIZERS"]

#: Optimizers both trainers know.
OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class ReferenceStep:
    """One training step of the reference: loss, then per parameter (stage order) its gradient and new value."""

    loss: float
    grads: tuple[np.ndarray, ...]
    params: tuple[np.ndarray, ...]


class ReferenceTrainer:
    """``ReferenceTrainer(net, optimizer="sgd", lr=1e-2, momentum=0.0)``: the whole network in one process."""

    def __init__(self, net: Network, optimizer: str = "sgd", lr: float = 1e-2, momentum: float = 0.0,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        if optimizer not in OPTIMIZERS:
            raise OperatorError(f"optimizer {optimizer!r} must be one of {OPTIMIZERS!r}")
        self.net = net
        self.optimizer, self.lr, self.momentum, self.betas, self.eps = optimizer, lr, momentum, betas, eps
        self.params = [p.source.full().astype(np.float64) for s in net.stages for p in s.params]
        self.state: list = [None] * len(self.params)
        self.steps = 0

    def step(self, x: np.ndarray, labels: np.ndarray) -> ReferenceStep:
        """Forward, cross-entropy, backward and update on the global batch `x` with `labels`.

        Simulated ranks with equal trainers and batches compute it once
        (`spmdsim.sim.once`): the step's arrays are then shared, read-only.
        """
        config = (self.net, self.optimizer, self.lr, self.momentum, self.betas, self.eps)
        result, params, state = once(("spmdsim.ReferenceTrainer.step", self.steps), _train_step, config,
                                     tuple(self.params), tuple(self.state), self.steps, x, labels)
        self.params, self.state = list(params), list(state)
        self.steps += 1
        return result


def _train_step(config: tuple, params: tuple, state: tuple, steps: int, x: np.ndarray,
                labels: np.ndarray) -> tuple:
    """(ReferenceStep, parameters after the update, optimizer state after it); changes nothing given."""
    net, optimizer, lr, momentum, betas, eps = config
    saved = []
    it = iter(params)
    value = np.asarray(x, dtype=np.float64) if np.asarray(x).dtype.kind == "f" else np.asarray(x)
    for stage in net.stages:
        ps = [next(it) for _ in stage.params]
        saved.append((value, ps))
        value = _forward(stage.kind, value, ps, net.batch_dims)
    classes = value.shape[-1]
    loss, grad = rg.cross_entropy(value.reshape(-1, classes), np.asarray(labels).reshape(-1))
    grad = grad.reshape(value.shape)
    grads: list = []
    for index in reversed(range(len(net.stages))):
        inp, ps = saved[index]
        first = not any(s.params for s in net.stages[:index])  # nothing before needs a gradient
        grad, pgrads = _backward(net.stages[index].kind, inp, ps, grad, not first)
        grads = list(pgrads) + grads
    updated = [_update(optimizer, lr, momentum, betas, eps, steps + 1, p, g, st)
               for p, g, st in zip(params, grads, state)]
    new_params = tuple(p for p, _ in updated)
    step = ReferenceStep(loss, tuple(grads), tuple(p.copy() for p in new_params))
    return step, new_params, tuple(st for _, st in updated)


def _update(optimizer: str, lr: float, momentum: float, betas: tuple, eps: float, steps: int,
            p: np.ndarray, g: np.ndarray, state: Any) -> tuple:
    """(new parameter, new optimizer state): textbook SGD (with momentum) or Adam at step `steps`."""
    if optimizer == "sgd":
        if momentum:
            state = g.copy() if state is None else momentum * state + g
            g = state
        return p - lr * g, state
    b1, b2 = betas
    m, v = state if state is not None else (np.zeros_like(p), np.zeros_like(p))
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1**steps), v / (1 - b2**steps)
    return p - lr * m_hat / (np.sqrt(v_hat) + eps), (m, v)


def _forward(kind: str, x: np.ndarray, ps: list, batch_dims: int) -> np.ndarray:
    if kind == "flatten":
        return x.reshape(x.shape[:batch_dims] + (-1,))
    if kind in ("relu", "gelu"):
        return reference.activation(kind)(x)
    if kind == "embedding":
        return reference.embedding(x, ps[0])
    return reference.linear(x, *ps)  # matmul, linear, column_linear, row_linear


def _backward(kind: str, x: np.ndarray, ps: list, dy: np.ndarray, need_dx: bool) -> tuple:
    """(gradient of the stage's input (None unless `need_dx`), gradients of its parameters)."""
    if kind == "flatten":
        return (dy.reshape(x.shape) if need_dx else None), ()
    if kind in ("relu", "gelu"):
        return (dy * rg.ACTIVATION_GRADS[kind](x) if need_dx else None), ()
    if kind == "embedding":
        return None, (rg.embedding_grad(x, ps[0].shape[0], dy),)
    dx, dw, db = rg.linear_grads(x, ps[0], ps[1] if len(ps) > 1 else None, dy, need_dx)
    return dx, (dw,) if db is None else (dw, db)


def megatron_block(params: dict, x: np.ndarray, labels: np.ndarray, heads: int) -> tuple[float, dict]:
    """Loss and gradients of a transformer block with a language-model head, in numpy float64.

    ``x + attn(x)`` (multi-head attention, Wq/Wk/Wv (d, H*D), Wo (H*D, d), no biases),
    then ``+ mlp`` (W1, b1, GELU, W2, b2), then logits = x2 @ Wh and cross-entropy
    against `labels`. Returns (loss, {name: gradient}) for every entry of `params`
    and for "x".
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
    return loss, g
