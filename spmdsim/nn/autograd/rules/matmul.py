"""Gradient rules of the products and lookups: MatMul, Linear, the fused MLP, Embedding.

The gradient arrives in the local product's tensor map (`Node.want`), so the
forward's Allreduce answers with nothing and its Reduce_scatter with an
Allgather; each input's gradient is pending over the axes its local product
summed over (a split contraction: the conjugate of a replicated input is a
pending sum, which the backward walk resolves by Allreduce or Reduce_scatter
where it must). Local math only.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ....references import activations
from ....base import buffers
from ....runtime.engines import local as _local  # the kernel; the dry engine's zeros, not computed
from ....runtime.engines import matmul as _product  # np.matmul; the dry engine's zeros, unmultiplied
from ....base.flops import any_open, sweep
from ....layouts.layout import TensorLayout
from ....base.precision import as_rows
from ..graph import record, with_partial
from .grads import axes_of, grad_tensor, named

_SUM = np.add.reduce  # ndarray.sum's own kernel, without its Python wrapper (numpy's _methods._sum)

__all__ = ["record_matmul", "record_linear", "record_mlp", "record_embedding"]


def _swap(a: np.ndarray) -> np.ndarray:
    return np.swapaxes(a, -1, -2)


def _matmul_grads(x: Any, w: Any, local: TensorLayout, ta: bool, tb: bool, dy: Any,
                  need_x: bool, need_w: bool) -> tuple[Optional[Any], Optional[Any]]:
    """(dX, dW) of Y = op(X) @ op(W) from dY in the local product's tensor map.

    dX sums over N (pending over N's axes and over W's own pending axes);
    dW sums over M and, for a 2-d W, over the batch dims (pending over their axes).
    """
    passed = dy.layout.partial
    a = _swap(x.local) if ta else x.local
    b = _swap(w.local) if tb else w.local
    gx = gw = None
    if need_x:
        da = _product(dy.local, _swap(b))
        gx = grad_tensor(x, _swap(da) if ta else da, passed, axes_of(local, local.tensor_map[-1:]),
                         w.layout.partial)
    if need_w:
        db = _product(_swap(a), dy.local)
        summed = local.tensor_map[-2:-1]
        if w.layout.ndim == 2 and db.ndim > 2:
            db = _SUM(db, axis=tuple(range(db.ndim - 2)))
            summed = local.tensor_map[:-1]
        gw = grad_tensor(w, _swap(db) if tb else db, passed, axes_of(local, summed), x.layout.partial)
    return gx, gw


def record_matmul(out: Any, x: Any, w: Any, plan: Any, ta: bool, tb: bool, label: Optional[str] = None) -> Any:
    """Y = op(x) @ op(w): the gradient arrives in the local product's map (the resolution's conjugate)."""
    need = (x._ag is not None, w._ag is not None)

    def backward(dy: Any) -> tuple:
        return _matmul_grads(x, w, plan.local, ta, tb, dy, *need)

    return record(out, named("matmul", label, plan), (x, w), backward, with_partial(plan.local, ()))


def record_linear(out: Any, x: Any, w: Any, bias: Any, plan: Any, label: Optional[str] = None) -> Any:
    """x @ w + bias (bias added once); the gather's conjugate is a local slice, the Allreduce's nothing."""
    local = plan.matmul.local
    need = (x._ag is not None, w._ag is not None, bias is not None and bias._ag is not None)

    def backward(dy: Any) -> tuple:
        gx, gw = _matmul_grads(x, w, local, False, False, dy, need[0], need[1])
        gb = None
        if need[2]:
            rows = _SUM(as_rows(dy.local), axis=0)
            gb = grad_tensor(bias, rows, dy.layout.partial, axes_of(local, local.tensor_map[:-1]))
        return gx, gw, gb

    return record(out, named("linear", label, plan.matmul), (x, w, bias), backward,
                  with_partial(local, ()))


def record_mlp(out: Any, x: Any, fc1: tuple, fc2: tuple, plans: tuple, a: np.ndarray, h: np.ndarray,
               kind: str, name: Callable[[], str]) -> Any:
    """act(x @ w1 + b1) @ w2 + b2 as one node (ParallelMLP with no step before fc2's reduction).

    `fc1`, `fc2`: (weight, bias or None); `plans`: the two LinearPlans; `a`,
    `h`: this rank's pre-activation and hidden blocks. The gradients are
    record_linear's and record_activation's composed, with no tensors between:
    the hidden gradient is never pending (fc2's weight is whole on its
    columns), so the pending sums `dy` carries pass through, and each input's
    gradient is pending over them and the axes its own product summed over.
    The node's inputs are in the order the layers' backward reaches them (fc2's
    weight and bias, then x and fc1's), so leaves resolve in the same order.
    """
    (w1, b1), (w2, b2) = fc1, fc2
    l1, l2 = plans[0].matmul.local, plans[1].matmul.local
    kernel = activations.backward(kind)
    rows1, rows2 = axes_of(l1, l1.tensor_map[:-1]), axes_of(l2, l2.tensor_map[:-1])
    x_sums = axes_of(l1, l1.tensor_map[-1:])
    need = [t is not None and t._ag is not None for t in (w2, b2, x, w1, b1)]

    def backward(dy: Any) -> tuple:
        passed, d = dy.layout.partial, dy.local
        d2, h2 = as_rows(d), as_rows(h)
        gw2 = grad_tensor(w2, _product(h2.T, d2), passed, rows2) if need[0] else None
        gb2 = grad_tensor(b2, _SUM(d2, axis=0), passed, rows2) if need[1] else None
        dh = _product(d, _swap(w2.local))
        da = _local(kernel, dh, a, dh)
        da2 = as_rows(da)
        gx = grad_tensor(x, _product(da, _swap(w1.local)), passed, x_sums) if need[2] else None
        gw1 = grad_tensor(w1, _product(as_rows(x.local).T, da2), passed,
                          rows1) if need[3] else None
        gb1 = grad_tensor(b1, _SUM(da2, axis=0), passed, rows1) if need[4] else None
        return gw2, gb2, gx, gw1, gb1

    return record(out, name, (w2, b2, x, w1, b1), backward, with_partial(l2, ()),
                  reads=(x, w1, b1, w2, b2, plans[0].out, out))


def record_embedding(out: Any, ids: Any, table: Any, plan: Any, start: int, label: Optional[str] = None,
                     padding_idx: Optional[int] = None) -> Any:
    """table[ids]: the gradient rows are added into the rows this rank owns (no communication); the
    `padding_idx` row (a global row index) gets none."""

    def backward(dy: Any) -> tuple:
        rows = table._local.shape[0]
        # the table's gradient zeroed, then the ids and the rows' gradients read and added into their rows
        if any_open():  # else nothing is counted: no blocks to gather
            sweep("embedding", (ids.local, dy.local, dy.local), (table.local, dy.local))
        if dy.mesh.engine.dry:  # shapes only: the table's gradient is zeros, not scattered into
            g = dy.mesh.engine.local(np.add.at, buffers.broadcast_zero(table.local.shape, dy.local.dtype))
            return None, grad_tensor(table, g, dy.layout.partial, axes_of(plan.local, plan.local.tensor_map[:-1]))
        id_block, d = (ids._local, dy._local) if not buffers.CAPTURE.on else (ids.local, dy.local)  # (captured: views)
        flat_ids = id_block.reshape(-1) - start
        owned = (flat_ids >= 0) & (flat_ids < rows)
        if padding_idx is not None:
            owned &= flat_ids != padding_idx - start
        # Ids this rank does not own add into a spare last row, dropped after: the same sums in the same
        # order as adding only the owned rows, and no array whose size depends on the ids (a captured
        # step replays; spmdsim.runtime.replay).
        spare = buffers.fresh(np.zeros((rows + 1,) + table._local.shape[1:], d.dtype), 0)
        np.add.at(spare, np.where(owned, flat_ids, rows), as_rows(d))
        g = spare[:rows]
        return None, grad_tensor(table, g, dy.layout.partial, axes_of(plan.local, plan.local.tensor_map[:-1]))

    return record(out, named("embedding", label, None), (ids, table), backward, with_partial(plan.local, ()))
