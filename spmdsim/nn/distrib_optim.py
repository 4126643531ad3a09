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
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Callable, Iterable, Optional, Union

import numpy as np

from .autograd.graph import updated, with_partial
from ..base.buffers import CAPTURE
from ..base.context import current
from ..errors import OperatorError
from ..base.flops import sweep
from .adamw_flat import _decay_flags, _gather_elements, _picker, _step_sizes
from .clip import _norm_of, _squares, _summed_squares, clip_coefficient
from .optim_checks import _adam_args, _capturing
from .optimizer import (_AG, _GRAD, _GRAD_NAMES, _LAYOUT, _LOCAL, _NONES, _SHAPE, _count_step, _drain, _is, _is_not,
                        _kernel, _Optimizer, _run_update)
from ..base.precision import is_low
from ..base.validate import tolerance_arg

__all__ = ["DistributedAdamW"]


@dataclass
class _Bucket:
    """Parameters laid end to end in one flat buffer, and this rank's slice of it."""

    dtype: np.dtype  # the parameters'
    axes: tuple = ()  # the dp axes its members are replicated over: its slices' group (one of size above one)
    wide: Any = None  # the gradients', master copy's and moments' (float32 for bfloat16 parameters)
    params: Any = None  # bfloat16 parameters: `flat`'s first bytes as bfloat16, what they are gathered into
    rounded: Any = None  # bfloat16 parameters: this rank's master slice rounded, what it sends
    members: list = field(default_factory=list)  # (parameter index, start, stop) in the flat buffer
    size: int = 0  # elements before padding
    padded: int = 0  # a multiple of dp
    start: int = 0  # this rank's slice [start, start + padded // dp)
    decayed: tuple = ()  # (a, b) slice-relative spans of decaying parameters
    flat: Any = None  # the gradient buffer: the gradients going out, the parameters coming back (ZeRO-2: the
    # buckets' one shared buffer, a bucket at a time)
    grad: Any = None  # this rank's slice of the summed gradients (the Reduce_scatter's result)
    master: Any = None
    m: Any = None
    v: Any = None
    tmp: Any = None  # the update's scratch: one group's (spmdsim.nn.adamw_flat._GROUP_ELEMENTS) at most
    dp: int = 1  # the group's size
    t: int = 0  # steps taken
    loaded: bool = False  # bfloat16 parameters: the master slice was taken from them at the first step
    # Made once with the buffers (`DistributedAdamW._prepare`), read at every step: the members' parameter
    # indices and `pick` (a tuple of theirs from a column over every parameter), their slices of `flat`,
    # their gradients' views of `flat` (ZeRO-1's ``.grad`` blocks), the views of the gathered buffer their
    # blocks are copied from, and `parts`: (pick, slices of `master`, slices of a flattened block) of the
    # members overlapping this rank's slice (None: none).
    indices: tuple = ()
    pick: Any = None
    slices: tuple = ()
    views: tuple = ()
    sources: tuple = ()
    parts: Any = None

    @property
    def shard(self) -> int:
        return self.padded // self.dp


