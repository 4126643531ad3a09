"""Backward rules: each operator's local gradient math and the layout it lands in.

An operator calls ``record_<op>(out, ...)`` when one of its inputs has
``_ag`` set. The rule's backward gets the output's gradient in the layout the
node asked for (`Node.want`: for matmul the local product's, so the forward's
Allreduce answers with nothing, its Reduce_scatter with an Allgather) and
returns each input's gradient as a DTensor in the input's tensor map, a
pending sum over the axes its local math summed over (a split contraction:
the conjugate of a replicated input is a pending sum, which the engine
resolves by Allreduce or Reduce_scatter where it must). No rule communicates.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import numpy as np

from .. import activations, reference_grad
from ..layout import TensorLayout
from ..engines import local as _local  # the kernel; the dry engine's zeros, not computed
from ..engines import matmul as _product  # np.matmul; the dry engine's zeros, unmultiplied
from .graph import record, with_partial

__all__ = [
    "record_matmul", "record_linear", "record_mlp", "record_embedding", "record_activation", "record_softmax",
    "record_bias_add", "record_scale", "record_transpose", "record_reshape",
    "grad_tensor", "axes_of",
]


def axes_of(layout: TensorLayout, entries: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    """The axes (of size above one) in map entries `entries` of `layout`."""
    return tuple(a for e in entries for a in e if layout.layout.axis_size(a) > 1)


def grad_tensor(like: Any, local: np.ndarray, *pending: Iterable[str]) -> Any:
    """A gradient of `like`: its tensor map, pending over the union of `pending`, block `local`."""
    layout = like.layout
    if any(pending):
        wanted = set(a for group in pending for a in group)
        partial = tuple(a for a in layout.layout.alias_name if a in wanted)
    else:  # nothing pending (most gradients): no sets to build
        partial = ()
    local = np.asarray(local, dtype=like.dtype)
    if not local.flags.c_contiguous:  # collectives read C order (ascontiguousarray makes 0-d 1-d)
        local = local.copy()
    grad_layout = with_partial(layout, partial)
    if local.shape == like.local.shape:  # `like`'s block shape under the same tensor map: checked
        return type(like)._trusted(like.mesh, local, grad_layout, like.global_shape)
    return type(like)(like.mesh, local, grad_layout, like.global_shape)  # raises, naming the shapes


def _named(op: str, label: Optional[str], plan: Any) -> Callable[[], str]:
    """A node's name for explanations, made when asked: "matmul MatMul1 (contraction dim K ...)"."""
    def name() -> str:
        text = op if not label or label == op else f"{op} {label}"
        return text if plan is None else f"{text}: {plan.why()}"
    return name


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
            db = db.sum(axis=tuple(range(db.ndim - 2)))
            summed = local.tensor_map[:-1]
        gw = grad_tensor(w, _swap(db) if tb else db, passed, axes_of(local, summed), x.layout.partial)
    return gx, gw


def record_matmul(out: Any, x: Any, w: Any, plan: Any, ta: bool, tb: bool, label: Optional[str] = None) -> Any:
    """Y = op(x) @ op(w): the gradient arrives in the local product's map (the resolution's conjugate)."""
    need = (x._ag is not None, w._ag is not None)

    def backward(dy: Any) -> tuple:
        return _matmul_grads(x, w, plan.local, ta, tb, dy, *need)

    return record(out, _named("matmul", label, plan), (x, w), backward, with_partial(plan.local, ()))


