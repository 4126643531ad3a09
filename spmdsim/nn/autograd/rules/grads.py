"""What every gradient rule returns: a gradient in its input's tensor map, pending over the axes it summed."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

import numpy as np

from ....layouts.layout import TensorLayout
from ....base.buffers import broadcast_zero, converted, fresh
from ....runtime.engines import c_order, local as _local
from ....base.precision import is_low
from ..graph import with_partial
from ....base.tables import put

__all__ = ["grad_tensor", "gradient_block", "zeros_block", "GRADIENT_DTYPE", "gradient_layout", "axes_of", "named",
           "needs", "NEED1", "NEED2"]

_F32 = np.dtype(np.float32)
_ndarray = np.ndarray
_new = object.__new__


class _GradientDtypes(dict):
    """A tensor's dtype -> its gradient's: its own, float32 for bfloat16 (spmdsim.base.precision: a bfloat16 tensor's
    gradient is summed in float32 over its consumers and its ranks, rounded once where its tensor's rule reads
    it; a parameter's stays float32), whatever the memory order of the block a rule made. Filled on first ask."""

    def __missing__(self, dtype: np.dtype) -> np.dtype:
        want = self[dtype] = _F32 if is_low(dtype) else dtype
        return want


#: ``GRADIENT_DTYPE[x.dtype]``: the dtype of x's gradient (one dict read; `grad_tensor` and `gradient_block`).
GRADIENT_DTYPE = _GradientDtypes()


def axes_of(layout: TensorLayout, entries: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    """The axes (of size above one) in map entries `entries` of `layout`."""
    return tuple(a for e in entries for a in e if layout.layout.axis_size(a) > 1)


def grad_tensor(like: Any, local: np.ndarray, *pending: Iterable[str]) -> Any:
    """A gradient of `like`: its tensor map, pending over the union of `pending`, block `local`."""
    layout = like._layout
    # gradient_layout's and gradient_block's usual cases without their calls (a rule's gradient each)
    if any(pending):
        try:
            seen = _PENDING.get((id(layout), pending))
        except TypeError:  # a group given as a list
            seen = None
        grad_layout = seen[1] if seen is not None else gradient_layout(layout, *pending)  # (as gradient_layout's)
    else:
        grad_layout = with_partial(layout, ()) if layout.partial else layout
    block = like._local
    # A block of the gradient's dtype (GRADIENT_DTYPE: like's, float32 for bfloat16) and like's shape; another
    # dtype (a bfloat16 block of a bfloat16 tensor, C-ordered or not, too) is gradient_block's to convert.
    if type(local) is _ndarray and local.dtype is GRADIENT_DTYPE[block.dtype] and local.shape == block.shape:
        if not local.flags.c_contiguous:  # a transposed block (attention's dq, dk, dv: 12 a GPT step)
            local = c_order(local)  # gradient_block's copy, without its tests again
        out = _new(type(like))
        out._mesh, out._local, out._layout, out._shape, out._ag = like._mesh, local, grad_layout, like._shape, None
        return out
    return gradient_block(like, local, grad_layout)


def gradient_layout(layout: TensorLayout, *pending: Iterable[str]) -> TensorLayout:
    """The layout of a gradient of a tensor laid out `layout`: its tensor map, pending over the union of
    `pending` (`grad_tensor`'s; a rule that keeps it per call signature builds its gradients from it)."""
    if any(pending):  # most gradients of a tensor-parallel step: by the layout object and the axes, in C
        key = (id(layout), pending)
        try:
            seen = _PENDING.get(key)
        except TypeError:  # a group given as a list: worked out each time
            seen = key = None
        if seen is not None:  # the entry holds `layout`: no other object has its id while it is there
            return seen[1]
        wanted = set(a for group in pending for a in group)
        grad_layout = with_partial(layout, tuple(a for a in layout.layout.alias_name if a in wanted))
        if key is not None and all(type(group) is tuple for group in pending):  # kept by value
            # The entry holds the layout, so its id is not reused while the entry lives.
            put(_PENDING, key, (layout, grad_layout), 4096)
        return grad_layout
    # nothing pending (most gradients): no sets to build, and `layout` itself when it is whole
    return with_partial(layout, ()) if layout.partial else layout


def gradient_block(like: Any, local: Any, grad_layout: TensorLayout) -> Any:
    """A gradient of `like` in `grad_layout` (its tensor map; pending where it says), block `local`."""
    block = like._local  # read for its dtype and shape only (a captured step's traced view has the same)
    # A bfloat16 tensor's gradient is float32 (GRADIENT_DTYPE), C-ordered or not; any other tensor's its dtype.
    want = GRADIENT_DTYPE[block.dtype]
    if type(local) is _ndarray and local.dtype is want and local.shape == block.shape \
            and local.flags.c_contiguous:  # most gradients: a C-ordered block of like's shape, of the dtype wanted
        # DTensor._trusted without its call (~200 gradients a step)
        out = _new(type(like))
        out._mesh, out._local, out._layout, out._shape, out._ag = like._mesh, local, grad_layout, like._shape, None
        return out
    if type(local) is not _ndarray:  # a block already (most gradients): no call
        local = np.asanyarray(local)  # a captured step's traced block stays traced (spmdsim.runtime.replay)
    if local.dtype != want:  # converted by the engine (a dry run's: zeros of the new dtype, no page written)
        local = like.mesh.engine.local(converted, broadcast_zero(local.shape, want), local, want)
    if not local.flags.c_contiguous:  # collectives read C order (a dry run's large block: the engine's zeros)
        local = c_order(local)
    if local.shape == block.shape:  # `like`'s block shape under the same tensor map: checked
        return type(like)._trusted(like._mesh, local, grad_layout, like._shape)
    return type(like)(like._mesh, local, grad_layout, like._shape)  # raises, naming the shapes


_PENDING: dict = {}  # (id(layout), the pending groups) -> (layout, its gradient's layout): pure of the key


def needs(xs: Any) -> tuple:
    """Whether each of the tensors `xs` takes a gradient, as one shared tuple per pattern (a node's rule
    keeps it until the backward: the graph then holds no tuple of its own for the collector to scan)."""
    if len(xs) == 2:  # most nodes: no tuple built (a comprehension is a frame of its own)
        return NEED2[xs[0]._ag is None][xs[1]._ag is None]
    need = tuple([x._ag is not None for x in xs])
    return _NEEDS.setdefault(need, need)


_NEEDS: dict = {}  # (bool, ...) -> that tuple (a handful of patterns)
#: `needs` of two tensors, ``NEED2[a._ag is None][b._ag is None]`` (a bool indexes as 0 or 1), and of one that
#: takes a gradient: the shared tuples, for the rules that build their node without calling it.
NEED2 = tuple(tuple(_NEEDS.setdefault((not a, not b), (not a, not b)) for b in (False, True)) for a in (False, True))
NEED1 = _NEEDS.setdefault((True,), (True,))


def named(op: str, label: Optional[str], plan: Any) -> Callable[[], str]:
    """A node's name for explanations, made when asked: "matmul MatMul1 (contraction dim K ...)"."""
    def name() -> str:
        text = op if not label or label == op else f"{op} {label}"
        return text if plan is None else f"{text}: {plan.why()}"
    return name


def zeros_block(shape: tuple, dtype: Any) -> np.ndarray:
    """``np.zeros(shape, dtype)`` on the running engine (a dry run's: the engine's zeros, lazily mapped, no page
    written), zeroed again by a replay of a captured step."""
    return fresh(_local(np.zeros, broadcast_zero(shape, dtype), shape, dtype), 0)
