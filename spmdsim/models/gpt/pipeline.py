"""The GPT trained over a pipeline: stages on a "pp" mesh axis, each running its schedule's program.

Mesh ``Layout((pp, dp, tp), ("pp", "dp", "tp"))``: the ranks of one pp
coordinate are a stage, a (dp, tp) mesh of their own on which the stage's
model chunks (spmdsim.models.gpt.stages) hold their parameters as the unpipelined
GPT does (Megatron's tensor-parallel splits, sp optional). A step splits the
batch into m microbatches and runs the stage's program of the schedule
(spmdsim.programs.pipeline: GPipe, 1F1B, interleaved 1F1B; built and checked before
anything runs): a forward or backward of one microbatch through one chunk,
and the activations and their gradients between stages as point-to-point
messages over the pp group (a Messages record the executor posts: each rank
sends its own block to the rank of the same (dp, tp) place in the next stage,
so with sequence parallelism a boundary moves s*b*h/tp per rank, as Megatron
sends it; without it, where tp divides the sequence, each rank sends its
tp-th of the replicated block and the receiving stage all-gathers it over tp,
Megatron's scatter/gather, so the boundary still moves s*b*h/tp per rank). The last chunk's loss is scaled
by 1/m; the gradients stay pending sums over the microbatches (autograd's ``keep_pending``), added into the
gradient buffer (spmdsim.nn.autograd.grad_buffer) as each walk gives them, and are summed once after the flush (an
Allreduce in place a bucket of spmdsim.models.gpt.buckets.buckets(mesh) elements, as Megatron reduces once per step);
the tied embedding's two copies (first and last stage) then add their
gradients by one exchange (Megatron's embedding group); then AdamW.

With MoE layers (``cfg.moe``, spmdsim.models.moe) the mesh is ``Layout((pp, dp, ep,
tp), ("pp", "dp", "ep", "tp"))`` and each stage the (dp, ep, tp) mesh the
unpipelined MoE GPT runs on: the batch split over dp x ep, a stage's MoE
layers exchanging tokens over its own ep groups, their experts' gradients
summed over dp alone. Each MoE layer's router losses are those of its
microbatch, scaled by 1/m as the loss is, and attached to its chunk's output
(spmdsim.models.gpt.parallel.GPT.chunk_blocks: Megatron's MoEAuxLossAutoScaler), so
the stage that holds the layer differentiates them in that microbatch's
backward; the step's loss adds every stage's.

Checked every step as the unpipelined training is (spmdsim.models.gpt.train): the same step in one numpy process,
microbatch by microbatch (each microbatch draws its own dropout masks, spmdsim.models.gpt.params.dropout_seed), from
every stage's parameters at the start of the step, compared on every rank.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ...base import buffers
from ...layouts.layout import Layout
from .config import GPTConfig
from .data import batch
from .params import decays, param_specs
from .stages import chunk_parts
from .train import StepResult
from .wholes import assemble
from ..axes import PIPELINE, model_layout, roles_of, tensor_entry
from . import parallel
from ...base.precision import precision as get_precision
from ...nn import ops
from ...nn.autograd.grad_buffer import GradBuffer
from ...nn.distrib_optim import DistributedAdamW
from ...nn.optim import AdamW, clip_grad_norm_
from ...programs.pipeline.schedule import build
from ...runtime.dtensor import DTensor
from ...runtime.mesh import Mesh
from ...runtime.replay import Scalar, capture
from ...runtime.sim import dry_run_active
from ...runtime.sim.dry import differ
from ...runtime.trace import collect_trace
from .checkpoint import load, save as save_checkpoint, with_first_loss
from .fp8_block import settle
from .tolerances import tolerances as mixed_tolerances
from .stage_program import _Clock, _run_program, _tie_embedding, PipelineRun
from .reference_step import Overflows
from .step_check import UNCHECKED, _norm, agreed_overflow, router_weights, stop_if_diverged
from .buckets import _zero_axes, dp_bucket, zero_options
from .step_looks import _expert_bytes
from .stage_check import _PipelineChecker, _stage_regions, _table
from .pipeline_problems import refuse_pipelined
from .checkpoint_lock import releases_save_lock
from .context import Context
from .mesh import zero_cut
from ...runtime import debug_calls
from ...runtime.door import untraced
from ...runtime.engines.wait import polite_wait
from .stage_memory import _Most
from .stage_program import _largest, _on_mesh

__all__ = ["train_pipelined"]


@releases_save_lock
def train_pipelined(cfg: GPTConfig, comm: Any, pp: int, dp: int, tp: int, steps: int, text_ids: np.ndarray,
                    sp: bool = False, schedule: str = "1f1b", microbatches: int = 1, virtual: int = 1,
                    split: Optional[Sequence[int]] = None, check: bool = True,
                    on_step: Optional[Callable[[StepResult], Any]] = None,
                    layouts: Optional[dict] = None, recompute: str = "none", zero: int = 0,
                    memory: bool = False, kept: str = "graph", ep: int = 1,
                    algorithms: Optional[dict] = None, replay: bool = False,
                    precision: Any = "fp64", save: Optional[str] = None, save_every: int = 0,
                    resume: Optional[str] = None, cp: int = 1,
                    context: Optional[Context] = None) -> tuple[PipelineRun, list]:
    """Train `steps` steps on a (pp, dp, tp) mesh over `comm`; returns (the run, one StepResult per step run).

    Collective: every rank calls it alike. `schedule`: "gpipe", "1f1b" or "interleaved" (with `virtual`
    chunks per stage); `split`: layers per chunk (default balanced). `recompute` and `zero` as
    train.train's, on each stage (ZeRO-1: each stage's optimizer sharded over its dp ranks; ZeRO-3 each chunk's
    parameters, resharded after forward); `memory`: each step's bytes on this rank into StepResult.memory,
    kept-for-backward bytes at the moment the schedule held the most (spmdsim.models.gpt.memory.MemoryReport); `kept`:
    "graph" or "megatron" (spmdsim.models.gpt.parallel.GPT's). `ep`: with MoE layers (cfg.moe), the expert-parallel
    ranks of each stage: the mesh is (pp, dp, ep, tp) (see the module docstring; StepResult.dispatch and .experts as
    spmdsim.models.gpt.train.train's, over the step's microbatches, ranks numbered on the whole mesh).
    `algorithms`: the meshes' emulated algorithms (spmdsim.runtime.mesh.Mesh's). `replay`: step 0 is
    captured (spmdsim.runtime.replay: its computes, collectives and point-to-point messages) and every later
    step replays it, checked the same way (MoE layers and `cfg.clip` too; with `memory` a replayed step reports
    what the step run eagerly reports). `cp`, `context`: context parallelism in each stage, as train.train's.
    `precision`: the policy (as train.train's; activations and their gradients cross stage boundaries in its
    activation dtype, as Megatron sends them). `save`, `save_every` and `resume`: checkpoints as train.train's
    (the metadata records the pipeline's shape too). Every refusal is raised alike on every rank before the
    first collective.
    """
    contexts = (cp, context)
    meta = refuse_pipelined(cfg, comm, pp, dp, tp, steps, text_ids, sp, schedule, microbatches, virtual, split, check,
                            layouts, recompute, zero, kept, ep, replay, precision, save, save_every, resume, contexts)
    policy = get_precision(precision)
    st = _Pipelined(cfg, comm, pp, dp, tp, sp, schedule, microbatches, virtual, split, layouts, recompute, zero, kept,
                    ep, algorithms, policy, memory, contexts)
    run, mesh, params, optimizer, zero = st.run, st.run.mesh, st.params, st.optimizer, st.zero  # (ZeRO-3's: 0)
    check = check and not dry_run_active()
    first = 0
    if resume is not None:  # this rank's blocks and optimizer state (collective: the ranks agree on a problem)
        first = load(resume, mesh, params, optimizer, st.scales, meta, st.layers)
    checker = _PipelineChecker(st, cfg, policy, zero, kept, microbatches, first) if check else None
    replay = replay and not dry_run_active()  # a dry run's steps count bytes: nothing to replay
    results: list = []
    graph, overflows = None, Overflows()
    for step in range(first, steps):
        if mesh.engine.dry:  # shapes only: the ids' values are never read (each representative would
            x = y = buffers.lazy_zeros((cfg.batch, cfg.seq), np.int64)  # gather a 50 MB batch at 1T)
        else:
            x, y = batch(text_ids, cfg, step)
        if checker is not None:
            checker.start()
        given = st.begin(x, y, replay, graph is None)
        with collect_trace() as trace, overflows.at(step):  # an overflow: one line, not numpy's warnings
            if not replay:
                losses = st.step(step)
            elif graph is None:  # the same step as eager, recorded
                graph = capture(st.step, Scalar(step), *given, state=st.tensors)
                losses = graph.result
            else:
                losses = graph(step, *given)
            losses = [float(ops.resolved(loss).local) for loss in losses]
        value, watch = st.finish(trace, losses), st.ran["watch"]
        stop_if_diverged(step, value, params, cfg.lr, optimizer=optimizer, weights=router_weights(cfg))
        *errors, flip, rounding = UNCHECKED if checker is None else checker.errors(value, x, y, step)
        totals, (dispatch, ledger) = trace.totals(), st.experts(trace)
        result = StepResult(step, value, tuple(errors), totals["calls"], totals["bytes_sent"],
                            st.memory_report(watch, step, replay and step > 0), dispatch, ledger,
                            mixed_tolerances(policy, cfg), _norm(optimizer if zero else None, st.norms), flip,
                            rounding, None if checker is None else checker.overflow)
        results.append(result)
        if on_step is not None:
            on_step(result)
        if save is not None and (step + 1 == steps or save_every and (step + 1) % save_every == 0):
            save_checkpoint(save, with_first_loss(meta, resume, results), step + 1, mesh, params, optimizer, st.scales)
    return run, results if checker is not None else agreed_overflow(mesh.comm, overflows, results, policy)


class _Pipelined:
    """A stage's part of `train_pipelined`: its meshes, chunks' models, parameters and optimizer, and its step
    (`step`: the program, the gradients' sums, the tied table, clipping, the update), which a replay captures."""

    def __init__(self, cfg: GPTConfig, comm: Any, pp: int, dp: int, tp: int, sp: bool, schedule: str,
                 microbatches: int, virtual: int, split: Optional[Sequence[int]], layouts: Optional[dict],
                 recompute: str, zero: int, kept: str, ep: int, algorithms: Optional[dict], policy: Any,
                 memory: bool, contexts: tuple = (1, None)) -> None:
        moe = cfg.moe is not None or ep != 1
        cp, context = contexts
        cp_axis = cp if cp > 1 or context is not None else None
        plan = build(schedule, pp, microbatches, virtual)
        chunks = pp * virtual
        self.last = last = chunks - 1
        parts = chunk_parts(cfg, chunks, split)
        inner = model_layout(tp, dp, ep if moe else None, cp=cp_axis, etp=cfg.expert_tp)  # a stage's mesh
        outer = model_layout(tp, dp, ep if moe else None, pp, cp=cp_axis, etp=cfg.expert_tp)
        cut = zero_cut(zero)  # ZeRO-3's shards cut as FSDP2's
        mesh = Mesh(Layout(*outer, cut), comm, algorithms=algorithms, roles=roles_of(outer[1]))
        differ(mesh, (PIPELINE,))  # a dry run runs one rank per stage: the stages' work differs
        self.stage = stage = mesh.coord(PIPELINE)
        self.stage_mesh = stage_mesh = Mesh(Layout(*inner, cut), mesh.group(inner[1]), algorithms=algorithms,
                                            roles=roles_of(inner[1]))
        self.pp_comm = mesh.group(PIPELINE) if pp > 1 else None
        self.mine = mine = [c for c in range(chunks) if c % pp == stage]
        self.models = models = {c: parallel.GPT(cfg, stage_mesh, sp=sp, layouts=layouts, part=parts[c],
                                                recompute=recompute, kept=kept, precision=policy,
                                                context=context, fsdp=True if zero == 3 else None) for c in mine}
        # FP8's scales, each chunk's, and its layers (a checkpoint saves them; a resharded resume builds them by key)
        self.scales = tuple(models[c].fp8 for c in mine if models[c].fp8 is not None)
        self.layers = tuple(range(parts[c].first, parts[c].stop) for c in mine if models[c].fp8 is not None)
        if 0 in models and chunks - 1 in models and chunks > 1 and cfg.tied:  # one stage holds both ends: one table
            models[chunks - 1].params["wte"] = models[0].params["wte"]
        self.params = params = {}
        for spec in param_specs(cfg):
            for c in mine:
                if spec.name in models[c].params:
                    params.setdefault(spec.name, models[c].params[spec.name])
        self.tensors = list(params.values())
        # this stage holds one copy of the tied table
        self.ends = (0 in models) != (last in models) and pp > 1 and cfg.tied
        self.cfg, self.pp, self.microbatches, self.zero, self.memory, self.fsdp = cfg, pp, microbatches, zero % 3, \
            memory, zero == 3  # ZeRO-3: each chunk's GPT fully sharded (spmdsim.nn.fsdp), AdamW on its shards
        self.optimizer, self.sums = self._optimizer(cfg, mesh, self.zero)
        self.run = PipelineRun(plan, parts, stage, models, mesh, stage_mesh, params, [], [])
        self.micro = micro = cfg.batch // microbatches
        self.shape = (cfg.seq, micro, cfg.d_model)
        any_model = models[mine[0]]
        self.act = act = any_model.act  # (T, B, D) between blocks
        # What crosses a stage boundary: the sequence's tp-th (Megatron's scatter/gather without sp, which
        # the receiving stage all-gathers over tp), else the block itself.
        self.wire = stage_mesh.layout(tensor_entry(inner[1]), any_model.batch, None) \
            if not sp and tp > 1 and cfg.seq % tp == 0 and cp_axis is None \
            else act
        self.ids_layout = any_model.ids  # (B, T): the batch over dp, the sequence over cp
        self.laid = any_model.laid  # the sequences' order
        self.ids_shape = self.ids_layout.check_shape((micro, cfg.seq))  # a microbatch's ids, this rank's rows:
        self.ids_cut = self.ids_layout.slices(stage_mesh.rank, self.ids_shape)  # as DTensor.from_global cuts them
        self.wire_dtype = np.dtype(policy.dtype("activation"))  # what crosses a stage boundary, both ways
        self.norms: list = []  # with clip (and not ZeRO-1): each step's norm before clipping
        self.clock = _Clock()  # each cell's start and end, stamped by a kernel: a replayed step stamps them again
        self.ran: dict = {}  # what the step's Python found (order, held, watch): a replayed step's are the capture's
        self.groups: dict = {}  # each message group's step record (a Messages), made in the first step
        self.found: dict = {}  # what `_run_program` found in the earlier steps (its program as tuples, layouts)
        self.x = self.y = None  # the step's batch, cut into microbatches when not replaying

    def _optimizer(self, cfg: GPTConfig, mesh: Any, zero: int) -> tuple:
        """The stage's optimizer and, without ZeRO, its gradient buffer."""
        params, tensors, stage_mesh, ends = self.params, self.tensors, self.stage_mesh, self.ends
        decaying = [params[s.name] for s in param_specs(cfg) if s.name in params and decays(s)]
        # Clipping's joint norm: every stage's squares summed over pp, the tied table's counted on the first stage.
        self.counted = counted = [t for name, t in params.items()
                                  if not (name == "wte" and ends and self.stage == self.pp - 1)]
        if zero:  # each stage's states and master copy sharded over its dp ranks (and ep's: spmdsim.nn.distrib_optim)
            optimizer = DistributedAdamW(tensors, stage_mesh, _zero_axes(stage_mesh), lr=cfg.lr, betas=cfg.betas,
                                         eps=cfg.eps, weight_decay=cfg.weight_decay, decay=decaying,
                                         clip_grad=cfg.clip, clip_across=(mesh, (PIPELINE,)), clip_counted=counted,
                                         **zero_options(zero, tensors, stage_mesh))
        else:
            optimizer = AdamW(tensors, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                              decay=decaying)
        # ZeRO-0's gradient buffer (Megatron DDP's): every microbatch's gradients added into it as the walk gives
        # them, each bucket summed there in place once a step
        sums = None if zero or self.fsdp else GradBuffer(tensors, dp_bucket(tensors, stage_mesh))
        if zero == 2:  # the buckets of a parameter whose gradient changes after a chunk's last backward, reduced
            # in the step: the tied table's, which gets the other end's after the backward (`ends`), or one that
            # two of this stage's chunks read (both ends on one stage)
            optimizer.reduce_after([t for name, t in params.items() if name == "wte" and ends
                                    or sum(name in self.models[c].params for c in self.mine) > 1])
        return optimizer, sums

    def step(self, when: Any, *given: Any) -> list:
        """One step: the stage's program, the gradients' sums, the tied table, clipping, the update; the
        microbatches' losses (DTensors, the router losses too). `given`: the microbatches' ids this stage
        reads (inputs, then targets) as DTensors, when replaying; else each is cut from the batch when used."""
        optimizer, sums, tensors, run, microbatches = (self.optimizer, self.sums, self.tensors, self.run,
                                                       self.microbatches)

        def ids(which: int, mb: int) -> Any:
            if given:
                return given[mb if which == 0 else len(given) - microbatches + mb]
            # DTensor.from_global's block (an int64 batch's rows: nothing to check), without its checks
            rows = (self.x, self.y)[which][mb * self.micro:(mb + 1) * self.micro]
            return DTensor._trusted(self.stage_mesh, buffers.placed_copy(rows[self.ids_cut]), self.ids_layout,
                                    self.ids_shape)

        optimizer.zero_grad()
        copies = (lambda c: [q for _, q, _ in self.models[c].fp8.weights.values()]) if any(
            m.fp8 is not None for m in self.models.values()) else None
        watch = self.ran["watch"] = _Most(optimizer, tensors, sums, copies) if self.memory else None
        if watch is not None and self.zero:  # a look in the backward (ZeRO-2: before each bucket's Reduce_scatter)
            optimizer.watch = watch.walk
        elif watch is not None and sums is not None:  # ZeRO-0: as the walk fills the buffer, and before each sum
            sums.watch, sums.watch_blocks = watch.walk, watch.sums
        losses, self.ran["order"], self.ran["held"] = _run_program(
            run, run.schedule.programs[self.stage], ids, when, microbatches, self.last, self.shape, self.act,
            self.wire, self.pp_comm, [] if self.fsdp else tensors, self.clock, watch, self.groups, self.wire_dtype,
            self.found, optimizer if self.zero else sums if sums is not None and sums.buckets else None)
        if sums is not None:  # with ZeRO-1 the dp sums are the optimizer's Reduce_scatter; ZeRO-3's, in the walk
            sums.reduce()  # dp (and sp's LayerNorm) sums: once per step, each bucket in place in its block
        if self.ends:
            _tie_embedding(run, self.params["wte"], 0 if self.stage == self.pp - 1 else self.pp - 1, self.pp_comm,
                           self.groups)
        if self.cfg.clip and not self.zero:  # the joint norm over every stage; the tied table counted once
            self.norms.append(clip_grad_norm_(tensors, self.cfg.clip, across=(run.mesh, (PIPELINE,)),
                                              counted=self.counted))
        for c in self.mine:  # FP8's amaxes of every microbatch agreed over the stage, each chunk's scales made
            settle(self.models[c])
        if watch is not None:
            watch.look("after the backward")
        optimizer.step()
        if watch is not None:
            watch.look("after the step")
        return losses

    def finish(self, trace: Any, losses: list) -> float:
        """After a step: what it ran into the run (order, held, cells, trace); the step's loss on every rank."""
        run, mesh, clock = self.run, self.run.mesh, self.clock
        order, held = self.ran["order"], self.ran["held"]
        # The stages made different numbers of collectives on their own groups: the ranks' call counters
        # (what SPMDSIM_CHECK and the watchdog's reports compare) agree again from here, hooks on or off.
        debug_calls.agree(mesh.comm, mesh.layout.alias_name, mesh.polite, always=True)
        run.orders.append(order)
        run.in_flight.append(held)
        run.times, run.trace = tuple(clock.times), trace  # (the clock is emptied before the next step)
        # The loss: the last stage's sum of its microbatches' scaled losses and every stage's router losses
        # (each microbatch's, scaled alike), to every rank, for the check and the printed row: not the step's
        # (Megatron's stages keep theirs), so untraced, as the check's own traffic is not the step's either. A
        # dry run then counts what the real run's rows count (it counted this Allreduce, one call and 8 bytes
        # more than the row of the same rank).
        value = float(sum(losses))
        if self.pp > 1:
            total = np.array([value])
            untraced(mesh.group(PIPELINE), mesh.engine.all_reduce, total, total, "sum",
                     wait=polite_wait if mesh.polite else None)
            value = float(total[0])
        return value

    def memory_report(self, watch: Any, step: int, replayed: bool) -> Any:
        """The step's MemoryReport (None without `memory`); under ZeRO-3 with the most parameters gathered at once
        in any of the stage's chunks (spmdsim.nn.fsdp.FullyShard.most: a layer's, gathered for its forward or
        backward and freed after it), as the unpipelined step reports them; none the graph keeps (a
        microbatch's root, which its graph holds, is in the kept bytes: GPT._root)."""
        if watch is None:
            return None
        report = watch.report(step, replayed)
        if self.fsdp:
            report = replace(report, gathered=max(self.models[c].fsdp.most for c in self.mine), gathered_kept=0)
        return report

    def begin(self, x: np.ndarray, y: np.ndarray, replay: bool, first: bool) -> tuple:
        """Before a step on the batch (x, y): the MoE layers' figures emptied (a replay's kernels rewrite the
        captured step's list), the clock too; with `replay` the capture's static inputs, every microbatch's ids
        this stage reads, as DTensors (else none: the step cuts each from the batch when used); the sequences laid
        out in the stages' order (context parallelism's)."""
        if not self.stage_mesh.engine.dry:  # (a dry run's ids are lazy zeros: in any order the same)
            x, y = x[self.laid], y[self.laid]
        for model in self.models.values():
            if not replay or first:
                model.moe_stats = []
        given = ()
        if replay:
            micro, models = self.micro, self.models
            given = tuple(DTensor.from_global(self.stage_mesh, data[mb * micro:(mb + 1) * micro], self.ids_layout,
                                              verify=False)
                          for data, reads in ((x, 0 in models), (y, self.last in models)) if reads
                          for mb in range(self.microbatches))
        self.clock.times.clear()
        self.x, self.y = x, y
        return given

    def experts(self, trace: Any) -> tuple:
        """After a step, with MoE layers: its dispatches, ranks on the whole mesh, and the experts' bytes (else
        ((), None))."""
        if self.cfg.moe is None:
            return (), None
        dispatch = _on_mesh(self.run, [s for c in self.mine for s in self.models[c].moe_stats])
        return dispatch, _expert_bytes(self.cfg, self.run.mesh.rank, self.stage_mesh, self.params,
                                       _largest(dispatch), self.optimizer, trace)


def gathered_stages(run: PipelineRun, cfg: GPTConfig) -> dict:
    """Every parameter whole on every rank: one Allgather over the whole mesh of each rank's blocks (`_table`),
    made whole where `_stage_regions` says each lies."""
    where = _stage_regions(run, cfg)
    return assemble(where, where.used(_table(run, cfg)))[0]
