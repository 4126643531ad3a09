"""DistributedAdamW's buckets and flat buffers (ZeRO-1): each bucket's parameters, gradients, master copy and
moments laid end to end, 1/dp of them this rank's slice."""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Iterable, Optional

import numpy as np

from ..errors import OperatorError
from .adamw_flat import _gather_elements, _picker
from .optimizer import _drain
from ..base.precision import is_low
from ..runtime.sim.dry import zeros


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


class _ZeroBuffers:
    """DistributedAdamW's buckets and flat buffers: cut, allocated, claimed by the gradient buffer, measured."""

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

    def _buckets(self, cap: Optional[int], rank: Optional[int] = None) -> list:
        """The parameters in buckets: by dtype and the dp axes their states shard over, in parameter order, each
        at most `cap` bytes (a larger parameter alone), padded to a multiple of its group's size; this rank's
        slice and decaying spans in each (`rank`'s, its blocks' sizes from the layouts, where given)."""
        made: list = []
        open_: dict = {}
        layout = self.mesh.layout
        self._cap = cap
        rank = self.mesh.rank if rank is None else rank
        for i, p in enumerate(self.params):
            dtype, n, axes = p.local.dtype, _block_size(p, rank), self.axes[i]
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
            b.start = (layout.group_index(rank, b.axes) if b.axes else 0) * b.shard
            lo, hi = b.start, b.start + b.shard
            b.decayed = tuple((max(a, lo) - lo, min(z, hi) - lo) for i, a, z in b.members
                              if self.decays[i] and max(a, lo) < min(z, hi))
        return made

    def slices_of(self, rank: int) -> list:
        """Each parameter's part of rank `rank`'s slices (its bucket's, as that rank cuts its buckets): (bucket
        index, start, stop of the part in the parameter's flattened block on that rank, where the part starts in
        the slice); start == stop where it holds none. What a checkpoint records to resume on another mesh."""
        out: list = [None] * len(self.params)
        for k, b in enumerate(self._buckets(self._cap, rank)):
            lo, hi = b.start, b.start + b.shard
            for i, a, z in b.members:
                s, e = max(a, lo), min(z, hi)
                out[i] = (k, s - a, e - a, s - lo) if s < e else (k, 0, 0, 0)
        return out

    def _shared_buffer(self) -> Any:
        """ZeRO-2's one flat buffer for every bucket, in turn: the largest bucket's bytes (zeros; a dry run's
        take no pages)."""
        nbytes = max((b.padded * b.wide.itemsize for b in self.buckets), default=0)
        if self._dry:
            return zeros((nbytes,), np.uint8)
        return np.zeros(nbytes, np.uint8)

    def _allocate(self, b: _Bucket) -> None:
        """The flat buffer and this rank's slice buffers; the master copy from the parameters as they are.
        A dry run makes the two buffers its collectives need as zeros (no pages touched), and counts the
        rest on its meter."""
        low = b.wide != b.dtype
        if self._dry:
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


def _block_size(p: Any, rank: int) -> int:
    """The size of parameter `p`'s block on `rank` (its own block's where that is this rank)."""
    if rank == p.mesh.rank:
        return p.local.size
    return math.prod(b - a for a, b in p.layout.bounds(rank, tuple(int(n) for n in p.global_shape)))


def _dry_flat(n: int, dtype: Any) -> np.ndarray:
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
