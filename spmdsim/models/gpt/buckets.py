"""The gradient buckets and ZeRO's options of the GPT's trainers (spmdsim.models.gpt.train, .pipeline): the
buckets' size on a mesh, the axes ZeRO shards over, and each rank's start and updates as the check anchors them."""
from __future__ import annotations

from typing import Any
import numpy as np
from .config import GPTConfig
from ..axes import CONTEXT, DATA, EXPERT
from ...nn.optim import adamw_update
from ...runtime.executor import gather


#: The gradient buckets' size in elements of a rank's parameter shards, ZeRO-0's and ZeRO-2's alike: Megatron's
#: default bucket_size, max(40M, 1M x the data-parallel size): at a large dp a ring's per-rank chunk of a bucket
#: stays large enough for the bandwidth, not the latency, to set its time (megatron/core/distributed/
#: distributed_data_parallel.py; its buckets count a process's parameter elements, its shards under tensor
#: parallelism). `buckets(mesh)` gives it for a mesh.
ZERO_BUCKET = 40_000_000


ZERO_BUCKET_PER_DP = 1_000_000


def buckets(mesh: Any) -> int:
    """The gradient buckets' size in elements on `mesh` (ZERO_BUCKET, or ZERO_BUCKET_PER_DP a data-parallel rank:
    the ranks over which the dense layers' gradients are summed, dp and, on an MoE mesh, ep, as Megatron's data-
    parallel size counts them)."""
    return max(ZERO_BUCKET, ZERO_BUCKET_PER_DP * mesh.layout.group_size(_zero_axes(mesh)))


def dp_bucket(params: list, mesh: Any) -> int:
    """ZeRO-0's gradient bucket in bytes (its GradBuffer's cap, which counts a rank's shards, as `reduce_grads`'):
    `buckets(mesh)` elements at the widest parameter's bytes."""
    return buckets(mesh) * _widest(params)


def _widest(params: list) -> int:
    """The bytes of an element of the widest of `params` (8 for none): a bucket's elements priced at them."""
    return max((p.local.dtype.itemsize for p in params), default=8)


def zero_options(zero: int, params: list, mesh: Any) -> dict:
    """DistributedAdamW's options for ZeRO stage `zero` (1 or 2) over `params` on `mesh`: ZeRO-2 shards the
    gradients, in buckets of at most `buckets(mesh)` elements (at the widest parameter's bytes; the buckets share
    one flat buffer of the largest's bytes, so the buffer a rank holds beside its gradient slices stays this
    size); ZeRO-1 keeps one bucket."""
    if zero < 2:
        return {}
    return {"shard_grads": True, "bucket": buckets(mesh) * _widest(params)}


def _zero_axes(mesh: Any) -> tuple:
    """The axes ZeRO-1 shards over: the data-parallel ones, "dp" and, on an MoE mesh, "ep" (the dense layers'
    tokens are split over both; the experts, split over ep, shard over dp alone: spmdsim.nn.distrib_optim), and
    "cp" (each rank saw part of every sequence: its gradients are summed there too, and Megatron-LM's
    distributed optimizer shards over its data-parallel group with context parallelism's)."""
    return tuple(a for a in (DATA, EXPERT, CONTEXT) if a in mesh.layout.alias_name)


def anchored_start(optimizer: Any, tensors: dict) -> Any:
    """Copies at the step's start of what the update reads, for `anchored_updates`: with AdamW, name -> (this
    rank's block, its first and second moments (None before its first step), its steps so far, whether it
    decays); with ZeRO-1 (spmdsim.nn.optim.DistributedAdamW), per bucket (this rank's master slice, its moments'
    slices, the bucket's steps so far)."""
    if hasattr(optimizer, "buckets"):  # ZeRO-1: each rank updates its slice of each bucket
        return [(b.master.copy(), b.m.copy(), b.v.copy(), b.t) for b in optimizer.buckets]
    index = {id(p): i for i, p in enumerate(optimizer.params)}
    out = {}
    for name, t in tensors.items():
        i = index[id(t)]
        steps, m, v = optimizer.state.get(i) or (0, None, None)
        out[name] = (np.array(t.local, np.float64), None if m is None else np.array(m, np.float64),
                     None if v is None else np.array(v, np.float64), steps, bool(optimizer.decays[i]))
    return out


def anchored_updates(start: Any, tensors: dict, cfg: GPTConfig, optimizer: Any) -> dict:
    """name -> this rank's block after the reference's AdamW (spmdsim.nn.optim.adamw_update) on the run's own
    start (`anchored_start`) and the gradient the run stepped with: the update checked on the run's very
    inputs. A free-running update of the reference's own gradients turns a rounding the gradient check
    accepts into AdamW's first-step sign flip (lr x g / (|g| + eps)) where a gradient has cancelled. With
    ZeRO-1 each rank updates its own slice of each bucket from its summed gradient slice, and the slices are
    gathered over dp (one Allgather a bucket, label "check": a collective) into the parameters' blocks, as the
    optimizer's own Allgather gathers them."""
    if hasattr(optimizer, "buckets"):
        return _zero_anchored(start, tensors, cfg, optimizer)
    out = {}
    for name, (p, m, v, steps, decaying) in start.items():
        p, g = p.copy(), np.asarray(tensors[name].grad.local, np.float64)
        m = np.zeros_like(p) if m is None else m.copy()
        v = np.zeros_like(p) if v is None else v.copy()
        adamw_update(p, g, m, v, steps + 1, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                     weight_decay=cfg.weight_decay if decaying else 0.0)
        out[name] = p
    return out


def _zero_anchored(start: list, tensors: dict, cfg: GPTConfig, optimizer: Any) -> dict:
    """`anchored_updates` under ZeRO-1: AdamW of each bucket's slice (decay on its decaying spans), gathered."""
    names = list(tensors)
    out = {}
    for b, (master, m, v, steps) in zip(optimizer.buckets, start):
        p, m, v = master.astype(np.float64), m.astype(np.float64), v.astype(np.float64)
        for a, z in b.decayed:  # decoupled decay first, as AdamW's update makes it
            p[a:z] *= 1 - cfg.lr * cfg.weight_decay
        adamw_update(p, np.asarray(b.grad, np.float64), m, v, steps + 1, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                     weight_decay=0.0)
        flat = gather(optimizer.mesh, p, b.axes, "check") if b.axes else p
        for i, a, z in b.members:
            out[names[i]] = flat[a:z].reshape(tensors[names[i]].local.shape)
    return out
