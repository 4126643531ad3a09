"""One rank's training step of the unpipelined GPT trainer (spmdsim.models.gpt.train): its optimizer, its
gradient buffer, the memory looks it takes and the step the trainer's loop runs, captures or replays."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from ...base.buffers import owned_bytes
from ...nn.autograd import kept_bytes
from ...nn.autograd.engine import backward
from ...nn.autograd.grad_buffer import GradBuffer
from ...nn.optim import AdamW, DistributedAdamW, clip_grad_norm_
from ...runtime.replay import Scalar, capture
from .buckets import _zero_axes, dp_bucket, zero_options
from .fp8_block import settle
from .params import decays
from .step_looks import _look, _look_blocks, _look_walk, _report, _steady


def _optimizer(cfg: Any, model: Any, mesh: Any, specs: list, zero: int) -> Any:
    """AdamW over the model's parameters, or with `zero` DistributedAdamW sharded over the mesh's data axes."""
    params = [model.params[s.name] for s in specs]
    decaying = [model.params[s.name] for s in specs if decays(s)]
    if zero:
        return DistributedAdamW(params, mesh, _zero_axes(mesh), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                weight_decay=cfg.weight_decay, decay=decaying, clip_grad=cfg.clip,
                                **zero_options(zero, params, mesh))
    return AdamW(params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay, decay=decaying)


class _StepRun:
    """The step `train` runs each iteration (`step`), eagerly, captured at its first call or replayed, and
    with `memory` the bytes it looked at (`report`)."""

    def __init__(self, cfg: Any, model: Any, optimizer: Any, params: list, mesh: Any, zero: int,
                 memory: bool, fsdp: bool = False) -> None:
        self.cfg, self.model, self.optimizer, self.params, self.zero, self.memory = (cfg, model, optimizer, params,
                                                                                   zero, memory)
        self.moments: dict = {}  # with `memory`: the totals this step, by moment, and what the graph kept
        self.norms: list = []  # with clip: each step's norm before clipping
        self.graph: Any = None  # with replay: the captured first step
        self.captured: dict = {}  # with replay and `memory`: the captured step's moments, kept
        self.last_report: Any = None
        moments, kept = self.moments, [None]  # (kept: the walk's looks' gradient buffers' owners, _look_walk's)
        if memory and zero:  # a look in the backward: ZeRO-2's before each bucket's Reduce_scatter frees its
            # gradients, ZeRO-1's as each parameter's gradient goes into its main gradient
            optimizer.watch = lambda grads: _look_walk(moments, optimizer, params, grads, None, kept)
        # ZeRO-0's gradient buffer (Megatron DDP's): each bucket's gradients in one flat block the walk writes them
        # into, summed there in place; its look in the backward at each stop of the walk and before each Allreduce
        # (FSDP's gradients arrive reduce-scattered onto the shards: no buffer, nothing left pending)
        self.fsdp = fsdp
        self.sums = sums = None if zero or fsdp else GradBuffer(params, dp_bucket(params, mesh))
        if memory and sums is not None:
            sums.watch = lambda grads: _look_walk(moments, optimizer, params, grads, sums, kept)
            sums.watch_blocks = lambda blocks: _look_blocks(moments, params, blocks, sums)

    def look(self, moment: str, kept: Optional[dict] = None) -> None:
        if self.memory:
            _look(self.moments, moment, self.optimizer, self.params, kept, self.sums)

    def train_step(self, xd: Any, yd: Any, step: Any) -> Any:
        optimizer, params, sums = self.optimizer, self.params, self.sums
        optimizer.zero_grad()
        loss = self.model.loss(xd, yd, step)
        if self.fsdp:  # the gathered blocks the graph holds for backward (the root's; without resharding, all)
            self.gathered_kept = self.model.fsdp.held
        self.look("after the forward", kept_bytes([loss], exclude=params) if self.memory else None)
        if self.zero:  # the dp sums left to the optimizer's Reduce_scatter: ZeRO-2's in the walk as each bucket
            # fills; ZeRO-1's in the step, each gradient put into its main gradient in the walk once it is final
            backward(loss, keep_pending=params, reduce_with=optimizer)
        elif self.fsdp:  # each gradient reduce-scattered by its gather's conjugate in the walk
            backward(loss)
            if self.cfg.clip:
                self.norms.append(clip_grad_norm_(params, self.cfg.clip))
        else:  # each gradient into its bucket's block as the walk gives it; each bucket one Allreduce after it
            backward(loss, keep_pending=params, reduce_with=sums if sums.buckets else None)
            sums.reduce()
            if self.cfg.clip:  # the joint norm: one Allreduce of one number
                self.norms.append(clip_grad_norm_(params, self.cfg.clip))
        settle(self.model)  # FP8's amaxes agreed, its scales made for the next step (nothing without FP8)
        self.look("after the backward")
        optimizer.step()
        self.look("after the step")
        return loss

    def step(self, xd: Any, yd: Any, step: int, replay: bool) -> Any:
        """The step's loss: run eagerly; with `replay` captured at the first call and replayed after."""
        if not replay:
            return self.train_step(xd, yd, step)
        if self.graph is None:  # the same step as eager, recorded
            self.graph = capture(self.train_step, xd, yd, Scalar(step), state=self.params)
            return self.graph.result
        return self.graph(xd, yd, step)

    def report(self, step: int, replay: bool) -> Any:
        """With `memory`, the MemoryReport of the step just run (the last one made where this step looked at
        nothing); else None."""
        if self.memory and self.moments:
            self.last_report = _report(step, self.moments, owned_bytes(p.local for p in self.params))
            if self.fsdp:  # the most gathered bytes held at once in the step (spmdsim.nn.fsdp.FullyShard); a
                # replayed step's are its captured step's
                self.gathered = {"gathered": self.model.fsdp.most, "gathered_kept": self.gathered_kept}
                self.last_report = replace(self.last_report, **self.gathered)
            if replay:  # a replayed step runs no Python to look: the captured step's moments, kept
                self.captured = dict(self.moments)
            self.moments.clear()
        elif self.memory and replay and step:  # the captured step's looks as any later step's (`_steady`)
            self.last_report = replace(_report(step, _steady(self.captured), owned_bytes(p.local for p in self.params)),
                                       **(self.gathered if self.fsdp else {}))
        return self.last_report
