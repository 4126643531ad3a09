"""Why a pipelined GPT cannot train as asked: the sizes' refusals (`pipeline_layout_problem`) and
`train_pipelined`'s (`refuse_pipelined`), each one line, alike on every rank, before any collective."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from .fp8_block import policy_problem
from ...errors import SpmdsimError
from ...nn.autograd.kept import kept_problem
from ...nn.fsdp import shard_group, shard_problem
from ...programs.pipeline.options import (default_microbatches_problem, default_virtual_problem, microbatches,
                                         pipelined, virtual_stages)
from ...programs.pipeline.schedule import schedule_problem
from ...layouts.layout import Layout
from ..axes import CONTEXT, DATA, EXPERT, PIPELINE, TENSOR, model_layout
from .config import GPTConfig
from .context import context_problem
from .data import text_problem
from .layouts import batch_split, folded_by, megatron_layouts, mesh_problem
from .params import param_specs
from .memory import recompute_problem, zero_problem
from .options import context_of
from .stages import pipeline_problem
from .train import refuse_run, replay_problem

__all__ = ["pipeline_layout_problem", "refuse_pipelined", "fsdp_problem", "shards_problem", "stage_problem",
           "unshardable"]


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
    # folded experts with a capacity (spmdsim.models.moe.fold): each tp rank outside etp routes its share of the rows
    by_tp = folded_by(cfg, tp) if cfg.moe is not None and not cfg.moe.dropless else 1
    if problem is None and micro % (dp * ep * by_tp):
        problem = f"a microbatch of {micro} samples is not divisible by {batch_split(dp, ep, by_tp, tp // by_tp)}"
    return problem or pipeline_problem(cfg, pp * virtual, split)


def refuse_pipelined(cfg: GPTConfig, comm: Any, pp: int, dp: int, tp: int, steps: int, text_ids: np.ndarray,
                     sp: bool, schedule: str, microbatches: int, virtual: int, split: Optional[Sequence[int]],
                     check: bool, layouts: Optional[dict], recompute: str, zero: int, kept: str, ep: int, replay: bool,
                     precision: Any, save: Optional[str], save_every: int, resume: Optional[str],
                     contexts: tuple = (1, None)) -> Optional[dict]:
    """`train_pipelined`'s refusals, raised alike on every rank before the first collective; the checkpoints'
    metadata (None without checkpoints). `contexts`: (cp, its Context or None)."""
    moe = cfg.moe is not None or ep != 1
    cp, context = contexts
    problem = (pipeline_layout_problem(cfg, pp, dp, tp, sp, microbatches, virtual, split, ep, schedule)
               or context_problem(cfg, cp, tp, sp, context)
               or recompute_problem(recompute) or zero_problem(zero) or kept_problem(kept)
               or (replay_problem(cfg) if replay else None) or policy_problem(precision, replay)
               or text_problem(text_ids, cfg))
    if problem:
        where = " x ".join(f"{a} {n}" for a, n, shown in ((PIPELINE, pp, True), (DATA, dp, True), (EXPERT, ep, moe),
                                                           (CONTEXT, cp, cp > 1), (TENSOR, tp, True)) if shown)
        raise SpmdsimError(f"the GPT cannot train on {where}: {problem}")
    shape = {PIPELINE: pp, "schedule": schedule, "microbatches": microbatches, "virtual": virtual, "split": split}
    return refuse_run(cfg, comm, check, precision, (steps, save, save_every, resume),
                      dict(dp=dp, tp=tp, sp=sp, layouts=layouts, precision=precision, zero=zero, ep=ep, pipeline=shape),
                      dict(dp=dp, tp=tp, ep=ep, pp=pp, microbatches=microbatches, recompute=recompute, sp=sp, kept=kept,
                           zero=zero, precision=precision))


def stage_problem(args: Any, cfg: GPTConfig, dp: int, tp: int, layers: Optional[Sequence[int]],
                  ep: int = 1) -> Optional[str]:
    """Why the model cannot run on dp (x ep) x tp ranks a stage with the command line's (`args`) pp, cp and pipeline
    flags (examples/train_gpt.py's and train_moe_gpt.py's), or None. `layers`: the pipeline's layers per chunk
    (None: balanced)."""
    pp, cp = args.pp, args.cp
    if pipelined(args):
        m, v = microbatches(args), virtual_stages(args)
        # the defaults the user never wrote (2 x pp microbatches, 2 chunks a stage when interleaved): said so
        problem = default_virtual_problem(args) or default_microbatches_problem(args, cfg.batch)
        problem = problem or pipeline_layout_problem(cfg, pp, dp, tp, args.sp, m, v, layers, ep=ep,
                                                     schedule=args.schedule)
    else:
        problem = mesh_problem(cfg, dp, tp, args.sp, ep)
    return problem or context_problem(cfg, cp, tp, args.sp, context_of(args)) or shards_problem(args, cfg, dp, tp, ep)


def shards_problem(args: Any, cfg: GPTConfig, dp: int, tp: int, ep: int) -> Optional[str]:
    """Under --zero 3, why fully_shard cannot shard the parameters on the stage's mesh (spmdsim.models.axes.
    model_layout, as the examples and `spmdsim estimate` make it: ep, the mesh's, with MoE layers, cp, the experts'
    etp), or None; HSDP's --shard-group shards over fewer ranks, refused by its own check."""
    if str(args.zero) != "3" or getattr(args, "shard_group", None) is not None:
        return None
    mesh = model_layout(tp, dp, ep=ep if cfg.moe is not None else None, cp=args.cp if args.cp > 1 else None,
                        etp=getattr(args, "etp", None) or 0)
    return fsdp_problem(cfg, Layout(*mesh), args.sp)


def unshardable(cfg: GPTConfig, layout: Layout, sp: bool = False) -> Optional[tuple[str, bool]]:
    """The first of the GPT's parameters ZeRO-3 cannot shard on a stage's mesh `layout` (spmdsim.models.axes.
    model_layout), as (fully_shard's own refusal, whether its rows are the vocabulary's), or None
    (spmdsim.nn.fsdp.shard_problem: each parameter's dim 0 split evenly over the axes that split it and the data
    axes it is replicated over, dp and ep for the dense ones), asked of Megatron's layouts. Pure."""
    layouts = megatron_layouts(cfg, layout, sp)
    group = shard_group(layout, {"data": DATA, "expert": EXPERT})
    for spec in param_specs(cfg):
        problem = shard_problem(spec.name, layouts[spec.name], spec.shape, group)
        if problem:
            return problem, spec.name in ("wte", "head.w") and spec.shape[0] == cfg.padded_vocab
    return None


def fsdp_problem(cfg: GPTConfig, layout: Layout, sp: bool = False) -> Optional[str]:
    """Why ZeRO-3 cannot shard the GPT's parameters on a stage's mesh `layout` (`unshardable`), said with the flag
    and, for the vocabulary's rows, the padding that lets them split, before a trainer prints a line or runs a
    collective; or None. Pure."""
    found = unshardable(cfg, layout, sp)
    if found is None:
        return None
    problem, vocabulary = found  # (tp divides the vocabulary's rows already, mesh_problem's: the shards tp x dp x ep)
    pad = "; pad the vocabulary to a multiple of the shards (--pad-vocab-to, GPTConfig vocab_pad_to)"
    return f"--zero 3: {problem}{pad if vocabulary else ''}"
