"""A gradient buffer for data-parallel gradient sums without a sharded optimizer (ZeRO-0): Megatron DDP's.

`GradBuffer(params, cap)` cuts the parameters whose gradients are pending sums into buckets, each one flat
block made once, each parameter's gradient a view of its place there (its leaf's ``main``, as ZeRO-1's buffer:
`spmdsim.nn.distrib_optim`). It guesses each gradient pending over the mesh axes of size above one its parameter
is replicated on (the data-parallel ones, and the tensor-parallel ones of a parameter tensor parallelism does
not split) and groups as `reduce_grads` does: by mesh, those axes and the gradient's dtype, in parameter order,
each bucket at most `cap` bytes of a rank's shards (a larger parameter alone).

Passed as ``backward(loss, keep_pending=params, reduce_with=buffer)``, the walk puts each parameter's gradient
into its view as soon as it has given it (a first contribution copied, later ones, a pipeline's microbatches,
added in place), so the gradients are held once, in the buffer, never beside a flat copy of them; then
`reduce()` sums them in the buckets `reduce_grads` would cut from the axes they are pending on (the same calls,
labels and values), each bucket that is a run of one block's views there in place, and sets each ``.grad`` to
its view, whole. Where a guess was wrong (a node made a gradient whole over an axis its parameter is replicated
on: an MoE router's over tp), that step sums the buckets it touches in blocks of their own, copied back into
the views, and the buckets are cut again from the axes found before the next step's first backward. The blocks
stay from step to step (the first contribution of a step is copied over the last step's sums), as Megatron's
buffer does; a dry run's are zeros no page of which is written.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...base.buffers import CAPTURE, lazy_zeros, owner
from .graph import with_partial
from .rules.grads import GRADIENT_DTYPE
from . import engine as _engine
from .leaves import _copy_main, _main_kernel
from .plans import _leaf_plan

__all__ = ["GradBuffer"]


class _Bucket:
    __slots__ = ("mesh", "axes", "flat", "members")


class GradBuffer:
    """Megatron DDP's gradient buffer over `params` (DTensors that require grad) in buckets of at most `cap`
    bytes of a rank's shards (module docstring). ``watch``: called with the walk's gradients at each of its
    stops and before each bucket's Allreduce (a memory look), or None; ``watch_blocks``: `reduce_grads`' watch
    where it sums them instead (every gradient block held then), or None."""

    #: What a pipeline asks of a `reduce_with` (spmdsim.models.gpt.pipeline): every backward hands it its gradients,
    #: as ZeRO-1's optimizer.
    shard_grads = False

    def __init__(self, params: Any, cap: int) -> None:
        self.params = list(params)
        self.cap = cap
        self.watch: Any = None
        self.watch_blocks: Any = None
        axes = []
        for p in self.params:  # the axes it is replicated on: its gradient's pending ones, most often
            layout = p._layout.layout
            split = set(p._layout.split_axes)
            axes.append(tuple(a for a in layout.alias_name if layout.axis_size(a) > 1 and a not in split))
        self._build(axes)

    def _build(self, axes: list) -> None:
        """The buckets of the parameters whose gradients are pending over `axes` (each parameter's; () for
        none): their flat blocks made, each parameter's ``main`` its view (that of a parameter in none, None)."""
        opened: dict = {}
        made: list = []
        self._rebuild = None
        self._view: list = [None] * len(self.params)  # each parameter's view, or None
        self._at: dict = {}  # parameter index -> (its bucket's flat block, its start, its stop)
        self.buckets: list = []  # (the old blocks let go before the new are made)
        for i, (p, over) in enumerate(zip(self.params, axes)):
            p._ag.main = None
            if not over:  # split over every axis of size above one: its gradient is whole, nothing to sum
                continue
            dtype = GRADIENT_DTYPE[p._local.dtype]
            size = math.prod(p._layout.max_local_shape(p._shape)) * dtype.itemsize
            key = (id(p._mesh), over, dtype.str)
            current = opened.get(key)
            if current is None or current[0] + size > self.cap:
                current = opened[key] = [0, p._mesh, over, dtype, []]
                made.append(current)
            current[0] += size
            current[4].append(i)
        for _, mesh, over, dtype, members in made:
            b = _Bucket()
            b.mesh, b.axes, b.members = mesh, over, members
            shapes = [self.params[i]._local.shape for i in members]
            n = sum(math.prod(s) for s in shapes)
            # (a dry run's: zeros no page of which is written; a real run's numpy's, held from step to step)
            b.flat = lazy_zeros((n,), dtype) if mesh.engine.dry else np.zeros(n, dtype)
            at = 0
            for i, shape in zip(members, shapes):
                size = math.prod(shape)
                view = b.flat[at:at + size].reshape(shape)
                self.params[i]._ag.main = self._view[i] = view
                self._at[i] = (b.flat, at, at + size)
                at += size
            self.buckets.append(b)
        self._groups = [(i, (self.params[i]._ag,)) for i in sorted(self._at)]

    def _axes(self) -> list:
        """Each parameter's bucket's axes (() for none)."""
        axes: list = [()] * len(self.params)
        for b in self.buckets:
            for i in b.members:
                axes[i] = b.axes
        return axes

    def gradient_buffers(self) -> tuple:
        """The buckets' flat blocks (a memory look counts them as gradients, each once)."""
        return tuple(b.flat for b in self.buckets)

    # -- `backward(reduce_with=...)`'s interface (spmdsim.nn.autograd.engine._walk_reducing), as ZeRO-1's --

    def _walk_groups(self) -> list:
        """Each parameter of a bucket alone: the walk stops after the last node that reads it and puts its
        gradient into its view (the others' wait for the walk's end, as without a buffer). The buckets are cut
        again first where `reduce` found other axes than guessed, once every gradient is let go (a step's first
        backward)."""
        if self._rebuild is not None and all(p._ag.grad is None for p in self.params):
            self._build(self._rebuild)
        return self._groups

    def _reached(self, leaves: Any) -> None:
        return None

    def _bucket_ready(self, k: int, grads: dict) -> None:
        return None

    def _stopped(self, grads: dict) -> None:
        if self.watch is not None:
            self.watch(grads)

    def reduce(self) -> None:
        """The gradients summed over the axes each is pending on (collective: every rank of a group calls it after
        the same backwards), in the buckets `reduce_grads` cuts (its plan, `plans._leaf_plan`: the same calls,
        labels and values), each ``.grad`` then its view, whole. A bucket whose gradients are a run of views of
        one block (every one, where the guessed axes were the gradients' own) is summed there in place; another
        (a gradient pending over other axes than its parameter is replicated on, as an MoE router's, whole over
        tp: some node made it whole) by `reduce_grads` in a block of its own, copied back into the views, and the
        buckets are cut again from the axes found, for the next steps (at the first backward after the
        gradients are let go)."""
        from ...runtime import executor
        from ...runtime.dtensor import DTensor

        params = self.params
        grads = [p._ag.grad for p in params]
        guessed = self._axes()
        found = [guess if g is None else _sized(g._mesh, g._layout.partial) for g, guess in zip(grads, guessed)]
        if found != guessed:
            self._rebuild = found
        pending = [i for i, g in enumerate(grads) if g is not None and g._layout.partial]  # (as reduce_grads')
        plan = _leaf_plan([params[i]._ag for i in pending], [grads[i] for i in pending],
                          [params[i]._layout for i in pending], None, self.cap)
        for b, k, whole in plan.actions:
            members = [pending[j] for j in plan.buckets[b].positions] if b >= 0 else [pending[plan.positions[k]]]
            first = grads[members[0]]
            mesh, partial = first._mesh, first._layout.partial
            # (a leaf alone is summed in place only where that is its move: its own tensor map, whole)
            moved = b < 0 and (first._layout.tensor_map != whole.tensor_map or first._layout.layout != whole.layout)
            run = None if moved else self._run(members, grads)
            if run is not None:  # a run of one block's views: summed there
                if self.watch is not None:
                    self.watch({})
                label = f"gradient bucket of {len(members)} leaves" if len(members) > 1 else \
                    "gradient bucket of 1 leaf"
                summed = executor.resolve(mesh, run, executor.pending(mesh.layout, 1, partial), label, owned=True)
                if not mesh.engine.dry and not CAPTURE.on and owner(summed) is not owner(run):  # (elsewhere)
                    np.copyto(run, summed)
                for i in members:
                    g = grads[i]
                    params[i]._ag.grad = DTensor._trusted(mesh, self._view[i], with_partial(g._layout, ()), g._shape)
                continue
            # in a block of their own (one call), then into the views
            _engine.reduce_grads([params[i] for i in members], bucket=True, watch=self.watch_blocks)
            for i in members:
                leaf, view = params[i]._ag, self._view[i]
                g = leaf.grad
                if view is None or view.shape != g._local.shape or view.dtype != g._local.dtype:
                    continue
                if not mesh.engine.dry:
                    _main_kernel(_copy_main)(view, g._local if not CAPTURE.on else g.local)
                leaf.grad = DTensor._trusted(mesh, view, g._layout, g._shape)

    def _run(self, members: list, grads: list) -> Any:
        """The flat stretch of one block that the views of `members` (in order, each its gradient's block) make
        up, or None."""
        where = [self._at.get(i) for i in members]
        if any(w is None for w in where) or any(grads[i]._local is not self._view[i] for i in members):
            return None
        flat = where[0][0]
        for (f, _, stop), (g, start, _) in zip(where, where[1:]):
            if f is not flat or g is not flat or start != stop:
                return None
        return flat[where[0][1]:where[-1][2]]


def _sized(mesh: Any, axes: Any) -> tuple:
    """`axes` of size above one on `mesh`, in its order (None for None)."""
    if axes is None:
        return None
    layout = mesh.layout
    return tuple(a for a in layout.alias_name if a in axes and layout.axis_size(a) > 1)
