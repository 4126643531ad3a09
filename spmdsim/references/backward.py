"""Single-process numpy gradients of every operator and loss (the backward's references).

Pure numpy; never imports mpi4py. Each ``*_grads`` function takes the
forward's inputs and the output's gradient ``dy`` and returns the inputs'
gradients; losses return ``(value, gradient)``. Whole arrays, float64 math,
results in the inputs' dtype (as `spmdsim.references.forward` does for the forward).
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import numpy as np

from ..errors import OperatorError, ShapeError
from .forward import _SQRT_2_OVER_PI, gelu_tanh

__all__ = [
    "relu_grad", "gelu_grad", "ACTIVATION_GRADS", "softmax_grad", "matmul_grads", "linear_grads",
    "embedding_grad", "mse_loss", "cross_entropy", "numeric_grads", "numeric_grad_parts",
    "numeric_grad_values", "split_flat",
]


def relu_grad(x: np.ndarray) -> np.ndarray:
    """d relu / dx: 1 where x > 0, else 0 (0 at 0, as PyTorch), in x's dtype."""
    return (x > 0).astype(x.dtype)


def gelu_grad(x: np.ndarray, tanh: Optional[np.ndarray] = None) -> np.ndarray:
    """d gelu / dx of the tanh approximation, in x's dtype.

    `tanh`: the forward's ``reference.gelu_tanh(x)`` (float64) when it was kept,
    so the backward does not compute it again; it is not modified.
    """
    x = np.asanyarray(x)  # a captured step's traced block stays traced (spmdsim.runtime.replay)
    x64 = x.astype(np.float64, copy=False)
    t = gelu_tanh(x64) if tanh is None else tanh
    # 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2), in that order (rounding as
    # the textbook expression rounds), on two temporaries besides the tanh.
    tmp = np.multiply(t, t)
    np.subtract(1.0, tmp, out=tmp)
    right = np.multiply(x64, 0.5)
    right *= tmp
    right *= _SQRT_2_OVER_PI
    np.multiply(x64, x64, out=tmp)
    tmp *= 3 * 0.044715
    tmp += 1.0
    right *= tmp
    np.add(t, 1.0, out=tmp)
    tmp *= 0.5
    tmp += right
    return tmp.astype(x.dtype, copy=False)


ACTIVATION_GRADS: dict[str, Callable[[np.ndarray], np.ndarray]] = {"relu": relu_grad, "gelu": gelu_grad}


def softmax_grad(s: np.ndarray, dy: np.ndarray, dim: int = -1) -> np.ndarray:
    """dx of s = softmax(x) along `dim`: s * (dy - sum(dy * s))."""
    return s * (dy - np.add.reduce(dy * s, dim, keepdims=True))  # (np.sum's reduction, without its wrapper)


def matmul_grads(x: np.ndarray, w: np.ndarray, dy: np.ndarray, transpose_a: bool = False,
                 transpose_b: bool = False, need_dx: bool = True) -> tuple[Optional[np.ndarray], np.ndarray]:
    """(dx, dw) of y = op(x) @ op(w); a 2-d w shared by a batched x gets the batch summed.

    `need_dx` False skips dx (None): a network's first layer, whose input is data.
    """
    f = np.float64
    a = np.swapaxes(x, -1, -2) if transpose_a else x
    b = np.swapaxes(w, -1, -2) if transpose_b else w
    da = np.matmul(dy.astype(f), np.swapaxes(b, -1, -2).astype(f)) if need_dx else None
    db = np.matmul(np.swapaxes(a, -1, -2).astype(f), dy.astype(f))
    if w.ndim == 2 and db.ndim > 2:
        db = db.sum(axis=tuple(range(db.ndim - 2)))
    dw = np.swapaxes(db, -1, -2) if transpose_b else db
    if da is None:
        return None, dw.astype(w.dtype)
    dx = np.swapaxes(da, -1, -2) if transpose_a else da
    return dx.astype(x.dtype), dw.astype(w.dtype)


def linear_grads(x: np.ndarray, w: np.ndarray, b: Optional[np.ndarray], dy: np.ndarray,
                 need_dx: bool = True) -> tuple[Optional[np.ndarray], np.ndarray, Optional[np.ndarray]]:
    """(dx, dw, db) of y = x @ w + b (db None without a bias; dx None unless `need_dx`)."""
    dx, dw = matmul_grads(x, w, dy, need_dx=need_dx)
    db = None if b is None else dy.reshape(-1, dy.shape[-1]).astype(np.float64).sum(0).astype(b.dtype)
    return dx, dw, db


def embedding_grad(ids: np.ndarray, num_embeddings: int, dy: np.ndarray) -> np.ndarray:
    """d table of table[ids]: each id's row gets the sum of its dy rows."""
    g = np.zeros((num_embeddings, dy.shape[-1]), np.float64)
    np.add.at(g, np.asanyarray(ids).reshape(-1), dy.reshape(-1, dy.shape[-1]))
    return g.astype(dy.dtype)


