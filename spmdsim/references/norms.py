"""Single-process float64 references of the normalizations along the last dim: layer norm and RMSNorm, forward
and backward, on (N, D) arrays. The GPT's reference (spmdsim.models.gpt) and the operator tests
(spmdsim.nn.ops.layer_norm, rms_norm) check against these. Pure numpy.
"""
from __future__ import annotations

import numpy as np

__all__ = ["layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward"]


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


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, tuple]:
    """x / sqrt(mean(x^2) + eps) * w over the last dim of x (N, D) (spmdsim.nn.ops.rms_norm's order)."""
    rstd = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    xhat = x * rstd
    return xhat * w, (xhat, rstd, w)


def rms_norm_backward(dy: np.ndarray, cache: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Gradients of x and w from dy (N, D)."""
    xhat, rstd, w = cache
    dxhat = dy * w
    return rstd * (dxhat - xhat * (dxhat * xhat).mean(axis=-1, keepdims=True)), (dy * xhat).sum(axis=0)
