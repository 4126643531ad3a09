"""The GPT trained over a pipeline: stages on a "pp" mesh axis, each running its schedule's program.

Mesh ``Layout((pp, dp, tp), ("pp", "dp", "tp"))``: the ranks of one pp
coordinate are a stage, a (dp, tp) mesh of their own on which the stage's
model chunks (spmdsim.models.gpt.stages) hold their parameters as the unpipelined
GPT does (Megatron's tensor-parallel splits, sp optional). A step splits the
batch into m microbatches and runs the stage's program of the schedule
(spmdsim.programs.pipeline: GPipe, 1F1B, interleaved 1F1B; built and checked before
anything runs): a forward or backward of one microbatch through one chunk,
and the activations and their gradients between stages as point-to-point
messages over the pp group (spmdsim.runtime.door.point_to_point: each rank
sends its own block to the rank of the same (dp, tp) place in the next stage,
so with sequence parallelism a boundary moves s*b*h/tp per rank, as Megatron
sends it; without it, where tp divides the sequence, each rank sends its
tp-th of the replicated block and the receiving stage all-gathers it over tp,
Megatron's scatter/gather, so the boundary still moves s*b*h/tp per rank). The last chunk's loss is scaled
by 1/m; the gradients stay pending sums over the microbatches (autograd's ``keep_pending``), added into the
gradient buffer (spmdsim.nn.autograd.grad_buffer) as each walk gives them, and are summed once after the flush (an
Allreduce in place a bucket of spmdsim.models.gpt.train.buckets(mesh) elements, as Megatron reduces once per step);
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

Checked every step as the unpipelined training is (spmdsim.models.gpt.train): the
same step in one numpy process, microbatch by microbatch (each microbatch
draws its own dropout masks, spmdsim.models.gpt.params.dropout_seed), from every
stage's parameters at the start of the step, compared on every rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import math
from itertools import repeat as repeat_
from time import perf_counter

import numpy as np

from ...base import buffers
from ...nn.autograd.kept import kept_problem
from ...base.context import current
from ...errors import SpmdsimError
from ...base.flops import holding
from ...layouts.layout import Layout
from .config import GPTConfig
from .data import batch, text_problem
from .memory import MASKS, recompute_problem, zero_problem
from .params import decays, param_specs
from .stages import chunk_parts, pipeline_problem
from .train import (StepResult, _look, _look_blocks, _look_walk, _norm, _report, _steady, anchored_start,
                    anchored_updates, dp_bucket, step_errors)
from .wholes import Regions, assemble, stage_regions

__all__ = ["PipelineRun", "train_pipelined", "pipeline_layout_problem"]


def pipeline_layout_problem(cfg: GPTConfig, pp: int, dp: int, tp: int, sp: bool, microbatches: int,
                            virtual: int = 1, split: Optional[Sequence[int]] = None, ep: int = 1,
                            schedule: Optional[str] = None) -> Optional[str]:
    """Why the GPT cannot train on pp x dp x tp (pp x dp x ep x tp with MoE layers) with `microbatches`
    (one line, alike on every rank), or None. With `schedule` (its name) also why that schedule cannot take
    these sizes (spmdsim.programs.pipeline.schedule.schedule_problem: one chunk per stage but under "interleaved",
    whose microbatches a multiple of pp), so that a trainer refuses them before its first line of output."""
    from ...programs.pipeline.schedule import schedule_problem
    from .layouts import mesh_problem

    for name, value in (("pp", pp), ("microbatches", microbatches), ("virtual stages", virtual)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            return f"{name} {value!r} must be an integer >= 1"
    if virtual > 1 and pp < 2:  # Megatron's interleaving also needs a pipeline: chunk k goes to stage k mod pp
        return (f"virtual stages {virtual} interleave the layers over the pipeline's stages (chunk k on stage k mod "
                f"pp): they need pp 2 or more, got pp {pp}")
    problem = schedule_problem(schedule, pp, microbatches, virtual) if schedule is not None else None
    if problem:
        return problem
    if cfg.batch % microbatches:
        return f"batch {cfg.batch} is not divisible by {microbatches} microbatches"
    micro = cfg.batch // microbatches
    problem = mesh_problem(cfg, dp, tp, sp, ep)
    if problem is None and micro % (dp * ep):
        batch = f"dp {dp} x ep {ep} = {dp * ep}" if ep > 1 else f"dp {dp}"
        problem = f"a microbatch of {micro} samples is not divisible by {batch}"
    return problem or pipeline_problem(cfg, pp * virtual, split)


@dataclass
class PipelineRun:
    """What a pipelined training ran: the stage's chunks and models, and each step's executed cells.

    Attributes:
        schedule: the spmdsim.programs.pipeline Schedule every stage ran; ``parts``: each chunk's (stages.Part).
        stage: this rank's stage; ``models``: chunk -> its GPT part on the stage's mesh.
        mesh: the whole (pp, dp, tp) mesh; ``stage_mesh``: this stage's (dp, tp) mesh (with MoE layers
            (pp, dp, ep, tp) and (dp, ep, tp)).
        orders: per step, the Compute records this rank ran, in order (what a timeline is made from).
        in_flight: per step, the most microbatch-chunks whose activations this rank held at once.
        cells: the last step's cells as trace spans: (name, start, end) in perf_counter seconds.
        trace: the last step's trace (spmdsim.runtime.trace: collectives and messages).
    """

    schedule: Any
    parts: tuple
    stage: int
    models: dict
    mesh: Any
    stage_mesh: Any
    params: dict
    orders: list
    in_flight: list
    cells: list = field(default_factory=list)
    trace: Any = None

    def timeline(self, step: int = -1) -> Any:
        """The unit-cost timeline (spmdsim.programs.pipeline.timeline) of what every stage ran at `step`: each
        stage's executed order gathered from its first rank (collective over the whole mesh)."""
        from ...programs.pipeline.timeline import timeline
        from ...runtime.door import all_gather_object

        orders = all_gather_object(self.mesh.comm, self.orders[step])[::self.stage_mesh.size]
        return timeline(self.schedule.stages, orders, self.schedule.virtual)

    def held(self, step: int = -1) -> tuple[int, ...]:
        """Per stage, the most microbatch-chunks whose activations it held at once at `step` (collective)."""
        from ...runtime.door import all_gather_object

        return tuple(all_gather_object(self.mesh.comm, self.in_flight[step])[::self.stage_mesh.size])

    def write_trace(self, path: str) -> None:
        """The last step as a Chrome/Perfetto trace: one track per rank with its messages and collectives,
        and a second with its pipeline cells (F3, B3; chunk after a dot when v > 1). Collective."""
        from ...runtime.trace_export import write_chrome_trace

        start = min((c[1] for c in self.cells), default=None)
        write_chrome_trace(self.mesh.comm, self.trace, path, start=start, spans=self.cells,
                           span_track="pipeline cells")

    def close(self) -> None:
        self.stage_mesh.close()
        self.mesh.close()


