"""DistributedAdamW's gradients (ZeRO-1): each bucket's summed over the data-parallel axes by one
Reduce_scatter, as the backward walk reaches its parameters or after it, then checked."""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from .autograd.graph import with_partial
from ..base.buffers import CAPTURE
from ..errors import OperatorError
from .optimizer import _AG, _GRAD, _GRAD_NAMES, _LAYOUT, _LOCAL, _NONES, _SHAPE, _drain, _is, _is_not, _kernel
from ..runtime.executor import pending, resolve
from ..runtime.collectives import reduce_scatter
from .zero_buffers import _Bucket, _dry_flat, _GLOBAL, _MESH, _pack


class _ZeroGrads:
    """DistributedAdamW's gradients: summed over dp into each bucket (one Reduce_scatter), as the walk reaches them or
    after it, and checked."""

    def reduce_after(self, params: Iterable[Any]) -> None:
        """Leave the buckets of these parameters (of this optimizer's) to the step: their gradients change after
        the backward (a pipeline's tied table, summed over its two end stages before the step)."""
        ids = {id(p) for p in params}
        self._after = {i for i, p in enumerate(self.params) if id(p) in ids}

    def _walk_groups(self) -> list:
        """(bucket index, its members' leaves whose last gradient no walk of this step has given yet) of each
        bucket a backward with ``reduce_with=self`` may reduce (not yet reduced, none of `reduce_after`'s), in
        bucket order (autograd.engine._walk_reducing)."""
        if self._shared is None:  # ZeRO-1: each parameter alone, its gradient into its main gradient when final
            return list(zip(range(len(self.params)), zip(map(_AG, self.params))))
        final, after, params = self._final, self._after, self.params
        return [(k, tuple(params[i]._ag for i in b.indices if i not in final)) for k, b in enumerate(self.buckets)
                if not self._reduced[k] and not after.intersection(b.indices)]

    def _reached(self, leaves: Any) -> None:
        """The parameters of these leaves (a walk's with ``reduce_with=self``) have their step's last gradient
        (ZeRO-2's; ZeRO-1's walks each give theirs)."""
        if self._shared is None:
            return
        self._final.update(i for i, p in enumerate(self.params) if p._ag in leaves)

    def _bucket_ready(self, k: int, grads: dict) -> None:
        """Bucket `k`'s members have their last gradients of the step in ``.grad`` (a walk put them there): its
        Reduce_scatter now, its members' blocks freed (`grads`: the walk's gradients then, for `watch`)."""
        if self._shared is None:  # ZeRO-1: parameter `k`'s gradient is in its main gradient; reduced in the step
            return
        if self.watch is not None:
            self.watch(grads)
        self._reduce_bucket(self.buckets[k], tuple(map(_AG, self.params)))
        self._reduced[k] = True

    def _stopped(self, grads: dict) -> None:
        """A walk with ``reduce_with=self`` stopped where parameters' gradients are final and put them into
        ``.grad`` (`grads`: the walk's gradients then). ZeRO-1: the memory look (`watch`) here, each stop's
        gradients in the gradient buffer (a parameter read twice, the tied table, gets the head's there at a stop
        of its own, then the embedding's). A gradient a node makes counts as the
        buffer's, as a framework accumulates it there as it is made (Megatron's gradient_accumulation_fusion;
        spmdsim.tools.estimate.ledger.largest_transient counts it so, not as the moment's own). ZeRO-2's look is made
        before each bucket's Reduce_scatter (`_bucket_ready`)."""
        if self._shared is None and self.watch is not None:
            self.watch(grads)

    def _reduce_bucket(self, b: _Bucket, leaves: tuple) -> None:
        """ZeRO-2's steps 1-3 for one bucket: its members' gradients checked and summed over their other axes
        (`_bucket_grads`), packed into the shared flat buffer, their blocks freed (``.grad`` None), and the
        buffer reduce-scattered into this rank's slice."""
        blocks = self._bucket_grads(b)
        if not self._dry:
            _kernel(_pack)(b.flat, blocks, b.slices)
        del blocks
        _drain(map(setattr, b.pick(leaves), _GRAD_NAMES, _NONES))  # leaf.grad = None
        reduce_scatter(self.mesh, b.flat, b.axes, 0, label="zero-2 gradient bucket", out=b.grad)

    def _bucket_grads(self, b: _Bucket) -> list:
        """Bucket `b`'s members' gradient blocks, in its order, each checked as `_grads_checked` checks it and
        those pending over other axes than their dp ones summed over those first (one Allreduce per group of
        axes, of this bucket's members: the values `_grads`' one Allreduce of every parameter's gives)."""
        extra: dict = {}
        out = []
        for i in b.indices:
            p = self.params[i]
            g = p.grad
            self._check_grad(i, p, g)
            self._note_other_axes(extra, len(out), i, p, g)
            out.append(g.local)
        self._sum_other_axes(out, extra)
        return out

    def _into_buffer(self, b: _Bucket, leaves: tuple) -> None:
        """Each member's ``.grad`` made a view of its place in `b`'s gradient buffer (packed there: the same
        values, the same pending sum), so the block the backward made is freed: the buffer is the gradients'
        memory, as Megatron's main_grad views its grad buffer. (The views made once, `b.views`; `map` makes
        the DTensors, no Python per member.)"""
        ours = b.pick(leaves)
        gs = tuple(map(_GRAD, ours))
        made = map(type(gs[0])._trusted, map(_MESH, gs), b.views, map(_LAYOUT, gs), map(_GLOBAL, gs))
        _drain(map(setattr, ours, _GRAD_NAMES, made))

    def _grads(self) -> list:
        """Every parameter's gradient block summed over all but the dp axes (one Allreduce per other group of
        axes), checked to be a pending sum over the dp axes it is replicated over; the refusals are alike on every
        rank."""
        again = self._grads_again()
        if again is not None:
            out, extra = again
        else:
            out, extra = self._grads_checked()
        self._sum_other_axes(out, extra)
        for members, layouts in extra.values():
            for i, layout in zip(members, layouts):  # the leaf's gradient, now pending over its dp axes only
                p = self.params[i]
                p._ag.grad = type(p.grad)(p.mesh, out[i], layout, p.global_shape)
        return out

    def _grads_again(self) -> Any:
        """`_grads_checked`'s answer without its Python per parameter, when every parameter's leaf, block and
        layout are the very objects the last check saw and each gradient's layout the very object it checked
        (its block of the shape it had); else None."""
        seen = self._seen_grads
        if seen is None or CAPTURE.on:  # (a captured step reads the blocks as recorded: `.local`)
            return None
        leaves, blocks, layouts, grad_layouts, shapes, extra = seen
        params = self.params
        if not (all(map(_is, map(_AG, params), leaves)) and all(map(_is, map(_LOCAL, params), blocks))
                and all(map(_is, map(_LAYOUT, params), layouts))):
            return None
        held = list(map(_GRAD, leaves))
        if not all(map(_is_not, held, _NONES)) or not all(map(_is, map(_LAYOUT, held), grad_layouts)) \
                or list(map(_SHAPE, held)) != shapes:
            return None
        return list(map(_LOCAL, held)), extra

    def _grads_checked(self) -> tuple:
        """(each parameter's gradient block, {other axes: (members, their layouts once summed over those)}),
        every gradient checked (the refusals); what was checked remembered for `_grads_again`."""
        extra: dict = {}
        for i, p in enumerate(self.params):
            g = p.grad
            self._check_grad(i, p, g)
            self._note_other_axes(extra, i, i, p, g)
        out = [p.grad.local for p in self.params]
        params = self.params
        self._seen_grads = None
        if not CAPTURE.on:
            held = tuple(map(_GRAD, map(_AG, params)))
            self._seen_grads = (tuple(map(_AG, params)), tuple(map(_LOCAL, params)), tuple(map(_LAYOUT, params)),
                                tuple(map(_LAYOUT, held)), list(map(_SHAPE, held)), extra)
        return out, extra

    def _note_other_axes(self, extra: dict, at: int, i: int, p: Any, g: Any) -> None:
        """Note in `extra` ({other axes: (positions, layouts once summed over them)}) parameter `i`'s gradient `g`,
        at position `at` of its list, if it is pending over axes other than its dp ones (`self.axes[i]`)."""
        others = tuple(a for a in g.layout.partial if a not in self.axes[i])
        if others:
            members, layouts = extra.setdefault(others, ([], []))
            members.append(at)
            layouts.append(with_partial(p.layout, tuple(a for a in g.layout.partial if a in self.axes[i])))

    def _sum_other_axes(self, out: list, extra: dict) -> None:
        """The blocks of `out` that `extra` (`_note_other_axes`') names summed over those other axes, in place of
        their entries: one Allreduce per group of axes, of their blocks laid end to end."""
        for axes, (members, _) in extra.items():
            flat = np.concatenate([out[j].reshape(-1) for j in members]) if not self._dry else \
                _dry_flat(sum(out[j].size for j in members), out[members[0]].dtype)
            summed = resolve(self.mesh, flat, pending(self.mesh.layout, 1, axes), "zero-1 sum over "
                             + ",".join(axes), owned=True)
            at = 0
            for j in members:
                n = out[j].size
                out[j] = summed[at:at + n].reshape(out[j].shape)
                at += n

    def _check_grad(self, i: int, p: Any, g: Any) -> None:
        """Refuse parameter `i`'s gradient `g` if it is missing, laid out unlike `p` or not pending over the dp
        axes its states shard over (alike on every rank: layouts and shapes)."""
        if g is None:
            raise OperatorError(f"DistributedAdamW: parameter {i} has no gradient; every parameter of a "
                                "bucket steps together")
        if g.layout.tensor_map != p.layout.tensor_map or g.local.shape != p.local.shape:
            raise OperatorError(f"parameter {i}: gradient laid out {g.layout} does not match {p.layout}")
        if not set(self.axes[i]) <= set(g.layout.partial):
            raise OperatorError(f"DistributedAdamW: parameter {i}'s gradient ({g.layout}) is not pending over "
                                f"{self.axes[i]!r}: run loss.backward(keep_pending=optimizer.params), so the "
                                "optimizer sums it once over dp (a gradient already summed would be summed "
                                "again)")
