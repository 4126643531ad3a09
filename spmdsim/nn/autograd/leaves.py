"""Gradients into leaves: a leaf's pending sum resolved, its gradient written into `.grad` or accumulated into
its gradient buffer (`Leaf.main`, Megatron's main_grad)."""
from __future__ import annotations

from itertools import chain, compress, repeat
from operator import attrgetter, iadd, is_, not_
from typing import Any, Optional

import numpy as np

from ...base import buffers
from ...base.flops import any_open, sweep
from .graph import Leaf
from .moves import add_grads
from .plans import (_GRAD, _LAYOUT, _leaf_plan, _LOCAL, _ndarray, _NONE, _refs, _SOLE, _SOLE_MAPPED, _whole_grads,
                    _wholes)


def _resolve_leaves(leaves: list, grads: dict, owners: dict, kept: Any, cap: float, explain: Optional[list],
                    readers: dict) -> None:
    """The walk's end: each leaf's gradient (in `grads`; its tensor's layout in `owners`, else the gradient's own
    layout object, as `_walk` keeps them) added into ``.grad``, in `leaves`' order (first contribution: the same
    on every rank); left pending for the leaves in `kept` (their ids), else its replicas' parts summed (in
    buckets when `cap` is not 0), as its `_LeafPlan` says."""
    gs = list(map(grads.pop, leaves))
    own = tuple(map(owners.get, leaves, map(_LAYOUT, gs)))
    plan = _leaf_plan(leaves, gs, own, kept, cap)
    counting = any_open()  # `_count_accumulation`'s test, once (a counter opens and closes outside the walk)
    if plan.kept:  # their gradients as they are
        kept = plan.kept
        _into_grads(list(map(leaves.__getitem__, kept)), list(map(gs.__getitem__, kept)),
                    list(map(own.__getitem__, kept)), counting)
    if plan.positions:  # the others' whole
        wholes = _whole_grads(plan, leaves, gs) if explain is None else \
            [g for _, g, _ in _wholes(plan, leaves, gs, own, explain, readers)]
        _into_grads(list(map(leaves.__getitem__, plan.positions)), wholes, plan.wholes, counting)


def _into_grads(kl: list, kg: list, layouts: list, counting: bool) -> None:
    """Add the gradients `kg` into the ``.grad`` of the leaves `kl` (`layouts`: the layout each sum takes,
    `add_grads`'): a microbatch's backward under ``keep_pending`` adds ~17 a pipeline stage's microbatch.
    Each into its ``.grad``'s block in place where `_added_into`'s conditions hold: here tested for
    all of them at once in C (a map per condition, no Python per leaf), the leaves whose blocks own their
    memory; the others (a placed or viewed block, a ``.grad`` held elsewhere) as `_added_into` decides one by
    one, else `add_grads`. The first backward after ``zero_grad`` sets each ``.grad`` to its gradient. A leaf with
    a main gradient (``Leaf.main``: a view of an optimizer's gradient buffer) takes its gradient there
    (`_into_main`)."""
    if counting:
        for g in kg:
            _count_accumulation(g)
    if not all(map(is_, map(_MAIN, kl), _NONE)):  # (one map in C; none of them most backwards)
        rest = [i for i, leaf, g in zip(range(len(kl)), kl, kg) if leaf.main is None or not _into_main(leaf, g)]
        if not rest:
            return
        kl, kg, layouts = [kl[i] for i in rest], [kg[i] for i in rest], [layouts[i] for i in rest]
    haves = list(map(_GRAD, kl))
    n = len(kl)
    if all(map(is_, haves, _NONE)):  # the first backward since zero_grad: each .grad is its gradient
        # (`is`, mapped: list.count and `in` would call a DTensor's __eq__, an operator)
        list(map(setattr, kl, _GRAD_NAME, kg))
        return
    rest = range(n)
    if not any(map(is_, haves, _NONE)) and not buffers.CAPTURE.on and not kg[0]._mesh.engine.dry:
        xs, ys = list(map(_LOCAL, haves)), list(map(_LOCAL, kg))
        if all(map(is_, map(type, chain(xs, ys)), _NDARRAY)):
            sole = list(map(_SOLE_MAPPED.__eq__, zip(
                map(is_, map(_LAYOUT, haves), map(_LAYOUT, kg)), map(_refs, haves), map(_refs, xs),
                map(is_, map(_BASE, xs), _NONE), map(_CARRAY, xs), map(is_, map(_DTYPE_OF, xs), map(_DTYPE_OF, ys)))))
            done = sole.count(True)
            if done == n:
                list(map(iadd, xs, ys))
                return
            if done:
                list(map(iadd, compress(xs, sole), compress(ys, sole)))
                rest = list(compress(rest, map(not_, sole)))
        haves = xs = ys = None  # (their references would count as other holders in `_added_into`)
    for i in rest:
        leaf, g = kl[i], kg[i]
        if leaf.grad is None:
            leaf.grad = g
        elif not _added_into(leaf, g):
            leaf.grad = add_grads(leaf.grad, g, layouts[i], None)