_PP = ("pp",)  # the messages' axes, normalized once (runtime.door.point_to_point takes a tuple as it is)


def _tag(what: str, chunk: int) -> int:
    """A message's tag: its kind and the chunk that sent it. Messages between two ranks with one tag match
    in the order posted, and every checked schedule posts each kind's receives in the order the peer
    sends (GPipe's gradients go in reverse microbatch order on both sides; spmdsim.programs.pipeline.check)."""
    return 2 * chunk + (what == "grad")


def train_pipelined(cfg: GPTConfig, comm: Any, pp: int, dp: int, tp: int, steps: int, text_ids: np.ndarray,
                    sp: bool = False, schedule: str = "1f1b", microbatches: int = 1, virtual: int = 1,
                    split: Optional[Sequence[int]] = None, check: bool = True,
                    on_step: Optional[Callable[[StepResult], Any]] = None,
                    layouts: Optional[dict] = None, recompute: str = "none", zero: int = 0,
                    memory: bool = False, kept: str = "graph", ep: int = 1,
                    algorithms: Optional[dict] = None, replay: bool = False,
                    precision: Any = "fp64", save: Optional[str] = None, save_every: int = 0,
                    resume: Optional[str] = None) -> tuple[PipelineRun, list]:
    """Train `steps` steps on a (pp, dp, tp) mesh over `comm`; returns (the run, one StepResult per step run).

    Collective: every rank calls it alike. `schedule`: "gpipe", "1f1b" or "interleaved" (with `virtual`
    chunks per stage); `split`: layers per chunk (default balanced). `recompute` and `zero` as
    spmdsim.models.gpt.train.train's, on each stage (ZeRO-1: each stage's optimizer sharded over its dp ranks);
    `memory`: each step's bytes on this rank into StepResult.memory, kept-for-backward bytes at the
    moment the schedule held the most (spmdsim.models.gpt.memory.MemoryReport); `kept`: "graph" or "megatron"
    (spmdsim.models.gpt.parallel.GPT's). `ep`: with MoE layers (cfg.moe), the expert-parallel ranks of each stage:
    the mesh is (pp, dp, ep, tp) (see the module docstring; StepResult.dispatch and .experts as
    spmdsim.models.gpt.train.train's, over the step's microbatches, ranks numbered on the whole mesh).
    `algorithms`: the meshes' emulated algorithms (spmdsim.runtime.mesh.Mesh's). `replay`: step 0 is
    captured (spmdsim.runtime.replay: its computes, collectives and point-to-point messages) and every later
    step replays it, checked the same way (MoE layers and `cfg.clip` too;
    with `memory` a replayed step reports what the step run eagerly reports: spmdsim.models.gpt.train._steady).
    `precision`: the policy (as spmdsim.models.gpt.train.train's: the stages compute under it, activations and their
    gradients cross stage boundaries in its activation dtype, bfloat16 at bf16-mixed, as Megatron sends them;
    the check's reference is the policy's, microbatch by microbatch). `save`, `save_every` and `resume`: checkpoints
    as spmdsim.models.gpt.train.train's (each rank's file holds its stage's blocks; the metadata records the pipeline's
    schedule, microbatches, chunks and split too). Every refusal is raised alike on every rank before the first
    collective.
    """
    from ...nn import ops
    from ...nn.autograd.grad_buffer import GradBuffer
    from ...nn.distrib_optim import DistributedAdamW
    from ...nn.optim import AdamW, clip_grad_norm_
    from ...programs.pipeline.schedule import build
    from ...runtime.engines.wait import polite_wait
    from ...runtime import debug
    from ...runtime.door import untraced
    from ...runtime.dtensor import DTensor  # its operators came with `ops`, just imported
    from ...runtime.mesh import Mesh
    from ...runtime.replay import Scalar, capture
    from ...runtime.trace import collect_trace
    from ...runtime.executor import pending, resolve
    from ...runtime.shared_reference import shared_once
    from ...runtime.sim import dry_run_active, once
    from ...runtime.sim.dry import differ
    from ...base.precision import precision as get_precision, precision_problem
    from .mixed import tolerances as mixed_tolerances
    from .parallel import GPT
    from .train import (_checked_mixed, _checked_reference, _checkpoint_problem, _expert_bytes, _optimizer_start,
                        _resumed_moments, _summed_grads, _zero_axes, _zero_moments, checkpoint_meta, replay_problem,
                        step_memory_problem, zero_options)

    moe = cfg.moe is not None or ep != 1
    problem = (pipeline_layout_problem(cfg, pp, dp, tp, sp, microbatches, virtual, split, ep, schedule)
               or recompute_problem(recompute) or zero_problem(zero) or kept_problem(kept)
               or (replay_problem(cfg) if replay else None) or precision_problem(precision)
               or text_problem(text_ids, cfg))
    if problem:
        where = f"pp {pp} x dp {dp} x ep {ep} x tp {tp}" if moe else f"pp {pp} x dp {dp} x tp {tp}"
        raise SpmdsimError(f"the GPT cannot train on {where}: {problem}")
    meta = None
    if save is not None or resume is not None or save_every:
        shape = {"pp": pp, "schedule": schedule, "microbatches": microbatches, "virtual": virtual, "split": split}
        meta = checkpoint_meta(cfg, comm.Get_size(), dp, tp, sp=sp, layouts=layouts, precision=precision, zero=zero,
                               ep=ep, pipeline=shape)
        problem = _checkpoint_problem(meta, steps, save, save_every, resume)
        if problem:  # every rank alike (each reads the same metadata file), before any collective
            raise SpmdsimError(problem)
    problem = step_memory_problem(cfg, comm, dp, tp, ep=ep, pp=pp, microbatches=microbatches, recompute=recompute,
                                  sp=sp, kept=kept, zero=zero, precision=precision)
    if problem:  # every rank alike (a collective decided it), before any block is made
        raise SpmdsimError(problem)
    policy = get_precision(precision)
    low = policy.activation != "float64"
    if check and low and not dry_run_active():  # every rank alike, before any collective
        from .mixed import architecture_problem

        problem = architecture_problem(cfg)
        if problem:
            raise SpmdsimError(problem)
    plan = build(schedule, pp, microbatches, virtual)
    chunks = pp * virtual
    last = chunks - 1
    parts = chunk_parts(cfg, chunks, split)
    inner = ((dp, ep, tp), ("dp", "ep", "tp")) if moe else ((dp, tp), ("dp", "tp"))  # a stage's mesh
    mesh = Mesh(Layout((pp,) + inner[0], ("pp",) + inner[1]), comm, algorithms=algorithms)
    differ(mesh, ("pp",))  # a dry run runs one rank per stage: the stages' work differs
    stage = mesh.coord("pp")
    stage_mesh = Mesh(Layout(*inner), mesh.group(inner[1]), algorithms=algorithms)
    pp_comm = mesh.group("pp") if pp > 1 else None
    mine = [c for c in range(chunks) if c % pp == stage]
    models = {c: GPT(cfg, stage_mesh, sp=sp, layouts=layouts, part=parts[c], recompute=recompute, kept=kept,
                     precision=policy) for c in mine}
    if 0 in models and chunks - 1 in models and chunks > 1 and cfg.tied:  # one stage holds both ends: one table
        models[chunks - 1].params["wte"] = models[0].params["wte"]
    params: dict = {}
    for spec in param_specs(cfg):
        for c in mine:
            if spec.name in models[c].params:
                params.setdefault(spec.name, models[c].params[spec.name])
    tensors = list(params.values())
    decaying = [params[s.name] for s in param_specs(cfg) if s.name in params and decays(s)]
    ends = (0 in models) != (last in models) and pp > 1 and cfg.tied  # this stage holds one copy of the tied table
    # Clipping's joint norm: every stage's squares summed over pp, the tied table's counted on the first stage.
    counted = [t for name, t in params.items() if not (name == "wte" and ends and stage == pp - 1)]
    if zero:  # each stage's states and master copy sharded over its dp ranks (and ep's: spmdsim.nn.distrib_optim)
        optimizer = DistributedAdamW(tensors, stage_mesh, _zero_axes(stage_mesh), lr=cfg.lr, betas=cfg.betas,
                                     eps=cfg.eps, weight_decay=cfg.weight_decay, decay=decaying, clip_grad=cfg.clip,
                                     clip_across=(mesh, ("pp",)), clip_counted=counted,
                                     **zero_options(zero, tensors, stage_mesh))
    else:
        optimizer = AdamW(tensors, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
                          decay=decaying)
    # ZeRO-0's gradient buffer (Megatron DDP's): every microbatch's gradients added into it as the walk gives
    # them, each bucket summed there in place once a step
    sums = None if zero else GradBuffer(tensors, dp_bucket(tensors, stage_mesh))
    if zero == 2:  # the buckets of a parameter whose gradient changes after a chunk's last backward, reduced in
        # the step: the tied table's, which gets the other end's after the backward (`ends`), or one that two of
        # this stage's chunks read (both ends on one stage)
        optimizer.reduce_after([t for name, t in params.items() if name == "wte" and ends
                                or sum(name in models[c].params for c in mine) > 1])
    run = PipelineRun(plan, parts, stage, models, mesh, stage_mesh, params, [], [])
    check = check and not dry_run_active()
    micro = cfg.batch // microbatches
    shape = (cfg.seq, micro, cfg.d_model)
    any_model = models[mine[0]]
    act = any_model.act  # (T, B, D) between blocks
    # What crosses a stage boundary: the sequence's tp-th (Megatron's scatter/gather without sp, which
    # the receiving stage all-gathers over tp), else the block itself.
    wire = stage_mesh.layout("tp", any_model.batch, None) if not sp and tp > 1 and cfg.seq % tp == 0 else act
    ids_layout = stage_mesh.layout(any_model.batch, None)
    ids_shape = ids_layout.check_shape((micro, cfg.seq))  # a microbatch's ids, this rank's rows of them:
    ids_cut = ids_layout.slices(stage_mesh.rank, ids_shape)  # as DTensor.from_global cuts them
    first = 0
    if resume is not None:  # this rank's blocks and optimizer state (collective: the ranks agree on a problem)
        from .checkpoint import load

        first = load(resume, mesh, params, optimizer)
    if check:  # where every rank's blocks lie, and this rank's, asked once (not per step)
        where = _stage_regions(run, cfg)
        slices = {name: t.slices for name, t in params.items()}
    moments = None
    if check and not low and first:  # the reference's moments: the run's at the checkpoint, whole (collective)
        moments = shared_once(mesh, ("gpt-resumed", cfg, microbatches, first), _resumed_moments, where,
                              where.used(_tables(run, cfg, where, _optimizer_start(optimizer, params), "check.start")))
    elif check and not low:
        moments = once(("gpt-reference", cfg, 0), _zero_moments, cfg)
    wire_dtype = np.dtype(policy.dtype("activation"))  # what crosses a stage boundary, both ways
    replay = replay and not dry_run_active()  # a dry run's steps count bytes: nothing to replay
    results: list = []
    norms: list = []  # with clip (and not ZeRO-1): each step's norm before clipping
    clock = _Clock()  # each cell's start and end, stamped by a kernel: a replayed step stamps them again
    ran: dict = {}  # what the step's Python found (order, held, watch): a replayed step's are the capture's
    described: dict = {}  # each message group's trace description, worked out in the first step (_run_program)
    found: dict = {}  # what `_run_program` found in the earlier steps (its program as tuples, layout objects)

    def pipeline_step(when: Any, *given: Any) -> list:
        """One step: the stage's program, the gradients' sums, the tied table, clipping, the update; the
        microbatches' losses (DTensors, the router losses too). `given`: the microbatches' ids this stage
        reads (inputs, then targets) as DTensors, when replaying; else each is cut from the batch when used."""
        def ids(which: int, mb: int) -> Any:
            if given:
                return given[mb if which == 0 else len(given) - microbatches + mb]
            # DTensor.from_global's block (an int64 batch's rows: nothing to check), without its checks
            rows = (x, y)[which][mb * micro:(mb + 1) * micro]
            return DTensor._trusted(stage_mesh, buffers.placed_copy(rows[ids_cut]), ids_layout, ids_shape)

        optimizer.zero_grad()
        watch = ran["watch"] = _Most(optimizer, tensors, sums) if memory else None
        if watch is not None and zero:  # a look in the backward (ZeRO-2: before each bucket's Reduce_scatter)
            optimizer.watch = watch.walk
        elif watch is not None:  # ZeRO-0: as the walk puts gradients into the buffer, and before each sum
            sums.watch, sums.watch_blocks = watch.walk, watch.sums
        losses, ran["order"], ran["held"] = _run_program(run, plan.programs[stage], ids, when, microbatches, last,
                                                         shape, act, wire, pp_comm, tensors, clock, watch,
                                                         described, wire_dtype, found,
                                                         optimizer if zero else sums if sums.buckets else None)
        if not zero:  # with ZeRO-1 the dp sums are the optimizer's Reduce_scatter
            sums.reduce()  # dp (and sp's LayerNorm) sums: once per step, each bucket in place in its block
        if ends:
            _tie_embedding(run, params["wte"], 0 if stage == pp - 1 else pp - 1, pp_comm, described)
        if cfg.clip and not zero:  # the joint norm over every stage; the tied table counted once
            norms.append(clip_grad_norm_(tensors, cfg.clip, across=(mesh, ("pp",)), counted=counted))
        if watch is not None:
            watch.look("after the backward")
        optimizer.step()
        if watch is not None:
            watch.look("after the step")
        return losses

    graph = None
    for step in range(first, steps):
        if mesh.engine.dry:  # shapes only: the ids' values are never read (each representative would
            x = y = buffers.lazy_zeros((cfg.batch, cfg.seq), np.int64)  # gather a 50 MB batch at 1T)
        else:
            x, y = batch(text_ids, cfg, step)
        start = own = None
        if check and low:  # the optimizer's view of the step's start: master copies and moments, every rank's
            start = where.used(_tables(run, cfg, where, _optimizer_start(optimizer, params), "check.start"))
        elif check:
            start = where.used(_table(run, cfg, where))  # the step's start, every rank's
            own = anchored_start(optimizer, params)  # this rank's start (train.py's)
        for model in models.values():  # this step's dispatches, every microbatch's (a replay's kernels rewrite
            if not replay or graph is None:  # the captured step's list)
                model.moe_stats = []
        given = ()
        if replay:  # the capture's static inputs: every microbatch's ids this stage reads
            given = tuple(DTensor.from_global(stage_mesh, data[mb * micro:(mb + 1) * micro], ids_layout)
                          for data, reads in ((x, 0 in models), (y, last in models)) if reads
                          for mb in range(microbatches))
        clock.times.clear()
        with collect_trace() as trace:
            if not replay:
                losses = pipeline_step(step)
            elif graph is None:  # the same step as eager, recorded
                graph = capture(pipeline_step, Scalar(step), *given, state=tensors)
                losses = graph.result
            else:
                losses = graph(step, *given)
            losses = [float(ops.resolved(loss).local) for loss in losses]
        order, held, watch = ran["order"], ran["held"], ran["watch"]
        cells = [(str(c), clock.times[2 * i], clock.times[2 * i + 1]) for i, c in enumerate(order)]
        # The stages made different numbers of collectives on their own groups: the ranks' call counters
        # (what SPMDSIM_CHECK and the watchdog's reports compare) agree again from here, hooks on or off.
        debug.agree(mesh.comm, mesh.layout.alias_name, mesh.polite, always=True)
        run.orders.append(order)
        run.in_flight.append(held)
        run.cells, run.trace = cells, trace
        # The loss: the last stage's sum of its microbatches' scaled losses and every stage's router losses
        # (each microbatch's, scaled alike), to every rank, for the check and the printed row: not the step's
        # (Megatron's stages keep theirs), so untraced, as the check's own traffic is not the step's either. A
        # dry run then counts what the real run's rows count (it counted this Allreduce, one call and 8 bytes
        # more than the row of the same rank).
        value = float(sum(losses))
        if pp > 1:
            total = np.array([value])
            untraced(mesh.group("pp"), mesh.engine.all_reduce, total, total, "sum",
                     wait=polite_wait if mesh.polite else None)
            value = float(total[0])
        errors = (float("nan"),) * 3
        if check and low:  # as train.py's: the optimizer on the run's own gradients, the rest on the policy's
            summed, masters = _summed_grads(optimizer, params, zero)
            run_grads = where.used(_tables(run, cfg, where, [summed], "check.grads"))
            ref_loss, grads, updated, top = shared_once(
                mesh, ("gpt-mixed", cfg, policy.name, microbatches, step), _checked_mixed, where, start, run_grads,
                x, y, cfg, step, policy, microbatches, None, kept)
            local = step_errors(value, ref_loss, grads, updated, params, optimizer if zero else None, masters, top,
                                slices)
        elif check:
            # The wholes, the reference step and its peaks: computed once for all the ranks (rank 0's under MPI).
            moments, ref_loss, grads, updated, top = shared_once(
                mesh, ("gpt-reference", cfg, microbatches, step + 1), _checked_reference, where, start, moments, x,
                y, cfg, step, microbatches)
            local = step_errors(value, ref_loss, grads, updated, params, optimizer if zero else None, None, top,
                                slices, None if own is None else anchored_updates(own, params, cfg, optimizer))
        if check:
            worst = resolve(mesh, local, pending(mesh.layout, 1, ("pp", "dp", "tp")), "check", reduction="max",
                            owned=True)
            errors = tuple(float(e) for e in worst)
        totals = trace.totals()
        dispatch, ledger = (), None
        if cfg.moe is not None:
            dispatch = _on_mesh(run, [s for c in mine for s in models[c].moe_stats])
            ledger = _expert_bytes(cfg, mesh.rank, stage_mesh, params, _largest(dispatch), optimizer,
                                   trace)
        result = StepResult(step, value, errors, totals["calls"], totals["bytes_sent"],
                            watch.report(step, replay and step > 0) if watch is not None else None, dispatch, ledger,
                            tolerances=mixed_tolerances(policy, cfg), norm=_norm(optimizer if zero else None, norms))
        results.append(result)
        if on_step is not None:
            on_step(result)
        if save is not None and (step + 1 == steps or save_every and (step + 1) % save_every == 0):
            from .checkpoint import save as save_checkpoint

            save_checkpoint(save, meta, step + 1, mesh, params, optimizer)
    del ops, DTensor  # imported for their operators only
    return run, results