def mse_loss(y: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
    """(mean((y - target)^2), its gradient with respect to y); no entries: (NaN, the empty gradient), as PyTorch's."""
    if np.shape(y) != np.shape(target):
        raise ShapeError(f"mse_loss: target of shape {np.shape(target)!r} does not match y's {np.shape(y)!r}")
    diff = np.asarray(y, np.float64) - np.asarray(target, np.float64)
    n = diff.size
    with np.errstate(invalid="ignore"):  # no entries: 0 / 0
        loss = float(np.sum(diff * diff) / n)
    return loss, ((2.0 / n if n else 0.0) * diff).astype(np.asarray(y).dtype)


def cross_entropy(logits: np.ndarray, labels: np.ndarray,
                  ignore_index: Optional[int] = -100) -> tuple[float, np.ndarray]:
    """(mean over the batch of -log softmax(logits)[label], its gradient w.r.t. the logits).

    As PyTorch's ``F.cross_entropy``: rows whose label is `ignore_index` (None: none) count for nothing
    and the mean is over the rows that count; with none counted it is NaN (0 / 0) and the gradient 0.
    """
    z = np.asarray(logits, np.float64)
    labels = np.asarray(labels)
    if z.ndim != 2 or labels.shape != z.shape[:1]:
        raise ShapeError(f"cross_entropy: logits {z.shape!r} must be (batch, classes) and labels "
                         f"(batch,), got labels {labels.shape!r}")
    valid = labels != ignore_index if ignore_index is not None else np.ones(labels.shape, bool)
    if np.any(valid & ((labels < 0) | (labels >= z.shape[1]))):
        raise OperatorError(f"cross_entropy: labels must be in [0, {z.shape[1]})"
                            + (f" or be ignore_index {ignore_index}" if ignore_index is not None else ""))
    labels = np.where(valid, labels, 0)
    counted = int(np.count_nonzero(valid))
    shifted = z - z.max(axis=1, keepdims=True)
    log_sum = np.log(np.exp(shifted).sum(axis=1))
    rows = np.arange(z.shape[0])
    total = float(np.sum(np.where(valid, log_sum - shifted[rows, labels], 0.0)))
    grad = np.exp(shifted - log_sum[:, None])
    grad[rows, labels] -= 1.0
    grad[~valid] = 0.0
    if counted:
        grad /= counted
    return (total / counted if counted else math.nan), grad.astype(np.asarray(logits).dtype)


def numeric_grad_parts(shapes: Sequence[tuple[int, ...]], batch: int = 0) -> list[tuple[int, int, int]]:
    """`numeric_grads`' work in its order: runs ``(array, start, stop)`` of flat elements, one call of `fn`
    on ``2 (stop - start)`` copies each with ``batch`` > 0 (`batch` elements a run, an array's last run
    shorter), one element a run else. The runs' values laid end to end are the gradients' elements, array
    after array (C order); a run's values do not depend on which other runs are computed with it, so ranks
    that compute different runs and place the values get `numeric_grads`' bits (spmdsim.runtime.shared_numeric_grads).
    """
    step = batch if batch > 0 else 1
    parts = []
    for k, shape in enumerate(shapes):
        size = math.prod(shape)
        parts += [(k, start, min(size, start + step)) for start in range(0, size, step)]
    return parts


def numeric_grad_values(fn: Callable[..., np.ndarray], arrays: Sequence[np.ndarray],
                        parts: Sequence[tuple[int, int, int]], h: float = 1e-6, batch: int = 0) -> np.ndarray:
    """The central differences of `parts` (runs of `numeric_grad_parts`), laid end to end (float64)."""
    base = [np.array(a, dtype=np.float64) for a in arrays]
    out = np.empty(sum(stop - start for _, start, stop in parts), np.float64)
    at = 0
    for k, start, stop in parts:
        a, n = base[k], stop - start
        values = a.reshape(-1)
        if batch > 0:
            moving = np.arange(start, stop)
            copies = np.repeat(values[None], 2 * n, axis=0)
            copies[np.arange(n), moving] += h
            copies[np.arange(n, 2 * n), moving] -= h
            moved = base[:k] + [copies.reshape((-1,) + a.shape)] + base[k + 1:]
            sums = np.asarray(fn(*moved), dtype=np.float64).reshape(2 * n, -1).sum(axis=1)
            out[at:at + n] = (sums[:n] - sums[n:]) / (2 * h)
        else:
            for i in range(start, stop):
                old = values[i]
                values[i] = old + h
                up = float(np.sum(fn(*base)))
                values[i] = old - h
                down = float(np.sum(fn(*base)))
                values[i] = old
                out[at + i - start] = (up - down) / (2 * h)
        at += n
    return out


def numeric_grads(fn: Callable[..., np.ndarray], *arrays: np.ndarray, h: float = 1e-6,
                  batch: int = 0) -> list[np.ndarray]:
    """Central differences of ``sum(fn(*arrays))`` with respect to each array (float64; small arrays).

    The reference for a program with no hand-written backward: 2 evaluations of `fn` per element.
    With ``batch`` > 0, `fn` must broadcast over a leading axis of copies that one argument may have (the
    others keep their shapes) and return one result per copy along axis 0: the 2 x `batch` copies of
    one call each move one element by +h or -h, so a program of many small numpy calls pays their
    overhead once per `batch` elements instead of once per element (the same differences).
    Ranks of one program share the work with spmdsim.runtime.shared_numeric_grads (the same bits).
    """
    shapes = [np.shape(a) for a in arrays]
    flat = numeric_grad_values(fn, arrays, numeric_grad_parts(shapes, batch), h, batch)
    return split_flat(flat, shapes)


def split_flat(flat: np.ndarray, shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """`flat` cut into consecutive arrays of `shapes` (copies)."""
    out, at = [], 0
    for shape in shapes:
        size = math.prod(shape)
        out.append(flat[at:at + size].reshape(shape).copy())
        at += size
    return out
