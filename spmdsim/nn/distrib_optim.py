"""ZeRO-1, Megatron's distributed optimizer: AdamW whose states and master copy are sharded over dp.

Every data-parallel rank holds the same parameters (replicated over the dp axes), so every rank's
AdamW would hold the same moments. Here each holds 1/dp of them, as Megatron-core's
``DistributedOptimizer`` does (Rajbhandari et al. 2020, stage 1). A parameter split over some of the
dp axes is sharded over the others, those it is replicated over: an MoE layer's experts, split over
"ep" of the MoE GPT's dp axes ("dp", "ep"), over "dp" alone (Megatron's expert-data-parallel group),
each group's parameters in buckets of their own (below, "dp" is a parameter's group):

1. the backward leaves each gradient a pending sum over dp (``backward(keep_pending=params)``); one
   pending over other axes too (sequence parallelism's LayerNorm and bias gradients, over tp) is
   first summed over those (one Allreduce per group of axes, bucketed);
2. the gradients of one dtype are laid end to end in a flat buffer, this rank's blocks in parameter
   order (the tensor-parallel shards are what is flattened: each tp rank has its own buffer), cut
   into buckets of at most `bucket` bytes, each padded with zeros to a multiple of dp;
3. per bucket one Reduce_scatter over dp (in place of the Allreduce): dp rank r receives the sum
   of the r-th contiguous 1/dp of the bucket;
4. each rank runs AdamW on its slice only: its master copy of those parameters (the parameters' own
   dtype; float32 for bfloat16 parameters, spmdsim.base.precision's bf16-mixed, whose gradients are float32
   too: Megatron's main_grad) and its moments, 1/dp of the bucket each;
5. per bucket one Allgather over dp of the updated slices into the flat buffer, copied back into
   the parameters' blocks (bfloat16 parameters: the master slice rounded once to bfloat16 and
   gathered in bfloat16, half the bytes, into a flat buffer of their own, as Megatron gathers them).

The update is AdamW's (spmdsim.nn.optim.adamw_update) element by element, so the parameters are those
AdamW gives, but for the order of the dp sums. A parameter may straddle two ranks' slices (Megatron
cuts the same way); a decaying one is decayed on each slice's part. With `clip_grad` the gradients'
joint norm is taken on the slices (each element counted on one rank: a block replicated over tp on
its first tp rank), one Allreduce over the mesh, before the update; over a pipeline (`clip_across`) one
more Allreduce over pp adds the other stages' squares.

In a dry run (shapes only) the collectives run on the dry engine's zeros and nothing is computed; the
states and master copy it would hold (3 slices per bucket) and the update's scratch (one group of
spmdsim.nn.adamw_flat._GROUP_ELEMENTS at most) are counted on the run's Meter.

Memory, as Megatron's distributed optimizer holds it (Megatron Core user guide, "Distributed Optimizer":
6 + 12/d bytes a parameter with bf16 parameters and fp32 main gradients): the flat buffer of step 2 is the
gradients' buffer. Each parameter's gradient accumulates in its view of it from the step's first backward on
(its leaf's ``main``, Megatron's main_grad: ``backward(keep_pending=params, reduce_with=optimizer)`` puts each
gradient there as soon as the walk has it, copied at the first backward, added at the later ones, ``.grad`` a
view of the buffer), so the rank holds the gradients once and step 2 finds them packed (a gradient made
elsewhere, one summed over other axes first, is copied in). The buffer receives the gathered parameters in
step 5 (bfloat16 ones in its first bytes), so after a step every ``.grad`` is None;
the summed slice (step 3's result, 4/d: Megatron reduces in place into its grad buffer, which MPI's
Reduce_scatter here does not) and a group's scratch for the update are all it holds beside.

ZeRO-2 (``shard_grads=True``, Rajbhandari et al. 2020's P_os+g; DeepSpeed's ``stage: 2``): the gradients
sharded too. Each rank keeps only its 1/d slice of the summed gradients (step 3's result, between steps the
gradients' only memory); the buckets share one flat buffer (the largest bucket's bytes: DeepSpeed's reduce
bucket), into which step 2 packs one bucket at a time, its members' gradient blocks freed (``.grad`` None)
before its Reduce_scatter, and step 5 gathers one bucket at a time. Steps 1-3 run in the backward, as
DeepSpeed's stage 2 and Megatron's overlap_grad_reduce reduce a bucket as soon as it fills:
``spmdsim.nn.autograd.backward(loss, keep_pending=params, reduce_with=optimizer)`` stops its walk after the last
node reading a bucket's members, puts their gradients into ``.grad`` and calls `_bucket_ready`, which checks
them, sums those pending over other axes (one Allreduce per group of axes, of the bucket's members), packs the
bucket, frees its members' blocks and reduce-scatters it. So the Reduce_scatters come in the order the buckets
fill (the same on every rank of a dp group: one graph), and a rank never holds a reduced bucket's gradients
whole again that step. ``step()`` reduces the buckets the backward did not (in bucket order; every one after a
plain backward), then updates. With several microbatches a step only the last backward is given
`reduce_with` (the earlier ones accumulate whole, as under ZeRO-1); `reduce_after` leaves the buckets of
parameters whose gradients change after the backward (a pipeline's tied table) to the step. The arithmetic is
ZeRO-1's (the same buckets' elements, the same sums, the same update): the parameters are ZeRO-1's bit for bit.
"""
from __future__ import annotations