def record_linear(out: Any, x: Any, w: Any, bias: Any, plan: Any, label: Optional[str] = None) -> Any:
    """x @ w + bias (bias added once); the gather's conjugate is a local slice, the Allreduce's nothing."""
    local = plan.matmul.local
    need = (x._ag is not None, w._ag is not None, bias is not None and bias._ag is not None)

    def backward(dy: Any) -> tuple:
        gx, gw = _matmul_grads(x, w, local, False, False, dy, need[0], need[1])
        gb = None
        if need[2]:
            rows = dy.local.reshape(-1, dy.local.shape[-1]).sum(axis=0)
            gb = grad_tensor(bias, rows, dy.layout.partial, axes_of(local, local.tensor_map[:-1]))
        return gx, gw, gb

    return record(out, _named("linear", label, plan.matmul), (x, w, bias), backward,
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
        d2, h2 = d.reshape(-1, d.shape[-1]), h.reshape(-1, h.shape[-1])
        gw2 = grad_tensor(w2, _product(h2.T, d2), passed, rows2) if need[0] else None
        gb2 = grad_tensor(b2, d2.sum(axis=0), passed, rows2) if need[1] else None
        dh = _product(d, _swap(w2.local))
        da = _local(kernel, dh, a, dh)
        da2 = da.reshape(-1, da.shape[-1])
        gx = grad_tensor(x, _product(da, _swap(w1.local)), passed, x_sums) if need[2] else None
        gw1 = grad_tensor(w1, _product(x.local.reshape(-1, x.local.shape[-1]).T, da2), passed,
                          rows1) if need[3] else None
        gb1 = grad_tensor(b1, da2.sum(axis=0), passed, rows1) if need[4] else None
        return gw2, gb2, gx, gw1, gb1

    return record(out, name, (w2, b2, x, w1, b1), backward, with_partial(l2, ()),
                  reads=(x, w1, b1, w2, b2, plans[0].out, out))


def record_embedding(out: Any, ids: Any, table: Any, plan: Any, start: int, label: Optional[str] = None,
                     padding_idx: Optional[int] = None) -> Any:
    """table[ids]: the gradient rows are added into the rows this rank owns (no communication); the
    `padding_idx` row (a global row index) gets none."""

    def backward(dy: Any) -> tuple:
        rows = table.local.shape[0]
        flat_ids = ids.local.reshape(-1) - start
        owned = (flat_ids >= 0) & (flat_ids < rows)
        if padding_idx is not None:
            owned &= flat_ids != padding_idx - start
        # Ids this rank does not own add into a spare last row, dropped after: the same sums in the same
        # order as adding only the owned rows, and no array whose size depends on the ids (a captured
        # step replays; spmdsim.runtime.replay).
        spare = np.zeros((rows + 1,) + table.local.shape[1:], dy.local.dtype)
        np.add.at(spare, np.where(owned, flat_ids, rows), dy.local.reshape(-1, spare.shape[1]))
        g = spare[:rows]
        return None, grad_tensor(table, g, dy.layout.partial, axes_of(plan.local, plan.local.tensor_map[:-1]))

    return record(out, _named("embedding", label, None), (ids, table), backward, with_partial(plan.local, ()))


def record_activation(out: Any, x: Any, name: str, kept: Any = None) -> Any:
    """relu / gelu: dX = dY * act'(x), shard by shard. `kept`: GELU's inner tanh from the forward
    (activations.gelu_tanh), read by the backward instead of computed again."""
    kernel = activations.backward(name)
    extra = () if kept is None else (kept,)

    def backward(dy: Any) -> tuple:
        return (grad_tensor(x, _local(kernel, dy.local, x.local, dy.local, *extra), dy.layout.partial),)

    return record(out, name, (x,), backward, x.layout)


def record_softmax(out: Any, x: Any, dim: int) -> Any:
    """softmax along a whole dim: dX = s * (dY - sum(dY * s)), shard by shard."""

    def backward(dy: Any) -> tuple:
        grad = _local(reference_grad.softmax_grad, dy.local, out.local, dy.local, dim)
        return (grad_tensor(x, grad, dy.layout.partial),)

    return record(out, "softmax", (x,), backward, out.layout, reads=(x, out))


def record_bias_add(out: Any, x: Any, bias: Any) -> Any:
    """x + bias: dX = dY, dbias = dY summed over the leading dims (pending over their axes)."""
    need_x, need_b = x._ag is not None, bias._ag is not None

    def backward(dy: Any) -> tuple:
        gx = grad_tensor(x, dy.local, dy.layout.partial) if need_x else None
        gb = None
        if need_b:
            rows = dy.local.reshape(-1, dy.local.shape[-1]).sum(axis=0)
            gb = grad_tensor(bias, rows, dy.layout.partial, axes_of(x.layout, x.layout.tensor_map[:-1]))
        return gx, gb

    return record(out, "bias_add", (x, bias), backward, x.layout)


def record_scale(out: Any, x: Any, factor: Any) -> Any:
    """x * factor: dX = dY * factor."""
    def backward(dy: Any) -> tuple:
        d = dy.local
        return (type(dy)(dy.mesh, _local(np.multiply, d, d, np.asarray(factor, d.dtype)), dy.layout,
                         dy.global_shape),)

    return record(out, "scale", (x,), backward)


def record_transpose(out: Any, x: Any, dims: tuple[int, ...]) -> Any:
    """Permuted dims: the gradient is permuted back."""
    inverse = tuple(int(i) for i in np.argsort(dims))

    def backward(dy: Any) -> tuple:
        return (grad_tensor(x, np.transpose(dy.local, inverse), dy.layout.partial),)

    return record(out, "transpose", (x,), backward)


def record_reshape(out: Any, x: Any) -> Any:
    """A local reshape: the gradient is reshaped back."""

    def backward(dy: Any) -> tuple:
        return (grad_tensor(x, dy.local.reshape(x.local.shape), dy.layout.partial),)

    return record(out, "reshape", (x,), backward)

