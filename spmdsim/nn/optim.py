"""Optimizers over DTensor parameters: SGD (with momentum), Adam and AdamW; each rank updates its own shards.
Also `clip_grad_norm_`, the gradients' joint norm over every rank's blocks (one Allreduce).

A parameter's ``.grad`` is whole (no pending sum) and laid out like the
parameter, so an update is elementwise on the local block: no communication,
and the optimizer state (momentum, Adam's moments) is sharded like the
parameters. Updates write the parameters' blocks in place (a layer holding a
view of them, such as the padded vocabulary table, sees the new values).

In a dry run (spmdsim.runtime.sim.dry: shapes, no values) a step computes nothing and
allocates no state: the parameters stay as they are, and what the optimizer
would hold after the step (momentum buffers, moments, AdamW's flat buffers),
worked out from the blocks' sizes, is counted on the run's Meter for as long
as the optimizer lives, so the report's peak bytes held includes it.

`DistributedAdamW` (spmdsim.nn.distrib_optim) is AdamW with its states and a master copy sharded over
the data-parallel axes (ZeRO-1, Megatron's distributed optimizer); it counts 1/dp of them.

Checkpoints: every optimizer's `state_dict()` and `load_state_dict(sd)`, torch.optim's, hold this rank's
state alone (its blocks' moments, ZeRO-1's slices), copied both ways; a resumed run steps as the
uninterrupted one, bit for bit (docs/howto/checkpoints.md, "In a program").
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from ..base.foreign import take_foreign
from ..base.precision import is_low

from .adamw import AdamW
from .adamw_flat import adamw_update
from .clip import clip_coefficient, clip_grad_norm_
from .distrib_optim import DistributedAdamW
from .optim_checks import PYTORCH_KEYWORDS, _adam_args, _into
from .optimizer import _Optimizer


__all__ = ["SGD", "Adam", "AdamW", "DistributedAdamW", "adamw_update", "clip_grad_norm_", "clip_coefficient"]


class SGD(_Optimizer):
    """PyTorch's SGD: buffer = momentum * buffer + g (g itself at the first step), then p -= lr * buffer; without
    momentum, p -= lr * g."""

    def __init__(self, params: Iterable[Any], lr: float, momentum: float = 0.0, **foreign: Any) -> None:
        if foreign:  # torch.optim's keywords, by habit: spmdsim's values pass
            take_foreign(type(self).__name__, foreign, PYTORCH_KEYWORDS)
        super().__init__(params, lr)
        self.momentum = momentum  # checked by _momentum
        self._moments = 1 if self.momentum else 0
        self.buffers: dict[int, np.ndarray] = {}
        self._dry_buffers: dict[int, int] = {}  # a dry run's `buffers`: index -> its bytes

    def _dry_step(self, found: list) -> tuple[int, ...]:
        if self.momentum:  # a buffer per parameter, a copy of its first gradient
            for i, _, grad in found:
                self._dry_buffers.setdefault(i, grad.nbytes)
        return (sum(self._dry_buffers.values()),)

    _hyper = ("lr", "momentum")

    def _state_items(self) -> dict:
        return {i: {"momentum_buffer": buf} for i, buf in sorted(self.buffers.items())}

    def _entry_spec(self, key: int) -> dict:
        block = self.params[key].local  # the buffer is the first gradient's copy: float32 under bf16-mixed
        dtypes = (block.dtype, np.dtype(np.float32)) if is_low(block.dtype) else (block.dtype,)
        return {"momentum_buffer": (block.shape, dtypes)}

    def _load(self, entries: dict) -> None:
        loaded = {i: _into(self.buffers.get(i), e["momentum_buffer"]) for i, e in entries.items()}
        self.buffers.clear()
        self.buffers.update(loaded)

    def _update(self, index: int, param: np.ndarray, grad: np.ndarray) -> None:
        if self.momentum:
            buf = self.buffers.get(index)
            buf = grad.copy() if buf is None else np.add(buf * self.momentum, grad, out=buf)
            self.buffers[index] = buf
            grad = buf
        param -= np.asarray(self.lr, param.dtype) * grad


class Adam(_Optimizer):
    """Adam (Kingma and Ba; PyTorch's defaults): moments per shard, bias-corrected step."""

    _moments = 2  # m and v

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple = (0.9, 0.999),
                 eps: float = 1e-8, **foreign: Any) -> None:
        if foreign:  # torch.optim's keywords, by habit: spmdsim's values pass
            take_foreign(type(self).__name__, foreign, PYTORCH_KEYWORDS)
        super().__init__(params, lr)
        self.betas, self.eps = _adam_args(betas, eps)
        self.moments: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}
        self._dry_moments: dict[int, int] = {}  # a dry run's `moments`: index -> the bytes of both

    def _dry_step(self, found: list) -> tuple[int, ...]:
        for i, param, _ in found:  # two arrays like the parameter
            self._dry_moments.setdefault(i, 2 * param.nbytes)
        return (sum(self._dry_moments.values()),)

    _hyper = ("lr", "betas", "eps")

    def _state_items(self) -> dict:
        return {i: {"step": t, "exp_avg": m, "exp_avg_sq": v} for i, (m, v, t) in sorted(self.moments.items())}

    def _entry_spec(self, key: int) -> dict:
        block = self.params[key].local
        return {"step": int, "exp_avg": (block.shape, (block.dtype,)), "exp_avg_sq": (block.shape, (block.dtype,))}

    def _load(self, entries: dict) -> None:
        loaded = {}
        for i, e in entries.items():
            m, v, _ = self.moments.get(i) or (None, None, 0)
            loaded[i] = (_into(m, e["exp_avg"]), _into(v, e["exp_avg_sq"]), e["step"])
        self.moments.clear()
        self.moments.update(loaded)

    def _update(self, index: int, param: np.ndarray, grad: np.ndarray) -> None:
        b1, b2 = self.betas
        m, v, t = self.moments.get(index) or (np.zeros_like(param), np.zeros_like(param), 0)
        m *= b1
        m += (1 - b1) * grad
        v *= b2
        v += (1 - b2) * grad * grad
        t += 1  # this parameter's steps (as AdamW counts them): a replayed update counts its own
        self.moments[index] = (m, v, t)
        step = self.lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        param -= (step * m / (np.sqrt(v) + self.eps * math.sqrt(1 - b2**t))).astype(param.dtype)