def _run_program(run: PipelineRun, program: Sequence, ids: Callable[[int, int], Any], step: Any,
                 microbatches: int, last: int, shape: tuple, act: Any, wire: Any, pp_comm: Any, params: list,
                 clock: "_Clock", watch: Optional["_Most"] = None, described: Optional[dict] = None,
                 wire_dtype: Any = np.float64, found: Optional[dict] = None,
                 reducer: Any = None) -> tuple[list, list, int]:
    """One step of this stage's program: (its microbatches' scaled losses: DTensors, the router losses too;
    the Compute records run; the most microbatch-chunks held at once). `ids(0, mb)`: microbatch mb's input
    ids, `ids(1, mb)` its targets; `step`: an int or a replay Scalar (the dropout masks' seeds); `clock`
    gets each cell's start and end. Activations and gradients are `act` blocks in the chunks and `wire`
    blocks between stages (`act`'s rows of this rank's tp coordinate where they differ, all-gathered over tp
    on receipt). `described`: each message group's trace description (runtime.door.messages) by its place in
    `program`, kept from step to step (a group's sizes and peers are the same every step), filled here.
    `wire_dtype`: the messages' dtype both ways (the activations'; a float32 gradient is rounded to it once
    where it is sent, as the receiving stage's node would round it). `found`: what the run's earlier steps
    found (the program as tuples, the chunks' output layout objects), kept from step to step as `described`.
    `reducer`: the ZeRO-1 or ZeRO-2 optimizer (spmdsim.nn.autograd.backward's `reduce_with`): ZeRO-1's takes each
    microbatch's gradient of a parameter into its main gradient as soon as the walk has it; to ZeRO-2's each
    chunk's last microbatch's backward hands its buckets as they fill, the microbatches before accumulating their
    gradients whole."""
    from ...nn.autograd.engine import backward as backward_, backward_kept, kept_leaves
    from ...programs.pipeline.schedule import Compute
    from ...runtime.dtensor import DTensor
    from ...runtime.door import messages, point_to_point
    from ...runtime.replay import kernel

    mesh, models = run.stage_mesh, run.models
    inputs: dict = {}  # (mb, chunk) -> the received activation (a leaf), the input of chunk's forward
    outputs: dict = {}  # (mb, chunk) -> the forward's output (activation, or the scaled loss), until backward
    upstream: dict = {}  # (mb, chunk) -> the received gradient of chunk's output
    sent_grads: dict = {}  # (mb, chunk) -> the gradient of chunk's input, until sent
    losses, order, held, most = [], [], 0, 0
    scale = 1.0 / microbatches
    local_shape = act.local_shape(shape)
    checked = wire.check_shape(shape)  # the received blocks' global shape, as DTensor checks it
    wire_shape = wire.local_shape(checked)  # every rank's (an uneven cut raises here)
    scatter = wire != act
    if scatter:  # the rows of this rank's tp coordinate in a replicated (T, B, D) block: contiguous
        rows_per = shape[0] // mesh.layout.axis_size("tp")
        mine = slice(mesh.coord("tp") * rows_per, (mesh.coord("tp") + 1) * rows_per)

    def outgoing(block: np.ndarray) -> np.ndarray:  # a copy, if one, recorded while capturing
        if block.dtype != wire_dtype:  # a bfloat16 activation's float32 gradient, rounded once
            block = block.astype(wire_dtype)
        return buffers.contiguous(block[mine] if scatter else block)

    tag_micro = microbatches > 1
    # The parameters every microbatch's backward keeps pending (`backward(keep_pending=params)`), checked once.
    kept = kept_leaves(params)
    # A kernel while this thread captures the step; else (a dry run, which captures none: its steps count bytes; an
    # eager step) stamps plainly, no wrapper. The blocks sent: read as ``_local`` in an eager step (a capture's are
    # its record's views; a dry run's repeated cells' outputs are stand-ins, `_Stand`, with `.local` alone).
    uncaptured = not buffers.CAPTURE.on and not mesh.engine.dry
    stamp = _stamp if mesh.engine.dry or uncaptured else kernel(_stamp)

    blocks = _DryBlocks(wire_dtype) if mesh.engine.dry else None
    repeat = _DryCells(local_shape, blocks) if blocks is not None else None
    # Each chunk's first backward runs for real in a dry run (it is measured), so its forward does too; under
    # ZeRO-2 so does its last (`last_backward`, below), which reduces the buckets as they fill.
    first_backward: dict = {}
    if repeat is not None:
        for action in program:
            if isinstance(action, Compute) and action.kind == "B":
                first_backward.setdefault(action.chunk, action.microbatch)

    def forward(mb: int, c: int) -> None:
        nonlocal held, most
        held += 1
        if held > most:
            most = held
        if repeat is None or mb == last_backward.get(c) != first_backward.get(c):
            # a real run (every cell runs, none measured), or a dry run's ZeRO-2 last microbatch of the chunk
            # (its backward runs: it reduces the buckets as they fill, as the real run's does)
            _forward(mb, c)
        elif mb != first_backward.get(c) and repeat.again(("F", c)):
            # a dry run's later microbatch: the first's figures
            outputs[(mb, c)] = stand = repeat.output(("F", c))
            stand.input = inputs.pop((mb, c), None)  # held until the backward, as the graph would hold it
        else:
            with _first(repeat, ("F", c)):
                _forward(mb, c)
        if watch is not None:
            watch.forward(c, outputs[(mb, c)])

    def _forward(mb: int, c: int) -> None:
        model, when = models[c], (mb if tag_micro else None)
        h = model.embed(ids(0, mb), step, True, when) if c == 0 else inputs[(mb, c)]
        h, router = model.chunk_blocks(h, step, True, when, scale)
        if router is not None:
            losses.append(router)  # (a scalar DTensor: what the step's loss adds for them)
        if c == last:
            h = model.head_loss(h, ids(1, mb)) * scale
            losses.append(h)
        outputs[(mb, c)] = h

    def backward(mb: int, c: int) -> None:
        nonlocal held
        held -= 1
        if watch is not None:
            watch.backward(c)
        out = outputs.pop((mb, c))
        reducing = last_backward.get(c) == mb  # ZeRO-2's last microbatch of the chunk (else `last_backward` empty)
        reduce_with = reducer if reducing or zero1 else None
        if repeat is None or reducing and mb != first_backward.get(c):
            # a real run (every cell runs, none measured), or a dry run's ZeRO-2 last microbatch of the chunk
            # (the gradients it holds while it reduces: the earlier microbatches' whole and its own)
            backward_kept(out, None if c == last else upstream.pop((mb, c)), kept, reduce_with)
        elif isinstance(out, _Stand):  # a dry run's repeated cell: the first backward's figures
            upstream.pop((mb, c), None)
            if not repeat.again(("B", c)):  # pragma: no cover - each chunk's first backward ran for real
                raise SpmdsimError(f"internal: no measured backward of chunk {c} to repeat")
            if c > 0:
                sent_grads[(mb, c)] = blocks.zeros(wire_shape)
            return
        else:
            with _first(repeat, ("B", c)):
                backward_(out, gradient=None if c == last else upstream.pop((mb, c)), keep_pending=params,
                          reduce_with=reduce_with)
        if c > 0:
            grad = inputs.pop((mb, c)).grad
            sent_grads[(mb, c)] = outgoing(grad._local if uncaptured else grad.local)

    if described is None:
        described = {}
    known = found if found is not None else {}
    steps = known.get("program")
    if steps is None or steps[0] is not program:  # the program's actions as plain tuples, once a run
        steps = known["program"] = (program, _compiled(program))
    last_backward: dict = {}  # chunk -> the microbatch of its last backward (ZeRO-2's buckets reduced in it)
    zero1 = reducer is not None and not reducer.shard_grads  # every backward hands ZeRO-1's its gradients
    if reducer is not None and reducer.shard_grads:
        for entry in steps[1]:
            if entry[0] == 1:
                last_backward[entry[2]] = entry[1]
    # A received gradient takes the very layout object of the chunk's output (equal to `act`), which the output's
    # node wants: the backward's tests then stop at `is`, as between the layers of one chunk (under `act`, an
    # equal object of the model's own, it cost ~8 comparisons and moves a microbatch). Not in a dry run (its
    # repeated cells' outputs are stand-ins). An activation received keeps `act`: the chunk's rules hand its
    # gradient back in that object.
    outward = known.setdefault("outward", {}) if blocks is None else None  # id -> (an output layout, the answer)
    trusted, plain = DTensor._trusted, np.ndarray
    empty = buffers.empty if blocks is None else lambda shape, dtype: blocks.empty(shape)  # a receive's buffer
    for entry in steps[1]:
        kind = entry[0]
        if kind < 2:  # a cell: 0 forward, 1 backward
            stamp(clock)
            if kind:
                backward(entry[1], entry[2])
            else:
                forward(entry[1], entry[2])
            stamp(clock)
            order.append(entry[3])
            continue
        sends: list = []
        for is_act, key, peer, tag in entry[2]:
            sends.append((outgoing(outputs[key]._local if uncaptured else outputs[key].local) if is_act else
                          sent_grads.pop(key), peer, tag))
        gets = entry[3]
        if gets:
            n = len(gets)
            bufs = list(map(empty, repeat_(wire_shape, n), repeat_(wire_dtype, n)))
            receives = list(zip(bufs, entry[4], entry[5]))
        else:
            bufs = receives = []
        i = entry[1]
        group = described.get(i)
        if group is None:  # the first step's: counted from its buffers once
            group = described[i] = messages(pp_comm, _PP, receives, sends)
        point_to_point(run.mesh, pp_comm, _PP, receives, sends, "pipeline", group)
        for (is_act, key), buf in zip(gets, bufs):
            # A block of wire_shape and wire_dtype, made above (a captured step's buffer is a replay.Traced, of
            # which np.asarray makes a plain view, as DTensor's own check would): nothing to check.
            if type(buf) is not plain:
                buf = np.asarray(buf)
            if is_act:
                layout = act
            elif outward is not None:
                layout = _output_layout(outputs.get(key), act, outward)
            else:
                layout = act
            if scatter:  # Megatron's gather: the stage's tp ranks put their rows together
                t = trusted(mesh, buf, wire, checked).redistribute(layout)
            else:  # `wire` is `act`, `layout` an object equal to it
                t = trusted(mesh, buf, layout, checked)
            if is_act:
                inputs[key] = t.requires_grad_()
            else:
                upstream[key] = t
    if repeat is not None:
        repeat.flush()
    return losses, order, most


