"""Gradients moved and added: grad_layout (the layout a gradient keeps), add_grads, and the runtime's
redistribute and DTensor, bound on first use (importing autograd must not start MPI)."""
from __future__ import annotations

import contextlib
from typing import Any, Optional

import numpy as np

from ...base import buffers
from ...base import flops as _flops
from ...base.flops import hold, sweep
from ...layouts.layout import TensorLayout
from .graph import Leaf, Node, _passed, with_partial
from ...base.tables import put

__all__ = ["grad_layout", "add_grads", "PARAMETER_VIEWS"]

#: The names of the nodes that hand a parameter on as it is, whose backward is not a move's: a fully sharded
#: unit's gather of its leaves (its output a token) and each parameter gathered from it (spmdsim.nn.fsdp_flat).
#: A node that reads one reads a parameter (`_a_parameter`).
PARAMETER_VIEWS = frozenset(("fsdp gather", "fsdp gathered"))


_new_object = object.__new__


_F32 = np.dtype(np.float32)


def _rounded_wide(block: np.ndarray, low: np.dtype) -> np.ndarray:
    """`block` rounded once to `low`, widened to float32 again (the engine's kernel: a dry run's zeros)."""
    return block.astype(low).astype(np.float32)


def _of_parameters(inputs: tuple) -> bool:
    """Whether every input that takes a gradient is a parameter: a leaf, or a leaf moved (a redistribution's
    node, whose backward passes the gradient on: ZeRO-3's gathered parameter, spmdsim.nn.fsdp): the node is a
    parameter's view, and its gradient, a parameter's, stays float32 and keeps its pending sums for the move's
    Reduce_scatter. An activation a recomputed region reads as a leaf (graph.Detached) is none: its readers
    round as any."""
    found = [t._ag for t in inputs if t is not None and getattr(t, "_ag", None) is not None]
    return bool(found) and all(map(_a_parameter, found))


def _a_parameter(a: Any) -> bool:
    """Whether the graph's record `a` is a parameter (Leaf), a parameter moved or gathered (`_of_parameters`)."""
    while type(a) is Node and (a.backward is _passed or a.name in PARAMETER_VIEWS) and a.inputs \
            and a.inputs[0] is not None:
        a = a.inputs[0]._ag
    return type(a) is Leaf


def grad_layout(layout: TensorLayout, g_layout: TensorLayout) -> TensorLayout:
    """Where a gradient of a tensor of `layout` is kept: its tensor map, pending sums it may keep.

    A pending sum may stay over axes the tensor is replicated on (the
    tensor's own partial axes excluded: an addend's gradient is the whole
    value); a gradient from another device matrix is resolved.
    """
    # As graph.with_partial: no Python hashing; the entry holds both objects, so while it is there no other
    # object has their ids (a key found is these very two objects).
    seen = _GRAD_BY_OBJECT.get((id(layout), id(g_layout)))
    if seen is not None:
        return seen[2]
    keep = _GRAD_LAYOUTS.get((layout, g_layout))
    if keep is None:
        keep = _grad_layout(layout, g_layout)
    out = with_partial(layout, keep)  # derived from this very object (an equal one's would lead back to it)
    # (and whether a gradient laid out `g_layout` moves to it: `_move`'s test, pure of the two objects)
    put(_GRAD_BY_OBJECT, (id(layout), id(g_layout)),
        (layout, g_layout, out, g_layout is not out and g_layout != out), 4096)
    return out


# (id(layout), id(gradient's layout)) -> (both, grad_layout's answer, whether the gradient moves there)
_GRAD_BY_OBJECT: dict = {}


def _grad_layout(layout: TensorLayout, g_layout: TensorLayout) -> tuple:
    """The pending axes grad_layout keeps, worked out (and kept by value)."""
    key = (layout, g_layout)
    both = set(layout.replicated_axes) & set(g_layout.partial) if g_layout.layout == layout.layout else ()
    keep = tuple(a for a in layout.layout.alias_name if a in both)
    put(_GRAD_LAYOUTS, key, keep, 4096)
    return keep


