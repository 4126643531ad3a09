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

Checked every step as the unpipelined training is (spmdsim.models.gpt.train): the
same step in one numpy process, microbatch by microbatch (each microbatch
draws its own dropout masks, spmdsim.models.gpt.params.dropout_seed), from every
stage's parameters at the start of the step, compared on every rank.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence


import numpy as np

from ...base import buffers
from ...nn.autograd.kept import kept_problem
from ...errors import SpmdsimError
from ...layouts.layout import Layout
from .config import GPTConfig
from .data import batch, text_problem
from .memory import recompute_problem, zero_problem
from .params import decays, param_specs
from .stages import chunk_parts, pipeline_problem
from .train import StepResult, all_rows
from .wholes import Regions, assemble, stage_regions
from ..axes import DATA, PIPELINE, TENSOR, model_layout, roles_of
from . import parallel
from ...base.precision import precision as get_precision, precision_problem
from ...nn import ops
from ...nn.autograd.grad_buffer import GradBuffer
from ...nn.distrib_optim import DistributedAdamW
from ...nn.optim import AdamW, clip_grad_norm_
from ...programs.pipeline.schedule import build, schedule_problem
from ...runtime import debug
from ...runtime.door import untraced
from ...runtime.dtensor import DTensor
from ...runtime.engines.wait import polite_wait
from ...runtime.executor import pending, resolve
from ...runtime.mesh import Mesh
from ...runtime.replay import Scalar, capture
from ...runtime.shared_reference import shared_once
from ...runtime.sim import dry_run_active, once
from ...runtime.sim.dry import differ
from ...runtime.trace import collect_trace
from .checkpoint import load, save as save_checkpoint
from .layouts import mesh_problem
from .mixed import architecture_problem
from .tolerances import tolerances as mixed_tolerances
from .train import _checkpoint_problem, _optimizer_start, checkpoint_meta, replay_problem
from .stage_memory import _Most
from .stage_program import PipelineRun, _Clock, _run_program, _tie_embedding
from .step_check import _norm, _summed_grads, step_errors
from .buckets import _zero_axes, anchored_start, anchored_updates, dp_bucket, zero_options
from .reference_step import _checked_mixed, _checked_reference, _resumed_moments, _zero_moments
from .step_looks import _expert_bytes, step_memory_problem

__all__ = ["train_pipelined", "pipeline_layout_problem"]


def pipeline_layout_problem(cfg: GPTConfig, pp: int, dp: int, tp: int, sp: bool, microbatches: int,
                            virtual: int = 1, split: Optional[Sequence[int]] = None, ep: int = 1,
                            schedule: Optional[str] = None) -> Optional[str]:
    """Why the GPT cannot train on pp x dp x tp (pp x dp x ep x tp with MoE layers) with `microbatches`
    (one line, alike on every rank), or None. With `schedule` (its name) also why that schedule cannot take
    these sizes (spmdsim.programs.pipeline.schedule.schedule_problem: one chunk per stage but under "interleaved",
    whose microbatches a multiple of pp), so that a trainer refuses them before its first line of output."""
    for name, value in ((PIPELINE, pp), ("microbatches", microbatches), ("virtual stages", virtual)):
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
    with `memory` a replayed step reports what the step run eagerly reports: spmdsim.models.gpt.step_looks._steady).
    `precision`: the policy (as spmdsim.models.gpt.train.train's: the stages compute under it, activations and their
    gradients cross stage boundaries in its activation dtype, bfloat16 at bf16-mixed, as Megatron sends them;
    the check's reference is the policy's, microbatch by microbatch). `save`, `save_every` and `resume`: checkpoints
    as spmdsim.models.gpt.train.train's (each rank's file holds its stage's blocks; the metadata records the pipeline's
    schedule, microbatches, chunks and split too). Every refusal is raised alike on every rank before the first
    collective.
    """
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
        shape = {PIPELINE: pp, "schedule": schedule, "microbatches": microbatches, "virtual": virtual, "split": split}
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

        problem = architecture_problem(cfg)
        if problem:
            raise SpmdsimError(problem)
    plan = build(schedule, pp, microbatches, virtual)
    chunks = pp * virtual
    last = chunks - 1
    parts = chunk_parts(cfg, chunks, split)
    inner = model_layout(tp, dp, ep if moe else None)  # a stage's mesh
    outer = model_layout(tp, dp, ep if moe else None, pp)
    mesh = Mesh(Layout(*outer), comm, algorithms=algorithms, roles=roles_of(outer[1]))
    differ(mesh, (PIPELINE,))  # a dry run runs one rank per stage: the stages' work differs
    stage = mesh.coord(PIPELINE)
    stage_mesh = Mesh(Layout(*inner), mesh.group(inner[1]), algorithms=algorithms, roles=roles_of(inner[1]))
    pp_comm = mesh.group(PIPELINE) if pp > 1 else None
    mine = [c for c in range(chunks) if c % pp == stage]
    models = {c: parallel.GPT(cfg, stage_mesh, sp=sp, layouts=layouts, part=parts[c], recompute=recompute, kept=kept,
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
                                     clip_across=(mesh, (PIPELINE,)), clip_counted=counted,
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
    wire = stage_mesh.layout(TENSOR, any_model.batch, None) if not sp and tp > 1 and cfg.seq % tp == 0 else act
    ids_layout = stage_mesh.layout(any_model.batch, None)
    ids_shape = ids_layout.check_shape((micro, cfg.seq))  # a microbatch's ids, this rank's rows of them:
    ids_cut = ids_layout.slices(stage_mesh.rank, ids_shape)  # as DTensor.from_global cuts them
    first = 0
    if resume is not None:  # this rank's blocks and optimizer state (collective: the ranks agree on a problem)

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
            norms.append(clip_grad_norm_(tensors, cfg.clip, across=(mesh, (PIPELINE,)), counted=counted))
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
            untraced(mesh.group(PIPELINE), "all_reduce", total, total, "sum", wait=polite_wait if mesh.polite else None)
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
            worst = resolve(mesh, local, pending(mesh.layout, 1, (PIPELINE, DATA, TENSOR)), "check", reduction="max",
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
            save_checkpoint(save, meta, step + 1, mesh, params, optimizer)
    return run, results


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