def _compiled(program: Sequence) -> list:
    """A stage's `program` as `_run_program` runs it: a cell as (0 forward or 1 backward, microbatch, chunk, its
    Compute), a message group as (2, its place in `program`, its sends in order as (an activation?, (microbatch,
    chunk), peer, tag), its receives in order as (an activation?, (microbatch, chunk)), their peers, their tags)."""
    from ...programs.pipeline.schedule import Compute, Post, Send

    steps: list = []
    for i, action in enumerate(program):
        if isinstance(action, Compute):
            steps.append((0 if action.kind == "F" else 1, action.microbatch, action.chunk, action))
            continue
        sends, gets, peers, tags = [], [], [], []
        for op in (action.ops if isinstance(action, Post) else (action,)):
            send, act = isinstance(op, Send), op.what == "act"
            sender = op.chunk if send else op.chunk - 1 if act else op.chunk + 1
            tag = _tag(op.what, sender)
            if send:
                sends.append((act, (op.microbatch, op.chunk), op.peer, tag))
            else:
                gets.append((act, (op.microbatch, op.chunk)))
                peers.append(op.peer)
                tags.append(tag)
        steps.append((2, i, tuple(sends), tuple(gets), tuple(peers), tuple(tags)))
    return steps


def _output_layout(out: Any, act: Any, seen: dict) -> Any:
    """The layout object of `out` (a chunk's output, whose gradient is being received) where it is equal to
    `act` (the blocks' layout between chunks), else `act`: the gradient then reaches the output's node in the
    very layout object it wants. Compared once per layout object (`seen`: id -> (the object, the answer))."""
    layout = getattr(out, "_layout", None)  # (None: no such output, never in a checked schedule)
    if layout is None or layout is act:
        return act
    hit = seen.get(id(layout))
    if hit is None or hit[0] is not layout:
        if len(seen) >= 64:
            seen.clear()
        hit = seen[id(layout)] = (layout, layout if layout == act else act)  # (held: its id is not reused)
    return hit[1]


