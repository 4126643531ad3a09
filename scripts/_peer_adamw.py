"""The hand-written peers' AdamW (scripts/_peer_mpi4py_step.py and the peers built on it): its state laid flat.

`flat_state` lays a rank's blocks end to end in one flat buffer (and its gradients, moments) with views in each
block's shape; `adamw_flat` steps AdamW in place over those buffers, with torch's semantics (weight decay on the
2-d weights, laid first). No spmdsim: the peers are what an expert writes on numpy and mpi4py alone.
"""
from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["flat_state", "adamw_flat"]


def flat_state(blocks: dict, order: list) -> tuple:
    """AdamW's flat state over `blocks` (name -> this rank's block) laid end to end in `order`: (theta, grad, m, v,
    params, grads), theta a copy of the blocks, grad, m and v zeros, params and grads name -> views of theta and
    grad in each block's shape."""
    total = sum(blocks[n].size for n in order)
    theta, grad, m, v = np.empty(total), np.zeros(total), np.zeros(total), np.zeros(total)
    params, grads, at = {}, {}, 0
    for name in order:
        size, shape = blocks[name].size, blocks[name].shape
        params[name] = theta[at:at + size].reshape(shape)
        grads[name] = grad[at:at + size].reshape(shape)
        params[name][...] = blocks[name]
        at += size
    return theta, grad, m, v, params, grads


def adamw_flat(cfg: Any, t: int, theta: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray,
               n_decay: int) -> None:
    """Step `t` of AdamW in place over flat buffers (the formulas of spmdsim.nn.optim.adamw_update), weight
    decay on the first `n_decay` entries (the 2-d weights); both hand-written peers call it."""
    (b1, b2), lr = cfg.betas, cfg.lr
    decaying = theta[:n_decay]
    decaying -= lr * cfg.weight_decay * decaying
    m *= b1
    m += (1 - b1) * grad
    v *= b2
    v += (1 - b2) * grad * grad
    theta -= lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + cfg.eps)
