"""Why a pipelined GPT cannot train as asked: the sizes' refusals (`pipeline_layout_problem`) and
`train_pipelined`'s (`refuse_pipelined`), each one line, alike on every rank, before any collective."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from .fp8_block import policy_problem
from ...base.validate import counted
from ...errors import SpmdsimError
from ...nn.autograd.kept import kept_problem
from ...programs.pipeline.options import (default_microbatches_problem, default_virtual_problem, microbatches,
                                         pipelined, virtual_stages)
from ...programs.pipeline.schedule import schedule_problem
from ..axes import CONTEXT, DATA, EXPERT, PIPELINE, TENSOR
from .config import GPTConfig
from .context import context_problem
from .data import text_problem
from .layouts import batch_split, folded_by, mesh_problem
from .memory import recompute_problem, zero_problem
from .options import context_of
from .stages import pipeline_problem
from .train import refuse_run, replay_problem

__all__ = ["pipeline_layout_problem", "refuse_pipelined", "stage_problem"]


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
    problem = mesh_problem(cfg, dp, tp, sp, ep) or _microbatch_problem(cfg, dp, tp, ep, microbatches)
    return problem or pipeline_problem(cfg, pp * virtual, split)


def _rows_split(cfg: GPTConfig, dp: int, tp: int, ep: int) -> int:
    """How many ranks a microbatch's samples split over: dp x ep, and with folded experts with a capacity
    (spmdsim.models.moe.fold) the tp ranks outside etp, each routing its own share of the rows."""
    return dp * ep * (folded_by(cfg, tp) if cfg.moe is not None and not cfg.moe.dropless else 1)


def _microbatch_problem(cfg: GPTConfig, dp: int, tp: int, ep: int, microbatches: int) -> Optional[str]:
    """Why a microbatch (`microbatches` of them dividing the batch) does not split over its ranks, or None."""
    micro, rows = cfg.batch // microbatches, _rows_split(cfg, dp, tp, ep)
    if micro % rows:
        by_tp = rows // (dp * ep)
        over = batch_split(dp, ep, by_tp, tp // by_tp)
        return f"a microbatch of {counted(micro, 'sample')} is not divisible by {over}"
    return None


def _microbatch_flags(args: Any, batch: int, rows: int) -> str:
    """The command line's ways out of a microbatch that does not split over `rows` ranks: the most
    ``--microbatches`` that do (a multiple of pp under the interleaved schedule), and the smallest ``--batch``
    from the batch up that the microbatches asked for split."""
    m, pp = microbatches(args), args.pp
    fits = [k for k in range(batch, 0, -1) if batch % k == 0 and (batch // k) % rows == 0
            and (args.schedule != "interleaved" or k % pp == 0)]
    bigger = -(-batch // (m * rows)) * m * rows
    default = "" if args.microbatches is not None else \
        f" (--microbatches {m}: the default{', 2 x pp' if pp > 1 else ''})"
    batch_way = f"--batch {bigger}{default}"
    if not fits:
        count = f"--microbatches (a multiple of pp {pp})" if args.schedule == "interleaved" else "--microbatches"
        return f"expected {batch_way}: no {count} splits batch {batch} into microbatches of a multiple of {rows}"
    each = "one microbatch" if fits[0] == 1 else "microbatches"
    return f"expected --microbatches {fits[0]} ({each} of {counted(batch // fits[0], 'sample')}), or {batch_way}"


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
                      dict(dp=dp, tp=tp, sp=sp, layouts=layouts, precision=precision, zero=zero, ep=ep, pipeline=shape,
                           cp=cp),
                      dict(dp=dp, tp=tp, ep=ep, pp=pp, microbatches=microbatches, recompute=recompute, sp=sp, kept=kept,
                           zero=zero, precision=precision, cp=cp))


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
        if problem is not None and problem == _microbatch_problem(cfg, dp, tp, ep, m):  # which flag to change
            problem += f": {_microbatch_flags(args, cfg.batch, _rows_split(cfg, dp, tp, ep))}"
    else:
        problem = mesh_problem(cfg, dp, tp, args.sp, ep)
    return problem or context_problem(cfg, cp, tp, args.sp, context_of(args))