class _Clock:
    """perf_counter times, a start and an end per cell, in the order the cells ran."""

    __slots__ = ("times",)

    def __init__(self) -> None:
        self.times: list = []


def _stamp(clock: _Clock) -> None:
    """Now, onto `clock` (a kernel while a step is captured: its replays stamp again)."""
    clock.times.append(perf_counter())


class _Most:
    """What `train_pipelined(memory=True)` looks at on one rank in one step: the bytes each chunk's
    forward keeps for its backward (its first microbatch's graph, spmdsim.nn.autograd.kept_bytes: every
    microbatch of a chunk keeps blocks of the same shapes), summed over the microbatch-chunks held at
    each moment; the moment the schedule held the most, and after the backward and the step."""

    def __init__(self, optimizer: Any, params: list, sums: Any = None) -> None:
        self.optimizer, self.params, self.grad_sums = optimizer, params, sums  # (ZeRO-0's GradBuffer, or None)
        self.kept_of: dict = {}  # chunk -> {kind: bytes}
        self.sum_of: dict = {}  # chunk -> its kept bytes in all
        self.most = -1  # the most bytes kept at once so far
        self.live: dict = {}  # chunk -> its microbatches live now (forward run, backward not yet)
        self.total = 0  # the bytes they keep
        self.moments: dict = {}  # as spmdsim.models.gpt.train._look records them
        # `live` when the schedule last held more than ever, until that moment is looked at (`_flush`): a look
        # reads the optimizer's and the gradients' bytes, which only a backward or the step changes, so a rise
        # is looked at once, before the next of them (a 64-stage 1F1B's first stage rises 64 forwards in a row).
        self.rise: Optional[dict] = None

    def forward(self, chunk: int, out: Any) -> None:
        """A forward of `chunk` ran (its output `out`): what the live microbatch-chunks keep, summed so far."""
        if chunk not in self.kept_of:  # boolean dropout masks (kept="megatron") under a kind of their own
            from ...nn.autograd import kept_bytes

            values, masks = ({}, {}) if isinstance(out, _Stand) else kept_bytes([out], exclude=self.params,
                                                                                 masks=True)
            self.kept_of[chunk] = {**values, **{kind + MASKS: n for kind, n in masks.items() if n}}
            self.sum_of[chunk] = sum(self.kept_of[chunk].values())
        elif holding() and not isinstance(out, _Stand):
            # A later microbatch's blocks are the rank's too while it is live: marked as held (spmdsim.base.flops.hold)
            # for the counters that record blocks, as the first's are (unmarked, a real step counted every block
            # its products and kernels read or wrote as the moment's own, where its dry run, which runs no later
            # cell, counted the first's).
            from ...nn.autograd import kept_bytes

            kept_bytes([out], exclude=self.params)
        self.live[chunk] = self.live.get(chunk, 0) + 1
        self.total += self.sum_of[chunk]
        if self.total > self.most:
            self.most = self.total
            self.rise = dict(self.live)

    def _flush(self) -> None:
        """Look at the last rise (see `rise`), if not yet."""
        if self.rise is None:
            return
        kinds: dict = {}
        for c, times in self.rise.items():
            if times:
                for kind, n in self.kept_of[c].items():
                    kinds[kind] = kinds.get(kind, 0) + n * times
        self.rise = None
        _look(self.moments, "the most activations held", self.optimizer, self.params, kinds, self.grad_sums)

    def backward(self, chunk: int) -> None:
        """A backward of `chunk` is about to run: one of its microbatches' kept bytes are no longer live."""
        self._flush()
        self.live[chunk] -= 1
        self.total -= self.sum_of[chunk]

    def walk(self, grads: dict) -> None:
        """A backward's look at a stop of its walk: ZeRO-2's before it reduces a bucket, ZeRO-1's and ZeRO-0's as
        gradients go into the buffer, ZeRO-0's before each bucket's Allreduce (spmdsim.models.gpt.train._look_walk)."""
        _look_walk(self.moments, self.optimizer, self.params, grads, self.grad_sums)

    def sums(self, blocks: list) -> None:
        """A ZeRO-0 step's look as `reduce_grads` sums a bucket or a leaf alone, where the gradients are not all
        in their buffer's views (spmdsim.models.gpt.train._look_blocks; the buffer held beside them)."""
        _look_blocks(self.moments, self.params, blocks, self.grad_sums)

    def look(self, moment: str, kept: Optional[dict] = None) -> None:
        self._flush()
        _look(self.moments, moment, self.optimizer, self.params, kept, self.grad_sums)

    def report(self, step: int, replayed: bool = False) -> Any:
        """The step's MemoryReport; `replayed`: a replay of the step these looks were made in (which runs none
        of their Python): its bytes as any later step's (spmdsim.models.gpt.train._steady)."""
        self._flush()
        moments = _steady(self.moments) if replayed else self.moments
        return _report(step, moments, buffers.owned_bytes(p.local for p in self.params))