def _into_main(leaf: Leaf, g: Any) -> bool:
    """Whether `g`, a gradient of `leaf`, went into its main gradient (``leaf.main``, a view of an optimizer's flat
    gradient buffer: Megatron's main_grad), ``leaf.grad`` then a DTensor of that view: copied there when
    ``.grad`` is None (the first backward since the step, whose buffer holds other values: the gathered
    parameters), else added in place (``main += g``: the ufunc and operands of `add_grads`' ``a + b``, so the same
    bits) when ``.grad`` is that view in `g`'s layout, else their sum (`add_grads`, its layout) copied there. So
    the gradient is held once, in the buffer, from the first microbatch on (no block of its own beside the
    buffer the optimizer packs it into). False (nothing done) for a `g` of another shape or dtype than the view.
    A dry run writes nothing (its buffer is the dry engine's zeros); a captured step records the copy or the sum
    as a kernel (spmdsim.runtime.replay), which a replay reruns into the same view."""
    view = leaf.main
    block = g._local if not buffers.CAPTURE.on else g.local
    if block.shape != view.shape or block.dtype != view.dtype:
        return False
    have = leaf.grad
    dry = g._mesh.engine.dry
    if have is None:
        if not dry:
            _main_kernel(_copy_main)(view, block)
        leaf.grad = type(g)._trusted(g._mesh, view, g._layout, g._shape)
        return True
    if have._local is view and (have._layout is g._layout or have._layout == g._layout):
        if not dry:
            _main_kernel(_add_main)(view, block)
        return True
    total = add_grads(have, g, g._layout, None)  # laid out otherwise, or a .grad set elsewhere: their sum
    if not dry:
        _main_kernel(_copy_main)(view, total._local if not buffers.CAPTURE.on else total.local)
    leaf.grad = type(total)._trusted(total._mesh, view, total._layout, total._shape)
    return True


def _copy_main(view: np.ndarray, block: np.ndarray) -> None:
    np.copyto(view, block)


def _add_main(view: np.ndarray, block: np.ndarray) -> None:
    np.add(view, block, out=view)


def _main_kernel(func: Any) -> Any:
    """`func` itself, or while this thread captures a step its recorded kernel (spmdsim.runtime.replay)."""
    if not buffers.CAPTURE.on:
        return func
    from ...runtime.replay import kernel

    return kernel(func)


def _added_into(leaf: Leaf, g: Any) -> bool:
    """Whether `g` was added into the block of ``leaf.grad`` in place (``leaf.grad += g``: the same ufunc on
    the same operands in the same order as `add_grads`' ``a + b``, so the same bits, without a new block and a
    new DTensor per leaf and microbatch). Only where nothing else can see that block: ``leaf.grad`` held by the
    leaf alone (no caller kept the DTensor of an earlier backward, whose values would change under it), its
    block held by that DTensor alone and owning its memory (or the sole view of a placed buffer,
    spmdsim.base.buffers), so no other tensor's block (a gradient handed to two inputs, a bucket's flat Allreduce, a
    view) shares it; writeable and C-contiguous, of `g`'s layout, shape and dtype. Never while a step is
    captured (the capture records `add_grads`' new block) nor in a dry run (whose engine adds nothing)."""
    have = leaf.grad
    if have._layout is not g._layout or buffers.CAPTURE.on or _refs(have) != _SOLE[0]:
        return False
    x, y = have._local, g._local
    if type(x) is not _ndarray or type(y) is not _ndarray or _refs(x) != _SOLE[1] or not x.flags.carray \
            or x.shape != y.shape or x.dtype != y.dtype or have._mesh.engine.dry:
        return False
    base = x.base
    if base is not None and (type(base) is not _ndarray or base.base is not None or _refs(base) != _SOLE[1]):
        return False
    x += y
    return True


_MAIN = attrgetter("main")


_GRAD_NAME, _NDARRAY = repeat("grad"), repeat(np.ndarray)


_BASE, _CARRAY, _DTYPE_OF = attrgetter("base"), attrgetter("flags.carray"), attrgetter("dtype")


_IS_LEAF, _GLOBAL_SHAPE = Leaf.__instancecheck__, repeat("global_shape")


def _described(value: Any) -> str:
    """`value` as every rank describes it alike (a DTensor's repr names this rank and its block)."""
    if hasattr(value, "_ag") and hasattr(value, "global_shape"):
        kind = "a leaf" if isinstance(value._ag, Leaf) else "without requires_grad_()" if value._ag is None \
            else "computed by an op"
        return f"a DTensor of global shape {tuple(value.global_shape)!r} ({kind})"
    return f"an object of type {type(value).__name__}"


def _count_accumulation(g: Any) -> None:
    """Count (spmdsim.base.flops.sweep) a leaf's gradient added into its ``.grad``: on every backward, the first
    too (as a framework accumulates into a zeroed main gradient, Megatron's main_grad += grad), so each
    microbatch's backward counts alike."""
    if any_open():  # else nothing would be counted: no blocks to gather
        sweep("add", (g.local, g.local), (g.local,), "grads")