_GRAD_LAYOUTS: dict = {}  # (layout, gradient's layout) -> the pending axes grad_layout keeps


def _collector(explain: Optional[list]) -> Any:
    """A trace collector for the explanation; a null context when none is asked for."""
    if explain is None:
        return contextlib.nullcontext()
    from ...runtime import collect_trace

    return collect_trace()


def add_grads(a: Any, b: Any, layout: TensorLayout, kind: Optional[str] = "activations") -> Any:
    """a + b for two gradients of one tensor (brought to one layout first: B -> P is free); `kind`: what
    spmdsim.base.flops.sweep counts the sum as (None: not counted here, its caller counts it)."""
    if a._layout is not b._layout and a._layout != b._layout:  # mostly one object: no Python __eq__ call
        both = set(a.layout.partial) | set(b.layout.partial)
        common = layout.with_partial(x for x in layout.layout.alias_name if x in both)
        a, b = _move(a, common), _move(b, common)
    x, y = (a._local, b._local) if not buffers.CAPTURE.on else (a.local, b.local)
    if kind is not None and _flops._OPEN:  # (any_open's test)
        sweep("add", (x, y), (x,), kind)
    mesh = a._mesh
    if mesh.engine.dry:  # the dry engine's zeros, not added (spmdsim.runtime.sim.dry)
        like = buffers.broadcast_zero(x.shape, np.result_type(x, y))
        total = mesh.engine.local(np.add, like, x, y)
    else:
        total = x + y
    if not isinstance(total, np.ndarray):  # 0-d blocks sum to a numpy scalar
        total = np.asarray(total)
    # Both checked DTensors of one layout and global shape: their sum's block is shaped as theirs (DTensor._trusted's
    # tensor, without its call)
    out = _new_object(type(a))
    out._mesh, out._local, out._layout, out._shape, out._ag = mesh, total, a._layout, a._shape, None
    return out


def _move(g: Any, target: TensorLayout) -> Any:
    layout = g._layout
    if layout is target or layout == target:
        return g
    return (_REDISTRIBUTE or _redistribute())(g, target)


_REDISTRIBUTE: Any = None  # runtime.executor.redistribute, bound on first use (an import statement costs ~1 us)


def _redistribute() -> Any:
    global _REDISTRIBUTE
    _REDISTRIBUTE = (_RUNTIME or _runtime())[1].redistribute
    return _REDISTRIBUTE


_RUNTIME: Any = None  # (runtime.DTensor, runtime.executor), bound on first use (importing autograd must not start MPI)


def _runtime() -> tuple:
    """(DTensor, spmdsim.runtime.executor): a relative import statement runs importlib's Python on every
    call (~2 us, several times that on loaded simulated ranks), a global read does not."""
    global _RUNTIME
    from ...runtime import executor
    from ...runtime.dtensor import DTensor

    _RUNTIME = (DTensor, executor)
    return _RUNTIME


def _take(grads: dict, owners: dict, inputs: tuple, outs: tuple) -> None:
    """Add a node's input gradients `outs` to `grads`, each in the layout `grad_layout` keeps for its tensor
    (summed with one already there), noting its tensor's layout in `owners` at its first. Under a counter that
    records blocks (the estimate's dry run) each parameter's gradient block, as it comes, moved and summed, is
    marked as one the rank holds (spmdsim.base.flops.hold: the memory line counts the gradients)."""
    held = _flops._BLOCKS
    for tensor, g in zip(inputs, outs):
        if g is None or tensor is None:
            continue
        key = tensor._ag
        if key is None:
            continue
        layout = tensor._layout
        if g._layout is not layout or layout.partial:  # else (most gradients) grad_layout's answer is `layout`
            target = grad_layout(layout, g._layout)
            if g._layout is not target:
                g = _move(g, target)
        else:
            target = layout
        have = grads.get(key)
        leaf = held and type(key) is Leaf
        if leaf:
            hold(g.local)
        if have is None:
            grads[key], owners[key] = g, layout
        else:
            grads[key] = add_grads(have, g, target)
        if leaf:
            hold(g.local, grads[key].local)