class _Stand:
    """A dry run's repeated forward cell: the output's block (zeros) and, while it lives, the bytes the first
    cell of its kind kept for its backward (counted on the run's Meter)."""

    __slots__ = ("local", "input", "__weakref__")

    def __init__(self, local: np.ndarray) -> None:
        self.local, self.input = local, None


class _DryCells:
    """A dry run's cells after the first of each kind ((F or B, chunk)): every microbatch's cell of one kind
    runs the same operators on blocks of the same shapes, so the first one runs (dry) and is measured (its
    trace rows, the bytes it keeps, the bytes it holds at its peak, its matrix products) and the later ones
    add those figures without running again: ranks that do the same work are computed once, and so are
    microbatches."""

    def __init__(self, local_shape: tuple, blocks: "_DryBlocks") -> None:
        self.local_shape, self.blocks = local_shape, blocks
        self.context = current()  # the rank's: its open traces and FLOP counters, its Meter
        # (kind, chunk) -> (trace rows, bytes kept after it, bytes above the start at its peak, its products:
        # a spmdsim.base.flops.FlopCounter)
        self.seen: dict = {}
        self.repeats: dict = {}  # (kind, chunk) -> cells repeated, whose products `flush` adds at once

    def flush(self) -> None:
        """Add the repeated cells' matrix products to the FLOP counters open on this rank (spmdsim.base.flops.
        counting): once per kind of cell, times its repeats, at the end of the step's program."""
        for counter in current().flops:
            for key, times in self.repeats.items():
                counter.merge(self.seen[key][3], times)
        self.repeats.clear()

    def again(self, key: tuple) -> bool:
        """True (and the first cell's rows, peak and products added) if a cell of this kind ran already."""
        seen = self.seen.get(key)
        if seen is None:
            return False
        rows, _, transient, _ = seen
        context = self.context
        for trace in context.traces:
            trace.repeat(rows)
        if context.flops:  # the FLOP counters open on this rank: added at `flush`
            self.repeats[key] = self.repeats.get(key, 0) + 1
        meter = context.meter
        if meter.held + transient > meter.peak:
            meter.peak = meter.held + transient
        return True

    def output(self, key: tuple) -> _Stand:
        """The stand-in of a repeated forward's output, holding the first such forward's kept bytes while it
        lives."""
        out = _Stand(self.blocks.zeros(self.local_shape))
        self.context.meter.count(out, self.seen[key][1])
        return out


