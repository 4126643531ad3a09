"""Gradient rules of the losses: mean squared error and cross-entropy (vocab-parallel included).

Both gradients are local: each rank's rows (and, vocab-parallel, its
classes) from what its forward kept, times the loss's upstream gradient.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ....base.buffers import broadcast_zero
from ....base.flops import sweep
from ..graph import record, with_partial
from .grads import grad_tensor

__all__ = ["record_mse_loss", "record_cross_entropy"]


def record_mse_loss(out: Any, y: Any, target: Any, diff: np.ndarray, n: int) -> Any:
    """mean((y - target)^2) over `n` entries, `diff` this rank's y - target: dy = 2 diff / n, dtarget = -dy (no
    entries: `diff` is empty on every rank, and so is dy)."""

    def backward(dl: Any) -> tuple:
        g = diff * (2.0 / n if n else 0.0)
        if dl.local != 1:  # a loss scaled after mse_loss (backward() itself starts from 1)
            g *= dl.local
        return (grad_tensor(y, g, dl.layout.partial) if y._ag is not None else None,
                grad_tensor(target, -g, dl.layout.partial) if target._ag is not None else None)

    return record(out, "mse_loss", (y, target), backward, with_partial(out.layout, ()))


def record_cross_entropy(out: Any, logits: Any, labels: Any, *, e: np.ndarray, sum_exp: np.ndarray,
                         rows: np.ndarray, ids: np.ndarray, owned: np.ndarray, valid: np.ndarray, smooth: float,
                         classes: int, reduction: str, divisor: float) -> Any:
    """Cross-entropy of `logits` (this rank's block) against `labels`: dlogits = softmax - (1 - smooth) at
    each row's label - smooth / classes, times the upstream gradient; zero on ignored rows (all of them when
    every label is ignored: "mean" is NaN then, its gradient 0, as PyTorch's).

    From the forward: `e`, the block's shifted exponentials, and `sum_exp`, their row sums over every
    class; `rows`, the block's row indices; `ids`, each row's label as a column of this block (where
    `owned`); `valid`, the rows not ignored; `divisor`, what "mean" divided by.
    """

    def backward(dl: Any) -> tuple:
        sweep("cross_entropy", (e, sum_exp), (e,))  # softmax - the labels' one-hot, times the upstream
        block = logits.local.shape  # (rows..., classes): the rows flattened in e, its gradient shaped back
        if dl.mesh.engine.dry:  # shapes only: the gradient block is zeros, not worked out
            like = broadcast_zero(block, e.dtype)
            return grad_tensor(logits, dl.mesh.engine.local(np.divide, like), dl.layout.partial), None
        g = e / sum_exp[:, None]
        # Each row's label column (column 0, less 0, where another rank owns it): no array whose size depends
        # on the labels (a captured step replays; spmdsim.runtime.replay).
        if g.shape[1]:  # an uneven cut may leave a rank no classes
            g[rows, np.where(owned, ids, 0)] -= np.where(owned, 1.0 - smooth, 0.0)
        if smooth:
            g -= smooth / classes
        # "mean" of no counted row (every label ignored): the loss is NaN, 0 / 0, and the gradient 0, as
        # PyTorch's (its backward writes only the counted rows); no division by 0 then.
        upstream = dl.local.reshape(-1)[:, None] if reduction == "none" else dl.local / divisor if divisor \
            else dl.local
        g = g * upstream
        g[~valid] = 0.0  # after the upstream: an ignored row's gradient is 0 whatever the upstream (NaN too)
        return grad_tensor(logits, g.reshape(block) if g.shape != block else g, dl.layout.partial), None

    return record(out, "cross_entropy", (logits, labels), backward, with_partial(out.layout, ()))