import operator
from itertools import repeat
from typing import Any, Callable, Iterable, Optional, Union

import numpy as np

from .autograd.graph import updated
from ..base.buffers import CAPTURE
from ..base.context import current
from ..errors import OperatorError
from ..base.flops import sweep
from ..base.foreign import take_foreign
from .adamw_flat import _decay_flags, _gather_elements, _step_sizes
from .clip import _norm_of, _squares, _summed_squares, clip_coefficient
from .optim_checks import PYTORCH_KEYWORDS, _adam_args, _capturing
from .optimizer import _AG, _GRAD_NAMES, _LOCAL, _NONES, _count_step, _drain, _kernel, _Optimizer, _run_update
from ..base.validate import tolerance_arg
from ..runtime.executor import gather
from ..runtime.replay import ReplayError
from ..runtime.collectives import allgather, reduce_scatter
from .zero_buffers import _load_master, _LOCAL_VIEW, _pack, _round, _unpack, _ZeroBuffers
from .zero_grads import _ZeroGrads

__all__ = ["DistributedAdamW"]


class DistributedAdamW(_ZeroBuffers, _ZeroGrads, _Optimizer):
    """AdamW (spmdsim.nn.optim.AdamW's update) with its states and master copy sharded over the `dp_axes` each
    parameter is replicated over (ZeRO-1; an MoE layer's experts over dp alone).

    Args:
        params: DTensor leaves on `mesh`.
        mesh: their Mesh.
        dp_axes: the data-parallel mesh axes the states are sharded over (their group, first major). A
            parameter split over some of them (an MoE layer's experts, split over "ep" of dp_axes ("dp",
            "ep")) has its states sharded over the others, the axes it is replicated over: Megatron's
            expert-data-parallel group (one split over all of them keeps its states whole, as AdamW).
        lr, betas, eps, weight_decay, decay: as spmdsim.nn.optim.AdamW's.
        bucket: the most bytes of gradients per bucket (one Reduce_scatter and one Allgather each);
            None: one bucket per dtype (Megatron's default is max(40M, 1M x dp) elements:
            spmdsim.models.gpt.buckets.buckets).
        clip_grad: clip the gradients' joint norm to this before the update (0: no clipping).
        clip_across: (mesh, axes): the squares summed once more over those axes of that mesh, as
            spmdsim.nn.optim.clip_grad_norm_'s `across` (a pipeline: the whole (pp, dp, tp) mesh and ("pp",),
            each stage's optimizer over its own (dp, tp) mesh); None: `mesh` alone.
        clip_counted: the parameters whose squares this rank adds (default all), as clip_grad_norm_'s
            `counted` (a tied table both end stages hold counts on one of them).
        shard_grads: ZeRO-2: keep only this rank's slice of the summed gradients (each bucket's gradient
            blocks freed as it is packed for its Reduce_scatter; the buckets share one flat buffer); False:
            ZeRO-1 (the flat buffer is the gradients', one a bucket).

    Each step wants every parameter's gradient pending over dp (``loss.backward(keep_pending=
    optimizer.params)``, then ``optimizer.step()``); `grad_slices()` gives the summed gradients this
    rank updated.
    """

    def __init__(self, params: Iterable[Any], mesh: Any, dp_axes: tuple = ("dp",), lr: float = 1e-3,
                 betas: tuple = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 1e-2,
                 decay: Union[None, Callable[[Any], bool], Iterable[Any]] = None, bucket: Optional[int] = None,
                 clip_grad: float = 0.0, clip_across: Any = None, clip_counted: Any = None,
                 shard_grads: bool = False, **foreign: Any) -> None:
        if foreign:  # torch.optim's keywords, by habit: spmdsim's values pass
            take_foreign(type(self).__name__, foreign, PYTORCH_KEYWORDS)
        super().__init__(params, lr)
        if type(shard_grads) is not bool:
            raise OperatorError(f"DistributedAdamW: shard_grads {shard_grads!r} must be True (ZeRO-2: gradients "
                                "sharded) or False (ZeRO-1)")
        self.shard_grads = shard_grads
        self.stage = 2 if shard_grads else 1
        self.clip_across = clip_across
        self._counted = None if clip_counted is None else {id(p) for p in clip_counted}
        self.mesh = mesh
        self.betas, self.eps = _adam_args(betas, eps)
        self.weight_decay = tolerance_arg(weight_decay, "weight_decay", OperatorError)
        self.clip_grad = tolerance_arg(clip_grad, "clip_grad", OperatorError)
        self.decays = _decay_flags(self.params, decay)
        self.dp_axes = self._checked_axes(dp_axes)
        if bucket is not None and (type(bucket) is not int or bucket <= 0):
            raise OperatorError(f"DistributedAdamW: bucket {bucket!r} must be None or a positive number of bytes")
        # Each parameter's states are sharded over the dp axes it is replicated over.
        self.axes = [tuple(a for a in self.dp_axes if a not in p.layout.split_axes) for p in self.params]
        self.buckets = self._buckets(bucket)
        self._dry = bool(mesh.engine.dry)
        self._shared = self._shared_buffer() if shard_grads else None
        # ZeRO-2 in the backward (`backward(reduce_with=...)`): the buckets reduced this step, the parameters whose
        # last gradient of the step a walk has given, those whose buckets only the step reduces (`reduce_after`),
        # and `watch`, called with the walk's gradients before each bucket is reduced there (a memory look).
        self._reduced = [False] * len(self.buckets)
        self._final: set = set()
        self._after: set = set()
        self.watch: Optional[Callable[[dict], None]] = None
        for b in self.buckets:
            self._allocate(b)
            self._prepare(b)
        self._claim(tuple(map(_AG, self.params)))
        self._seen_grads: Any = None  # what the last step's `_grads` checked (`_grads_again`)
        # Clipping: the norm before clipping of the last clipped step (written by a kernel: a replayed step
        # writes its own), and the parts of the summed slices whose squares this rank adds.
        self._norm = np.zeros(1)
        self._normed = False
        self._clip_parts = self._counted_parts()

    # -- checkpoints (spmdsim.nn.optim's state_dict / load_state_dict): this rank's slice of each bucket --

    _hyper = ("lr", "betas", "eps", "weight_decay", "clip_grad")
    _unit = "bucket"

    def _placement(self) -> dict:
        """Beside each parameter's block: each bucket's dtype, dp axes, members (parameter index, start, stop)
        and this rank's slice [start, stop) of it."""
        buckets = tuple((b.dtype.name, tuple(b.axes), tuple(tuple(int(x) for x in m) for m in b.members),
                         (int(b.start), int(b.start + b.shard))) for b in self.buckets)
        return dict(super()._placement(), buckets=buckets)

    def _state_slots(self) -> int:
        return len(self.buckets)

    def _required(self) -> range:
        return range(len(self.buckets))

    def _whose(self, key: int) -> str:
        return f"slice of bucket {key}"

    def _state_items(self) -> dict:
        return {k: {"step": b.t, "exp_avg": b.m, "exp_avg_sq": b.v, "master": b.master}
                for k, b in enumerate(self.buckets)}

    def _entry_spec(self, key: int) -> dict:
        b = self.buckets[key]
        wide = ((b.shard,), (b.wide,))
        return {"step": int, "exp_avg": wide, "exp_avg_sq": wide, "master": wide}

    def _load(self, entries: dict) -> None:
        # In place: a captured step's kernels hold these slices (a replay updates the loaded ones).
        for k, e in entries.items():
            b = self.buckets[k]
            np.copyto(b.m, e["exp_avg"])
            np.copyto(b.v, e["exp_avg_sq"])
            np.copyto(b.master, e["master"])
            b.t = e["step"]
            if b.params is not None:  # bfloat16: the master slice is the state's once a step has been taken
                b.loaded = b.t > 0

    def gathered(self, kind: str, label: str = "check") -> list:
        """Each parameter's whole block of the master copy ("master"), a moment ("m", "v") or the summed gradient
        of the last step ("grad"), from the ranks' slices gathered over dp (one Allgather a bucket, `label`): a
        list in parameter order, each shaped as the parameter's block (collective; a real run's). A check reads
        them where AdamW's are read whole (spmdsim.models.gpt.train under a low-precision policy)."""
        out: list = [None] * len(self.params)
        for b in self.buckets:
            part = getattr(b, kind)
            flat = gather(self.mesh, part, b.axes, label) if b.axes else part
            for i, a, z in b.members:
                out[i] = flat[a:z].reshape(self.params[i].local.shape)
        return out

    @property
    def last_norm(self) -> Optional[float]:
        """The gradients' joint norm before clipping at the last step that clipped (a replayed step's
        too: a kernel writes it), None before one; read after the step (inside a captured step it would
        be the capture's: refused)."""
        if _capturing():
            raise ReplayError("replay: DistributedAdamW.last_norm read inside a captured step: the replays "
                              "would keep the capture's value; read it after each step (each replay writes "
                              "its own)")
        return float(self._norm[0]) if self._normed else None

    def step(self, closure: Any = None) -> None:
        """Sum the gradients over dp onto this rank's slices, update them, gather the parameters (collective).
        PyTorch's `closure` is taken as None only (spmdsim.base.foreign)."""
        self._no_closure(closure)
        done = self._reduced
        in_backward = any(done)  # ZeRO-2: buckets reduced in the backward (`backward(reduce_with=self)`)
        self._reduced, self._final = [False] * len(self.buckets), set()  # the next step's
        if in_backward:  # the others here, a bucket at a time, in bucket order
            leaves = tuple(map(_AG, self.params))
            for k, b in enumerate(self.buckets):
                if not done[k]:
                    self._reduce_bucket(b, leaves)
        else:
            grads = self._grads()
            leaves = tuple(map(_AG, self.params))
        self._leaves = leaves
        updated(leaves)  # every block changes in place: older graphs may not be walked
        _kernel(_count_step)(self)
        label = f"zero-{self.stage}"
        if in_backward:
            pass  # every bucket reduced: its slice in `b.grad`
        elif self._shared is not None:  # ZeRO-2: a bucket at a time through the shared buffer, its blocks freed
            for b in self.buckets:
                if not self._dry:
                    _kernel(_pack)(b.flat, b.pick(grads), b.slices)
                _drain(map(operator.setitem, repeat(grads), b.indices, _NONES))  # grads[i] = None
                _drain(map(setattr, b.pick(leaves), _GRAD_NAMES, _NONES))  # leaf.grad = None
                reduce_scatter(self.mesh, b.flat, b.axes, 0, label=f"{label} gradient bucket", out=b.grad)
        else:
            for b in self.buckets:
                if not self._dry:
                    _kernel(_pack)(b.flat, b.pick(grads), b.slices)
                self._into_buffer(b, leaves)
            del grads  # the backward's gradient blocks: each leaf's .grad views the gradient buffer now
            for b in self.buckets:
                reduce_scatter(self.mesh, b.flat, b.axes, 0, label=f"{label} gradient bucket", out=b.grad)
        if self.clip_grad:
            self._clip()
        elif _capturing():  # a replay takes no norm: refused if clip_grad is set later
            _kernel(_unclipped)(self)
        # The parameters' blocks (read as recorded while capturing: `.local`)
        blocks = tuple(map(_LOCAL if not CAPTURE.on else _LOCAL_VIEW, self.params))
        if not self._dry:  # the master slices from the parameters as they are now (AdamW reads them in place)
            for b in self.buckets:
                _kernel(_load_master)(b, blocks)
        for b in self.buckets:  # the update's traffic (spmdsim.base.flops.sweep), real and dry alike
            block = ((b.shard,), b.wide)
            sweep("adamw", (block,), (block,), "master", "optimizer")
            sweep("adamw", (block,), (), "grads", "optimizer")
            sweep("adamw", (block, block), (block, block), "states", "optimizer")
        if self._dry:
            meter = current().meter
            if meter is not None:
                meter.count(self, sum((3 * b.shard + _gather_elements(b.shard)) * b.wide.itemsize
                                      for b in self.buckets))
        else:
            for k, b in enumerate(self.buckets):
                _kernel(_run_update)(self._update_slice, k, b.master, b.grad)
        for b in self.buckets:
            if b.params is not None:  # bfloat16: the master slice rounded once, gathered in bfloat16
                if not self._dry:
                    _kernel(_round)(b.master, b.rounded)
                sent, into = b.rounded, b.params
            else:
                sent, into = b.master if not self._dry else b.grad, b.flat
            allgather(self.mesh, sent, b.axes, 0, label=f"{label} parameter bucket", out=into)
            if not self._dry:
                _kernel(_unpack)(b.pick(blocks), b.sources)
        # their buffer holds the parameters now (Megatron's grad buffer likewise)
        _drain(map(setattr, leaves, _GRAD_NAMES, _NONES))
        self._claim(leaves)  # (the leaves of the parameters now: a new one takes its view from here on)

    # -- ZeRO-2 in the backward: each bucket reduced as soon as its members have their last gradients --

    def _update_slice(self, k: int, master: np.ndarray, grad: np.ndarray) -> None:
        """AdamW on bucket `k`'s slice, element by element as spmdsim.nn.optim.adamw_update (one kernel call
        when a step is captured: a replay counts its own steps)."""
        b = self.buckets[k]
        b.t += 1
        if self.weight_decay:
            decay = 1 - self.lr * self.weight_decay
            for a, z in b.decayed:
                master[a:z] *= decay
        n = b.tmp.size  # a piece at a time through the scratch (elementwise: the values of one pass)
        for a in range(0, master.size, n):
            z = min(a + n, master.size)
            master[a:z] -= _step_sizes(grad[a:z], b.m[a:z], b.v[a:z], b.t, b.tmp[:z - a], lr=self.lr,
                                       betas=self.betas, eps=self.eps)

    def _counted_parts(self) -> tuple:
        """Views of the parts of this rank's summed slices whose squares it adds for clipping: each element
        counted once over the mesh (a block replicated over tp on its first tp rank; the dp axes are the
        slices'), and only `clip_counted`'s parameters; none in a dry run."""
        if self._dry:
            return ()
        parts = []
        layout = self.mesh.layout
        for b in self.buckets:
            lo, hi = b.start, b.start + b.shard
            for i, a, z in b.members:
                s, e = max(a, lo), min(z, hi)
                if s >= e or (self._counted is not None and id(self.params[i]) not in self._counted):
                    continue
                copies = tuple(x for x in self.params[i].layout.copy_axes if x not in self.dp_axes)
                if copies and layout.group_index(self.mesh.rank, copies) != 0:
                    continue
                parts.append(b.grad[s - lo:e - lo])
        return tuple(parts)

    def _clip(self) -> None:
        """Scale the summed slices so the gradients' joint norm is at most `clip_grad` (as
        spmdsim.nn.optim.clip_grad_norm_: each element counted once over the mesh, and over `clip_across`).
        Kernels and collectives alone: a replayed step takes its own norm and scales by it."""
        _kernel(_clip_slices)(self, _summed_squares(_kernel(_squares)(self._clip_parts), self.mesh, self.clip_across))


def _clip_slices(optimizer: DistributedAdamW, squares: np.ndarray) -> None:
    """The norm from the summed squares into `optimizer`'s last norm, and its summed slices scaled in place
    by clipping's coefficient; `clip_grad` read now (0, set after a capture that clips: the norm taken, the
    gradients left as they are)."""
    norm = _norm_of(squares)
    optimizer._norm[0] = norm
    optimizer._normed = True
    bound = optimizer.clip_grad
    if bound and not optimizer._dry:
        coefficient = clip_coefficient(norm, bound)
        if coefficient != 1.0:
            for b in optimizer.buckets:
                np.multiply(b.grad, coefficient, out=b.grad)


def _unclipped(optimizer: DistributedAdamW) -> None:
    """A step captured with clip_grad 0 takes no norm: one line if clip_grad is set before a replay."""
    if optimizer.clip_grad:
        raise ReplayError(f"replay: DistributedAdamW.clip_grad is {optimizer.clip_grad!r} now but was 0 when the "
                          "step was captured, so a replay takes no gradient norm; capture the step again after "
                          "setting clip_grad")