class _DryBlocks:
    """A dry run's blocks (of the wire's dtype) that nothing writes: the message buffers a stage receives into
    (the dry engine leaves them as they are) and the stand-ins of repeated cells (only sent). Each is an array of
    its own over one lazy mapping per size (spmdsim.base.buffers.lazy_zeros: zeros the kernel maps on read), so the
    run's Meter counts each as the owner of its bytes, as it counts a mapping of its own, where a mapping a block cost
    ~7 us to make and free (a 1F1B step of 64 stages x 512 microbatches makes ~130,000). `empty` is placed
    as spmdsim.base.buffers.empty places a dry run's block, `zeros` as lazy_zeros places it; a block below the
    size lazy_zeros maps is theirs."""

    __slots__ = ("_maps", "_empty", "_zeros", "dtype")

    def __init__(self, dtype: Any = np.float64) -> None:
        self.dtype = np.dtype(dtype)
        self._maps: dict = {}  # bytes -> the mapping under that size's blocks, or None (numpy's own zeros)
        self._empty: dict = {}  # shape -> the mapping `empty` places its blocks of that shape on, or None
        self._zeros: dict = {}  # the same for `zeros`

    def _map(self, nbytes: int) -> Any:
        if nbytes not in self._maps:
            raw = buffers.owner(buffers.lazy_zeros(nbytes, np.uint8))
            self._maps[nbytes] = raw.base if buffers.is_lazy(raw) else None
        return self._maps[nbytes]

    def empty(self, shape: tuple) -> np.ndarray:
        mapping = self._empty.get(shape, False)
        if mapping is False:
            nbytes = self.dtype.itemsize * math.prod(shape)
            mapping = self._empty[shape] = self._map(nbytes + buffers.PAGE) if nbytes >= buffers.MIN_BYTES else None
        if mapping is None:
            return buffers.empty(shape, self.dtype)
        return np.ndarray(shape, self.dtype, mapping, buffers.PAGE_OFFSET)

    def zeros(self, shape: tuple) -> np.ndarray:
        mapping = self._zeros.get(shape, False)
        if mapping is False:
            mapping = self._zeros[shape] = self._map(self.dtype.itemsize * math.prod(shape))
        if mapping is None:
            return buffers.lazy_zeros(shape, self.dtype)
        return np.ndarray(shape, self.dtype, mapping)