class DistributedAdamW(_Optimizer):
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
            None: one bucket per dtype (Megatron's default is max(40M, 1M x dp) elements: spmdsim.models.gpt.train.buckets).
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
                 shard_grads: bool = False) -> None:
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

    def _checked_axes(self, dp_axes: Any) -> tuple:
        """The dp axes of size above one (a group of one shards nothing), or the error every rank raises."""
        names = self.mesh.layout.alias_name
        axes = (dp_axes,) if isinstance(dp_axes, str) else tuple(dp_axes)
        if not axes or any(a not in names for a in axes) or len(set(axes)) != len(axes):
            raise OperatorError(f"DistributedAdamW: dp_axes {dp_axes!r} must name distinct axes of the mesh "
                                f"{tuple(names)!r}")
        for i, p in enumerate(self.params):
            if p.layout.layout != self.mesh.layout:
                raise OperatorError(f"DistributedAdamW: parameter {i} is on {p.layout.layout}, not the mesh "
                                    f"{self.mesh.layout}")
        return tuple(a for a in axes if self.mesh.layout.axis_size(a) > 1)

    def _buckets(self, cap: Optional[int]) -> list:
        """The parameters in buckets: by dtype and the dp axes their states shard over, in parameter order, each
        at most `cap` bytes (a larger parameter alone), padded to a multiple of its group's size; this rank's
        slice and decaying spans in each."""
        made: list = []
        open_: dict = {}
        layout = self.mesh.layout
        for i, p in enumerate(self.params):
            dtype, n, axes = p.local.dtype, p.local.size, self.axes[i]
            key = (dtype.str, axes)
            b = open_.get(key)
            if b is None or (cap is not None and b.size and (b.size + n) * dtype.itemsize > cap):
                b = open_[key] = _Bucket(dtype, axes, np.dtype(np.float32) if is_low(dtype) else dtype,
                                         dp=layout.group_size(axes) if axes else 1)
                made.append(b)
            b.members.append((i, b.size, b.size + n))
            b.size += n
        for b in made:
            b.padded = -(-b.size // b.dp) * b.dp
            b.start = (layout.group_index(self.mesh.rank, b.axes) if b.axes else 0) * b.shard
            lo, hi = b.start, b.start + b.shard
            b.decayed = tuple((max(a, lo) - lo, min(z, hi) - lo) for i, a, z in b.members
                              if self.decays[i] and max(a, lo) < min(z, hi))
        return made

    def _shared_buffer(self) -> Any:
        """ZeRO-2's one flat buffer for every bucket, in turn: the largest bucket's bytes (zeros; a dry run's
        take no pages)."""
        nbytes = max((b.padded * b.wide.itemsize for b in self.buckets), default=0)
        if self._dry:
            from ..runtime.sim.dry import zeros

            return zeros((nbytes,), np.uint8)
        return np.zeros(nbytes, np.uint8)

    def _allocate(self, b: _Bucket) -> None:
        """The flat buffer and this rank's slice buffers; the master copy from the parameters as they are.
        A dry run makes the two buffers its collectives need as zeros (no pages touched), and counts the
        rest on its meter."""
        low = b.wide != b.dtype
        if self._dry:
            from ..runtime.sim.dry import zeros

            b.flat = zeros((b.padded,), b.wide) if self._shared is None else _narrow_view(self._shared, b.wide,
                                                                                          b.padded)
            b.grad = zeros((b.shard,), b.wide)
            if low:
                b.params, b.rounded = _narrow_view(b.flat, b.dtype, b.padded), zeros((b.shard,), b.dtype)
            return
        b.flat = np.zeros(b.padded, b.wide) if self._shared is None else _narrow_view(self._shared, b.wide, b.padded)
        b.grad = np.zeros(b.shard, b.wide)
        if low:  # gathered into the gradient buffer's bytes, as Megatron's grad buffer receives the params
            b.params, b.rounded = _narrow_view(b.flat, b.dtype, b.padded), np.zeros(b.shard, b.dtype)
        self._flatten_params(b)
        b.master = (b.params if low else b.flat)[b.start:b.start + b.shard].astype(b.wide)
        b.m, b.v = (np.zeros(b.shard, b.wide) for _ in range(2))
        b.tmp = np.zeros(_gather_elements(b.shard), b.wide)

    def _prepare(self, b: _Bucket) -> None:
        """What a step reads of bucket `b` (its buffers made): the _Bucket fields after `loaded`."""
        b.indices = tuple(i for i, _, _ in b.members)
        b.pick = _picker(list(b.indices))
        b.slices = tuple(slice(a, z) for _, a, z in b.members)
        shapes = [self.params[i].local.shape for i in b.indices]
        b.views = tuple(b.flat[a:z].reshape(shape) for (_, a, z), shape in zip(b.members, shapes))
        if self._dry:
            return
        into = b.flat if b.params is None else b.params
        b.sources = tuple(into[a:z].reshape(shape) for (_, a, z), shape in zip(b.members, shapes))
        lo, hi = b.start, b.start + b.shard
        overlap = [(i, slice(max(a, lo) - lo, min(z, hi) - lo), slice(max(a, lo) - a, min(z, hi) - a))
                   for i, a, z in b.members if max(a, lo) < min(z, hi)]
        if overlap:
            b.parts = (_picker([i for i, _, _ in overlap]), tuple(d for _, d, _ in overlap),
                       tuple(r for _, _, r in overlap))

    def _claim(self, leaves: tuple) -> None:
        """ZeRO-1: each parameter's gradient accumulates in its view of its bucket's gradient buffer (its leaf's
        ``main``, Megatron's main_grad: spmdsim.nn.autograd.engine's `_into_main`), from the first backward of a step
        on, so the step finds it packed already and the rank holds it once. ZeRO-2's buckets share one buffer,
        a bucket at a time: its gradients stay blocks of their own until their bucket is reduced."""
        if self._shared is None:
            for b in self.buckets:
                _drain(map(setattr, b.pick(leaves), _MAIN_NAMES, b.views))  # leaf.main = its view

    def _flatten_params(self, b: _Bucket) -> None:
        into = b.flat if b.params is None else b.params
        for i, a, z in b.members:
            into[a:z] = self.params[i].local.reshape(-1)

    def memory(self) -> dict:
        """This rank's bytes: "optimizer states" (the moments), "master copy", "buffers" (the summed gradients'
        slices, the update's scratch, and a bfloat16 parameter's rounded slice). The buckets' flat buffers are
        the gradients' (`gradient_buffers`), not counted here; under ZeRO-2 the summed slices are the gradients'
        and the buckets' one shared flat buffer is counted here."""
        slices = sum(b.shard * b.wide.itemsize for b in self.buckets)
        scratch = sum(_gather_elements(b.shard) * b.wide.itemsize for b in self.buckets)
        low = sum(b.shard * b.dtype.itemsize for b in self.buckets if b.params is not None)
        if self._shared is not None:  # ZeRO-2: the summed slices are the gradients; the shared flat buffer
            return {"optimizer states": 2 * slices, "master copy": slices,
                    "buffers": self._shared.nbytes + scratch + low}
        return {"optimizer states": 2 * slices, "master copy": slices, "buffers": slices + scratch + low}

    def gradient_buffers(self) -> tuple:
        """The buckets' flat buffers: the gradient buffer (Megatron's main_grad buffer) the step packs each
        parameter's gradient into, its ``.grad`` then a view of it, until the parameters are gathered into
        it (after a step every ``.grad`` is None). A memory report counts them as gradients. Under ZeRO-2 the
        summed slices, the only gradients a rank keeps after the step."""
        if self._shared is not None:
            return tuple(b.grad for b in self.buckets)
        return tuple(b.flat for b in self.buckets)

    def states_of(self, params: Iterable[Any]) -> int:
        """The bytes of this rank's slices of the moments of these parameters (of this optimizer's), a part of
        `memory`'s "optimizer states" (an MoE layer's experts, spmdsim.models.moe.ledger), a dry run's alike."""
        wanted = {id(p) for p in params}
        total = 0
        for b in self.buckets:
            lo, hi = b.start, b.start + b.shard
            total += sum(2 * max(0, min(z, hi) - max(a, lo)) * b.wide.itemsize for i, a, z in b.members
                         if id(self.params[i]) in wanted)
        return total

    def grads_of(self, params: Iterable[Any]) -> int:
        """The bytes of these parameters' gradients in the gradient buffers (their blocks' elements at the
        gradients' width), whether or not a step has consumed them; under ZeRO-2 the parts of this rank's summed
        slices; a dry run's alike."""
        wanted = {id(p) for p in params}
        if self._shared is not None:
            return sum(max(0, min(z, b.start + b.shard) - max(a, b.start)) * b.wide.itemsize for b in self.buckets
                       for i, a, z in b.members if id(self.params[i]) in wanted)
        return sum((z - a) * b.wide.itemsize for b in self.buckets for i, a, z in b.members
                   if id(self.params[i]) in wanted)

    def grad_slices(self) -> list:
        """(parameter index, start, stop, values): the summed gradient this rank updated at the last step,
        elements [start, stop) of that parameter's flattened block (a real run's; empty before a step)."""
        out = []
        if self._dry or not self.steps:
            return out
        for b in self.buckets:
            lo, hi = b.start, b.start + b.shard
            for i, a, z in b.members:
                if max(a, lo) < min(z, hi):
                    out.append((i, max(a, lo) - a, min(z, hi) - a, b.grad[max(a, lo) - lo:min(z, hi) - lo]))
        return out

    def gathered(self, kind: str, label: str = "check") -> list:
        """Each parameter's whole block of the master copy ("master"), a moment ("m", "v") or the summed gradient
        of the last step ("grad"), from the ranks' slices gathered over dp (one Allgather a bucket, `label`): a
        list in parameter order, each shaped as the parameter's block (collective; a real run's). A check reads
        them where AdamW's are read whole (spmdsim.models.gpt.train under a low-precision policy)."""
        from ..runtime.executor import gather

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
            from ..runtime.replay import ReplayError

            raise ReplayError("replay: DistributedAdamW.last_norm read inside a captured step: the replays "
                              "would keep the capture's value; read it after each step (each replay writes "
                              "its own)")
        return float(self._norm[0]) if self._normed else None

    def step(self) -> None:
        """Sum the gradients over dp onto this rank's slices, update them, gather the parameters (collective)."""
        from ..runtime.collectives import allgather, reduce_scatter

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
        from ..runtime.collectives import reduce_scatter

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
        from ..runtime.executor import pending, resolve

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
        from ..runtime.replay import ReplayError

        raise ReplayError(f"replay: DistributedAdamW.clip_grad is {optimizer.clip_grad!r} now but was 0 when the "
                          "step was captured, so a replay takes no gradient norm; capture the step again after "
                          "setting clip_grad")


def _dry_flat(n: int, dtype: Any) -> np.ndarray:
    from ..runtime.sim.dry import zeros

    return zeros((n,), dtype)


def _narrow_view(flat: np.ndarray, dtype: Any, n: int) -> np.ndarray:
    """The first `n` elements' bytes of `flat` (a wider dtype) as an array of `dtype`: a view, no memory."""
    return flat.view(np.uint8)[:n * np.dtype(dtype).itemsize].view(dtype)


_MESH, _GLOBAL, _LOCAL_VIEW = (operator.attrgetter(name) for name in ("_mesh", "_shape", "local"))
_MAIN_NAMES = repeat("main")
_FLAT = operator.methodcaller("reshape", -1)


def _pack(flat: np.ndarray, grads: tuple, slices: tuple) -> None:
    """The gradient blocks end to end into `flat` (``flat[a:z] = g.reshape(-1)`` each, made by `map`), its
    padding zeroed."""
    _drain(map(operator.setitem, repeat(flat), slices, map(_FLAT, grads)))
    flat[slices[-1].stop:] = 0


def _load_master(b: _Bucket, blocks: tuple) -> None:
    """This rank's master slice of bucket `b` from the parameters' blocks where they overlap it.

    AdamW updates the parameters themselves, so a parameter set between steps (weights loaded after the
    optimizer was made, a value clamped or tied by hand) is what its next step starts from. The master slice
    is this rank's copy of them, made when the optimizer was: without this, the next Allgather wrote the old
    values back over any such change. Parameters of the master's own dtype are read at every step (a
    parameter the last step gathered equals its slice bit for bit: nothing changes); bfloat16 ones at the
    first step only, as AdamW makes its float32 master copy of them then (reading them again each step would
    round the float32 master to bfloat16). One kernel: a replay reruns it, as the update it precedes."""
    if b.params is not None:
        if b.loaded:
            return
        b.loaded = True
    if b.parts is not None:  # `blocks`: every parameter's; each member's overlap with the slice, by `map`
        pick, into, taken = b.parts
        _drain(map(operator.setitem, repeat(b.master), into, map(operator.getitem, map(_FLAT, pick(blocks)), taken)))


def _round(master: np.ndarray, out: np.ndarray) -> None:
    """The master slice rounded once to the parameters' dtype (bfloat16: round to nearest even, numpy's cast as
    astype makes it), written into `out` without a temporary."""
    np.copyto(out, master, casting="unsafe")


def _unpack(blocks: tuple, sources: tuple) -> None:
    """The gathered parameters into their blocks, in place: ``block[...] = source`` each (`sources`: their views
    of the gathered buffer, `_Bucket.sources`), made by `map`."""
    _drain(map(operator.setitem, blocks, repeat(Ellipsis), sources))