class _first:  # noqa: N801 - a context manager, read as a phrase: `with _first(repeat, key):`
    """Measure the first cell of its kind in a dry run (see _DryCells); nothing otherwise."""

    def __init__(self, repeat: Optional[_DryCells], key: tuple) -> None:
        self.repeat, self.key = repeat, key

    def __enter__(self) -> None:
        if self.repeat is None:
            return
        from ...base.flops import counting

        context = current()
        self.meter, self.trace = context.meter, context.traces[-1]
        self.rows, self.held, self.peak = len(self.trace._rows), self.meter.held, self.meter.peak
        self.meter.peak = self.meter.held  # the peak inside this cell, from here
        self.counting = counting()  # the cell's matrix products, beside any counter open outside
        self.products = self.counting.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.repeat is None:
            return
        self.counting.__exit__(*exc)
        if exc[0] is not None:
            return
        meter = self.meter
        self.repeat.seen[self.key] = (tuple(self.trace._rows[self.rows:]), meter.held - self.held,
                                      meter.peak - self.held, self.products)
        meter.peak = max(meter.peak, self.peak)


def _on_mesh(run: PipelineRun, stats: list) -> tuple:
    """A stage's MoEStats with their ranks on the whole mesh (a stage's ranks follow its first: pp is the
    major axis)."""
    from dataclasses import replace

    first = run.stage * run.stage_mesh.size
    return tuple(replace(s, rank=first + s.rank, group=tuple(first + r for r in s.group)) for s in stats)


def _largest(stats: tuple) -> tuple:
    """One MoEStats per MoE layer whose dispatch buffers are the largest any microbatch's forward made (the
    ledger counts one forward's buffers; with a capacity every microbatch's are the same size)."""
    from dataclasses import replace

    most: dict = {}
    for s in stats:
        seen = most.get(s.layer)
        most[s.layer] = s if seen is None else replace(seen, send_bytes=max(seen.send_bytes, s.send_bytes),
                                                       received_bytes=max(seen.received_bytes, s.received_bytes))
    return tuple(most.values())


def _tie_embedding(run: PipelineRun, wte: Any, other: int, pp_comm: Any, described: dict) -> None:
    """Add the other end's gradient of the tied table (first and last stage: Megatron's embedding group).
    `described`: the exchange's trace description under "tied" after the first step (runtime.door.messages)."""
    from ...runtime.door import messages, point_to_point

    g = wte.grad
    mine = buffers.contiguous(g.local)
    theirs = buffers.empty(mine.shape, mine.dtype)
    receives, sends = [(theirs, other, 1 << 14)], [(mine, other, 1 << 14)]
    known = described.get("tied")
    if known is None:
        known = described["tied"] = messages(pp_comm, _PP, receives, sends)
    point_to_point(run.mesh, pp_comm, _PP, receives, sends, "embedding group", known)
    if g._local is wte._ag.main:  # ZeRO-1's main gradient (spmdsim.nn.distrib_optim): the sum into it, in place
        if not g.mesh.engine.dry:
            _add_main(wte._ag.main, theirs)
        return
    total = mine if g.mesh.engine.dry else mine + theirs  # a dry run's zeros stay zeros, unread
    wte._ag.grad = type(g)(g.mesh, total, g.layout, g.global_shape)


def _add_main(main: np.ndarray, theirs: np.ndarray) -> None:
    """``main += theirs`` (the ufunc and operands of ``mine + theirs``: the same bits), a kernel while capturing."""
    from ...runtime.replay import kernel

    (kernel(_added) if buffers.CAPTURE.on else _added)(main, theirs)


def _added(main: np.ndarray, theirs: np.ndarray) -> None:
    np.add(main, theirs, out=main)


def gathered_stages(run: PipelineRun, cfg: GPTConfig) -> dict:
    """Every parameter whole on every rank: one Allgather over the whole mesh of each rank's blocks (`_table`),
    made whole where `_stage_regions` says each lies."""
    where = _stage_regions(run, cfg)
    return assemble(where, where.used(_table(run, cfg)))[0]


def _held(run: PipelineRun, cfg: GPTConfig) -> list:
    """The names of the parameters each stage holds, in param_specs' order (every rank knows each stage's)."""
    pp, parts = run.mesh.layout.device_matrix[0], run.parts
    return [[s.name for s in param_specs(cfg)
             if any(parts[c].holds(s.name, cfg.tied) for c in range(stage, len(parts), pp))]
            for stage in range(pp)]


def _stage_regions(run: PipelineRun, cfg: GPTConfig) -> Regions:
    """Where each rank's blocks lie in `_table`'s rows (spmdsim.models.gpt.wholes.stage_regions): worked out once a run."""
    layouts = next(iter(run.models.values())).layouts  # every parameter's, alike on every stage
    return stage_regions(_held(run, cfg), layouts, {s.name: s.shape for s in param_specs(cfg)},
                         run.stage_mesh.size)


def _tables(run: PipelineRun, cfg: GPTConfig, where: Regions, tables: list, label: str) -> np.ndarray:
    """`_table` of several tables (name -> this rank's block, of the parameters its stage holds), table after
    table in each row (spmdsim.models.gpt.wholes.assemble reads them so), from one Allgather over the whole mesh (on
    simulated ranks one table they share: spmdsim.models.gpt.train.all_rows)."""
    from .train import all_rows

    mesh = run.mesh
    flat = np.zeros(where.width * len(tables))
    for k, table in enumerate(tables):
        at = k * where.width
        for name in _held(run, cfg)[run.stage]:
            block = np.asarray(table[name], np.float64).reshape(-1)
            flat[at:at + block.size] = block
            at += block.size
    return all_rows(mesh, flat, label).reshape(mesh.size, -1)


def _table(run: PipelineRun, cfg: GPTConfig, where: Optional[Regions] = None) -> np.ndarray:
    """Every rank's blocks of the parameters its stage holds, a row per rank (float64, padded to the largest
    stage's), from one Allgather over the whole mesh."""
    return _tables(run, cfg, where or _stage_regions(run, cfg), [{name: t.local for name, t in run.params.items()}],
                   "check.params")
