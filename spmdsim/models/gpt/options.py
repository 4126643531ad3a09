"""The GPT's size and training options on the command line, shared by the examples that train it (pure:
argparse only).

``model_arguments(parser)`` adds ``--vocab``, ``--pad-vocab-to``, ``--layers``, ``--d-model``, ``--heads``,
``--seq``, ``--batch``, ``--dropout``, ``--lr`` and ``--seed``; ``model_config(args, **more)`` is the GPTConfig they
say (``more``: the example's own fields, such as ``clip`` or ``moe``); ``padding_line(cfg, tp)`` says how the
vocabulary is padded and cut over tp (None without padding); ``check_lines(results, cfg, precision)`` the check's
verdict and its largest differences against the precision's tolerances; ``sizes_problem(args)`` why a mesh or
pipeline size given on the command line cannot be, ``moe_problem(args)`` why the experts' flags
(examples/train_moe_gpt.py's) cannot be, ``routing_problem(args)`` why its ``--routing`` cannot be,
``printing_problem(args)`` why a training example's ``--every``, ``--sample``, ``--temperature`` or ``--lr`` cannot
be (spmdsim.models.nets.train.run_main asks it); ``checkpoint_arguments(parser)`` adds ``--save``, ``--save-every``
and ``--resume`` (spmdsim.models.gpt.checkpoint); ``context_arguments(parser)`` adds ``--cp``, ``--cp-method`` and
``--cp-split``, and ``context_of(args)`` is the Context they say (spmdsim.models.gpt.context; None without ``--cp``),
``context_line(args)`` the header's line on it; ``unused_flags_problem(args)`` why one of their flags (or
``--schedule``, ``--replay``), typed, would do nothing in the run asked for; ``other_example_flags(parser, moe)``
notes the other GPT example's own flags on its parser; ``step_header(check)`` and ``step_row(result, check)`` are the
table of the steps a run reports, ``saved_line(args, ranks)`` the line on the checkpoint ``--save`` wrote.

``model_arguments`` adds Llama's architecture too (GPTConfig's options; docs/howto/train-gpt.md, "Llama's options"):
``--ffn``, ``--kv-heads``, ``--norm``, ``--mlp``, ``--untied``, ``--rope`` and ``--no-bias``, spelled as
``spmdsim estimate`` and ``spmdsim autoshard --machine`` spell them (one place: spmdsim.models.gpt.flags, whose
names this module gives too); `model_config` refuses a bad one in one line naming its flag.
"""
from __future__ import annotations

import argparse
import math
import re
from typing import Any, Optional

from ...base.typed_numbers import add_noted, fixed, flag_float, given_flags, said_fields, shown, typed
from ...base.validate import counted
from .flags import (ARCHITECTURE_SAID, architecture_arguments, architecture_fields, architecture_flags,
                         architecture_problem, architecture_words)
from .config import GPTConfig, said_as
from .context import Context
from .data import sample_problem
from ..axes import CONTEXT, DATA, EXPERT, PIPELINE, TENSOR
from ...programs.context import METHODS, SPLITS
from ...errors import SpmdsimError
from .params import param_specs
from .tolerances import failed_steps
from ..moe.fold import fold_problem

__all__ = ["model_arguments", "model_config", "padding_line", "check_lines", "sizes_problem", "moe_problem",
           "capacity_problem", "routing_problem", "printing_problem",
           "checkpoint_arguments", "context_arguments", "context_of", "context_line", "step_header", "step_row",
           "saved_line", "unused_flags_problem", "other_example_flags",
           "architecture_arguments", "architecture_problem", "architecture_fields", "architecture_flags",
           "architecture_words"]

#: The examples' size flags (those an example has): ranks along each mesh axis, and the pipeline's counts.
SIZE_FLAGS = (PIPELINE, DATA, EXPERT, CONTEXT, TENSOR, "microbatches", "virtual_stages")
#: The most --layers an example builds (as `spmdsim estimate`'s dry run): each layer's parameters are made on every
#: rank before the step's memory is weighed, so 100,000 layers would run for minutes before their refusal.
MAX_LAYERS = 1024
#: GPTConfig's fields -> the flag of `model_arguments` that sets each (GPTConfig's refusals name it).
MODEL_SAID = {"vocab": "--vocab", "vocab_pad_to": "--pad-vocab-to", "layers": "--layers", "d_model": "--d-model",
              "heads": "--heads", "seq": "--seq", "batch": "--batch", "dropout": "--dropout", "lr": "--lr",
              "seed": "--seed"}


#: The flags of examples/train_moe_gpt.py that examples/train_gpt.py lacks, and the reverse (`other_example_flags`).
MOE_ONLY = ("--ep", "--etp", "--experts", "--top-k", "--moe-every", "--capacity-factor", "--dropless", "--routing",
            "--aux-loss-coeff", "--z-loss-coeff", "--algorithm", "--dispatch")
DENSE_ONLY = ("--sample", "--temperature", "--clip", "--trace-out", "--reshard-after-forward", "--prefetch",
              "--shard-group")


#: What Megatron-LM's --micro-batch-size is in the GPT examples' flags, which have no flag for it.
MICRO_BATCH_SIZE = ("Megatron-LM's sequences per microbatch on each data-parallel rank; here --batch N is a step's "
                    "sequences on all ranks together and --microbatches M cuts each rank's share into M")


def other_example_flags(parser: Any, moe: bool) -> None:
    """Note on `parser` (a spmdsim.base.once_parser.OnceParser: its `elsewhere`) the flags only the other GPT
    example takes, so that one typed here is said to be that example's (by spelling alone `train_gpt.py --ep 2`
    meets "did you mean --kept or --help?", and `train_moe_gpt.py --sample 0` "did you mean --save?")."""
    where = "examples/train_gpt.py's (the dense GPT's)" if moe else \
        "examples/train_moe_gpt.py's (the mixture-of-experts GPT: docs/howto/experts.md)"
    parser.elsewhere = {flag: where for flag in (DENSE_ONLY if moe else MOE_ONLY)}
    parser.elsewhere["--micro-batch-size"] = MICRO_BATCH_SIZE  # (difflib's "did you mean --microbatches?": a count)


def model_arguments(parser: Any) -> None:
    """Add the GPT's size and training options (GPTConfig's defaults for the examples) to a parser."""
    add_noted(parser, "--vocab", type=int, default=128,
              help="vocabulary size (the text's ids are bytes below 128; a larger one, such as GPT-2's padded 50304, "
                   "shapes the embedding and head)")
    add_noted(parser, "--pad-vocab-to", type=int, default=1, metavar="N",
              help="pad the vocabulary to a multiple of N, the padded logits masked out of the loss (Megatron pads "
                   "to 128 x tp; default 1: no padding)")
    add_noted(parser, "--layers", type=int, default=4, metavar="N", help="transformer blocks (default 4)")
    add_noted(parser, "--d-model", type=int, default=128, metavar="N", help="the hidden width (default 128)")
    add_noted(parser, "--heads", type=int, default=4, metavar="N",
              help="attention heads, split over tp (default 4)")
    add_noted(parser, "--seq", type=int, default=64, metavar="N", help="tokens per sequence (default 64)")
    add_noted(parser, "--batch", type=int, default=8, metavar="N",
              help="sequences per step, all ranks together (default 8)")
    add_noted(parser, "--dropout", type=flag_float, default=0.1, metavar="P",  # refused as typed: "--lr -1"
              help="dropout probability, in [0, 1) (default 0.1)")
    add_noted(parser, "--lr", type=flag_float, default=3e-3, help="AdamW's learning rate (default 0.003)")
    add_noted(parser, "--seed", type=int, default=0,
              help="seed of the initial parameters, the batches and the dropout masks (default 0)")
    architecture_arguments(parser)


def directory(text: str) -> str:
    """argparse type of ``--save`` and ``--resume``: a directory's path, refused when empty (`--save ""` said
    "--save : cannot make the directory: No such file or directory", the value unseen)."""
    if not text:
        raise argparse.ArgumentTypeError("'' is empty; expected a directory's path")
    return text


def checkpoint_arguments(parser: Any) -> None:
    """Add the trainer's checkpoint options (spmdsim.models.gpt.train's `save`, `save_every`, `resume`) to a parser."""
    parser.add_argument("--save", type=directory, default=None, metavar="DIR",
                        help="write a checkpoint into DIR after the last step (a file per rank and checkpoint.json; "
                             "docs/howto/checkpoints.md)")
    add_noted(parser, "--save-every", type=int, default=0, metavar="N",
              help="with --save: a checkpoint after every N-th step too (each replaces the last; 0, the "
                   "default: after the last step only)")
    parser.add_argument("--resume", type=directory, default=None, metavar="DIR",
                        help="continue from the checkpoint in DIR to --steps, as the run that never stopped (on "
                             "another mesh, pipeline, ZeRO stage or precision too)")


def context_arguments(parser: Any) -> None:
    """Add context parallelism's options (spmdsim.models.gpt.train's `cp` and `context`) to a parser."""
    parser.add_argument("--cp", type=int, default=1,
                        help="context-parallel ranks: each sequence split over them for the whole block (default 1)")
    add_noted(parser, "--cp-method", choices=METHODS, default="ring",
              help="with --cp: how attention meets the split sequence: ring (K/V passed round point-to-point), "
                   "allgather (Llama 3's) or alltoall (DeepSpeed-Ulysses); default ring")
    add_noted(parser, "--cp-split", choices=SPLITS, default="balanced",
              help="with --cp: balanced (chunks r and 2cp-1-r, as Megatron-LM for causal masks) or naive; default "
                   "balanced")


def context_of(args: Any) -> Optional[Context]:
    """The context-parallel options `context_arguments` read (a Context), or None without --cp above 1."""
    return Context(args.cp_method, args.cp_split) if args.cp > 1 else None


def context_line(args: Any) -> Optional[str]:
    """The header's line on context parallelism (`context_arguments`' options), or None without --cp above 1."""
    if args.cp == 1:
        return None
    return (f"context parallelism: each sequence split over {args.cp} ranks ({args.cp_split}), attention by "
            f"{args.cp_method}")


def unused_flags_problem(args: Any) -> Optional[str]:
    """Why a flag of `context_arguments` or `checkpoint_arguments` typed would do nothing in the run asked for, or
    None (pure: alike on every rank, before any collective): ``--cp-method`` or ``--cp-split`` without ``--cp`` 2+,
    ``--save-every 0`` without ``--save`` (another N: checkpoint_problem's), ``--schedule gpipe`` or ``1f1b``
    without ``--pp`` or ``--microbatches`` 2+ (1f1b ran unpipelined, gpipe a pipeline of one cell), ``--replay``
    with ``--steps 1`` or ``--dry-run`` (nothing replayed). A flag left at its default is never refused."""
    if args.cp == 1:
        for flag in given_flags(args, "--cp-method", "--cp-split"):  # read only by a split sequence
            value = getattr(args, flag[2:].replace("-", "_"))
            return f"{flag} {value} is for a sequence split over context-parallel ranks: give --cp 2 or more with it"
    if args.save is None and args.save_every == 0 and given_flags(args, "--save-every"):
        return "--save-every 0 (a checkpoint after the last step only) is --save's: give --save DIR with it"
    if getattr(args, "replay", False) and (getattr(args, "dry_run", False) or args.steps == 1):  # nothing replayed
        return "--replay captures step 0 and replays it for the later steps: " + ("a dry run has no values; leave "
                "out --replay or --dry-run" if args.dry_run else "--steps 1 has none; give --steps 2 or more")
    schedule = getattr(args, "schedule", "interleaved")  # interleaved without --pp: its chunks' own refusal
    if schedule != "interleaved" and args.pp == 1 and (args.microbatches or 1) == 1 and given_flags(args, "--schedule"):
        return (f"--schedule {schedule} orders a pipeline's microbatches: give --pp 2 or more (or --microbatches 2 or "
                "more) with it")
    return None


def step_header(check: bool) -> str:
    """The header of the steps' table (`step_row`'s columns), the differences from one numpy process with `check`."""
    return " step    loss  collectives  bytes sent" + (
        "  difference from one numpy process: loss grads params" if check else "")


def step_row(result: Any, check: bool) -> str:
    """One step's row under `step_header`: a StepResult's (spmdsim.models.gpt.train) loss, collectives and bytes
    sent, with `check` its largest differences from one numpy process."""
    diffs = "".join(f"  {e:.1e}" for e in result.errors) if check else ""
    loss = fixed(result.loss, 4)
    return f"{result.step:5d}  {loss:>6}  {result.calls:11d}  {result.bytes_sent:10,}           {diffs}"


def saved_line(args: Any, ranks: int) -> str:
    """The line on the checkpoint `checkpoint_arguments`' --save wrote after the last step, a file per rank."""
    return (f"checkpoint of step {args.steps} written to {args.save} ({counted(ranks, 'file')} and "
            "checkpoint.json)")


def model_config(args: Any, **more: Any) -> GPTConfig:
    """The GPTConfig of `model_arguments`' parsed options (Llama's among them: a bad one refused in one line
    naming its flag, `architecture_problem`), with the example's own fields `more`."""
    # GPTConfig's refusals name the flags typed ("--d-model 30 must be divisible by --heads 4"), an example's own
    # fields (`more`) too where it has the flag (--clip), and a size left alone as the default ("the default
    # d_model 128 must be divisible by --heads 3")
    said, defaults = said_fields(args, {**MODEL_SAID, **ARCHITECTURE_SAID,
                                        **{name: f"--{name}" for name in more if hasattr(args, name)}})
    problem = architecture_problem(args, said=said.get("heads", "the default heads"))
    if problem:  # pure: every rank alike, before any collective
        raise SpmdsimError(problem)
    if isinstance(args.layers, int) and args.layers > MAX_LAYERS:
        raise SpmdsimError(f"--layers {args.layers:,} is too many; expected at most {MAX_LAYERS:,} (every layer's "
                           "parameters are made on each rank)")
    with said_as(said, defaults):
        return GPTConfig(vocab=args.vocab, layers=args.layers, d_model=args.d_model, heads=args.heads, seq=args.seq,
                         batch=args.batch, dropout=args.dropout, lr=args.lr, seed=args.seed,
                         vocab_pad_to=args.pad_vocab_to, **architecture_fields(args), **more)


def check_lines(results: list, cfg: GPTConfig, precision: str, checked: bool = True) -> list[str]:
    """The check's lines after a run: its verdict over the steps' StepResults (spmdsim.models.gpt.train), then the
    largest difference against the tolerance (fp64), or per kind against the policy's (spmdsim.models.gpt.mixed).
    Not `checked`: only where the run's own steps overflowed (step_check.agreed_overflow), or nothing."""
    if not checked:
        return [f"overflow: {r.overflow}" for r in results if r.overflow and r.own_overflow][:1]
    failed, flipped = failed_steps(results)
    out = [f"check: {counted(len(results), 'step')} vs one numpy process (loss, {len(param_specs(cfg))} gradients and "
           f"parameters each): {'PASS' if not failed else f'FAILED at {failed} steps'}"]
    overflowed = next((r for r in results if r.overflow and not r.own_overflow), None)
    if overflowed is not None:  # numpy's warnings would have printed its source lines (reference_step.Overflows)
        out.append(f"overflow: step {overflowed.step}'s {overflowed.overflow} in one numpy process (the run "
                   "computes the same values)")
    if flipped and not failed:
        out += [f"  {counted(flipped, 'step')} passed as an FP8 flip: over the gradients' tolerance, each value within "
                "one", '  e5m2 step more (docs/explanation/tolerances.md, "FP8")']
    if precision == "fp64":
        worst = max(max(r.errors) for r in results)
        return out + [f"largest difference {worst:.1e} of the tensor's largest entry (tolerance "
                      f"{results[0].tolerances[0]:.0e})"]
    kinds = ("loss", "gradients", "parameters")
    out += ["largest differences: " + ", ".join(f"{what} {max(r.errors[i] for r in results):.1e}"
                                                for i, what in enumerate(kinds)),
            f"tolerances under {precision}: " + ", ".join(f"{what} {results[0].tolerances[i]:.1e}"
                                                          for i, what in enumerate(kinds))]
    rounding = [r.rounding for r in results if r.rounding is not None]
    if rounding:  # spmdsim.models.gpt.step_check.rounding_ratio
        out.append(f"each gradient within {max(rounding):.2f} of what its own rounding allows (at most 1)")
    return out


def padding_line(cfg: GPTConfig, tp: int) -> Optional[str]:
    """One line on the vocabulary's padding over `tp` ranks, or None when cfg pads nothing."""
    extra = cfg.padded_vocab - cfg.vocab
    if not extra:
        return None
    rows = "row" if extra == 1 else "rows"
    return (f"vocab {cfg.vocab:,} padded to {cfg.padded_vocab:,} (a multiple of {cfg.vocab_pad_to:,}): "
            f"{cfg.padded_vocab // tp:,} rows per tp rank, {extra:,} padded {rows} masked")


def sizes_problem(args: Any) -> Optional[str]:
    """Why a size the command line gave (``--pp``, ``--dp``, ``--ep``, ``--cp``, ``--tp``, ``--microbatches``,
    ``--virtual-stages``: those `args` has) cannot be, or None: each given must be at least 1. Checked before
    any is derived from another, so a message names the value the user typed; None (not given) is the default,
    and 0 is refused rather than read as "not given"."""
    for name in SIZE_FLAGS:
        value = getattr(args, name, None)
        if value is not None and value < 1:
            return f"--{name.replace('_', '-')} {value!r} must be at least 1"
    return None


def printing_problem(args: Any) -> Optional[str]:
    """Why a training example's ``--every``, ``--sample``, ``--temperature`` or ``--lr`` (those it has and was given)
    cannot be, or None: checked before the first step, not when the last one prints or samples, nor by the
    optimizer, which names its argument ("lr -1.0") where the user typed a flag ("--lr -1")."""
    every = getattr(args, "every", None)
    if every is not None and every < 1:
        return f"--every {every!r} must be at least 1 (print every N steps)"
    problem = sample_problem(getattr(args, "sample", None))
    if problem:
        return problem
    temperature = getattr(args, "temperature", None)
    if temperature is not None and not (math.isfinite(temperature) and temperature >= 0):
        return f"--temperature {shown(temperature)} must be a finite number >= 0 (0: greedy)"
    lr = getattr(args, "lr", None)  # None: the example's default
    if lr is not None and not (math.isfinite(lr) and lr >= 0):  # as torch.optim, spmdsim.nn.optim and GPTConfig
        return f"--lr {shown(lr)} must be a finite number >= 0"
    return None


def capacity_problem(dropless: bool, factor: float, typed_here: bool) -> Optional[str]:
    """Why ``--capacity-factor`` `factor` (`typed_here`: the command line gave it) cannot be beside ``--dropless``
    or not, or None: dropless has no capacity, so a factor typed beside it is refused; else it is a finite
    number > 0. The MoE example's check and ``spmdsim estimate``'s."""
    if dropless and typed_here:
        return (f"--capacity-factor {typed(factor)} sets the experts' capacity, which --dropless removes: give "
                "one of them, not both")
    if not dropless and not (math.isfinite(factor) and factor > 0):
        return f"--capacity-factor {typed(factor)} must be a finite number > 0 (or --dropless)"
    return None


def moe_problem(args: Any) -> Optional[str]:
    """Why the experts' flags (``--experts``, ``--top-k``, ``--moe-every``, ``--etp``, ``--capacity-factor``,
    ``--aux-loss-coeff``, ``--z-loss-coeff``: those of examples/train_moe_gpt.py) cannot be, naming the flag as
    typed (MoEConfig's own refusals name its fields: "MoEConfig top_k 3 ..."), or None; pure: every rank alike,
    before any collective. ``--capacity-factor`` typed beside ``--dropless``, which has no capacity, is refused
    (its default is not), nor ``--moe-every`` past ``--layers`` (no block an MoE layer)."""
    if args.experts < 1 or args.moe_every < 1:
        flag, value = ("--experts", args.experts) if args.experts < 1 else ("--moe-every", args.moe_every)
        return f"{flag} {value} must be at least 1"
    if args.top_k not in (1, 2):
        return f"--top-k {args.top_k} must be 1 or 2 (experts per token)"
    if args.top_k > args.experts:
        return f"--top-k {args.top_k} must not exceed --experts {args.experts}"
    if args.etp is not None and args.etp < 1:
        return f"--etp {args.etp} must be at least 1"
    if args.etp is not None and fold_problem(args.tp, args.etp):
        return f"--etp {args.etp}: {fold_problem(args.tp, args.etp)}"
    problem = capacity_problem(args.dropless, args.capacity_factor, bool(given_flags(args, "--capacity-factor")))
    if problem:
        return problem
    for flag, value in (("--aux-loss-coeff", args.aux_loss_coeff), ("--z-loss-coeff", args.z_loss_coeff)):
        if not (math.isfinite(value) and value >= 0):
            return f"{flag} {typed(value)} must be a finite number >= 0"
    if 1 <= args.layers < args.moe_every:  # a dense GPT, printing experts it does not have (GPTConfig refuses it)
        none = "no MoE layer of the only block" if args.layers == 1 else \
            f"none of the {args.layers} blocks an MoE layer"
        return (f"--moe-every {args.moe_every} makes {none} (the first would be h{args.moe_every - 1}); expected at "
                f"most --layers {args.layers}")
    return None


def routing_problem(args: Any) -> Optional[str]:
    """Why examples/train_moe_gpt.py's ``--routing`` cannot be beside ``--dry-run`` or without it, or None: a dry
    run's routing (it has no values to route by), needed with ``--dropless``; a run with values routes by its
    router; ``--dispatch`` prints what each step sent, which a dry run does not show. Read from the flags
    (``--dry-run`` is a dry run: run_main refuses it without ``--ranks``)."""
    dry = bool(getattr(args, "dry_run", False))
    if args.routing and not dry:
        return (f"--routing {args.routing} sets a dry run's routing (--ranks N --dry-run); a run with values routes "
                "by its router")
    if dry and args.dispatch:
        return ("--dispatch prints each reported step's tokens rank -> rank, which a dry run (--dry-run) does not "
                "show: leave one of them out")
    if dry and args.dropless and not args.routing:
        return ("--dry-run with --dropless needs --routing balanced or --routing worst: the dry run has no values to "
                "route by, and the bytes depend on it")
    return None


def default_split(rest: int, problem_of: Any, ranks: int, axis: str = TENSOR, most: int = 4,
                  of: str = "") -> tuple[int, int, Optional[str]]:
    """(dp, n, problem) of `rest` ranks (a stage's: `ranks` / pp x cp) when the command line sets neither --dp nor
    --`axis`: n the largest of `most` (0: `rest`) to 1 that divides `rest` and whose mesh runs the model
    (`problem_of(dp, n)` None). Where none does, each one's problem (the one problem where it is the same for
    each: the schedule's, the batch's), and the world sizes up to 64 that run it as configured. `of`: what the
    `rest` ranks are, said after their count. n divides `rest`: `mpiexec -n 6 python examples/train_gpt.py`
    takes a tp that divides 6, not min(6, 4) = 4."""
    tried = []
    for n in range(min(rest, most or rest), 0, -1):
        if rest % n == 0:
            problem = problem_of(rest // n, n)
            if problem is None:
                return rest // n, n, None
            tried.append((n, problem))
    per = ranks // rest
    fits = [k * per for k in range(1, 64 // per + 1)
            if any(k % n == 0 and problem_of(k // n, n) is None for n in range(1, min(k, most or k) + 1))]
    runs = "no world size up to 64 runs it as configured" if not fits else \
        f"it runs on {fits[0]} ranks" if len(fits) == 1 else \
        f"it runs on {', '.join(map(str, fits[:-1]))} or {fits[-1]} ranks"
    if len({problem for _, problem in tried}) == 1:  # (5 ranks: tp 1 alone to try) the worlds that run, where any
        more = f"; {runs} (or set --dp and --{axis}, or the model's sizes)" if fits and "; it runs on" not in \
            tried[0][1] else ""
        return rest // tried[0][0], tried[0][0], tried[0][1] + more
    ways = {problem.partition(": expected ")[2] for _, problem in tried}  # the same way out of each: said once
    common = f": expected {ways.pop()}" if len(ways) == 1 and "" not in ways else ""
    each = _each_said([(n, problem.partition(": expected ")[0] if common else problem) for n, problem in tried],
                      axis, rest)
    return rest, 1, (f"no dp x {axis} of {counted(rest, 'rank')}{of} runs it ({each}){common}; {runs} (or set --dp "
                     f"and --{axis}, or the model's sizes)")


def _each_said(tried: list, axis: str, rest: int) -> str:
    """Each (n, problem) of `tried` said as "tp 3: <problem>"; three or more in a row whose problems differ only in
    n (and rest / n) said once: "ep 8192: <problem>, and likewise ep 4096, ..., 16" (8,192 ranks try 14 splits)."""
    def shapes(n: int, problem: str) -> set:  # the problem with n left out, and with rest / n too
        return {re.sub(rf"\b{n}\b", "#", text) for text in (problem, re.sub(rf"\b{rest // n}\b", "@", problem))}

    runs: list = []
    for n, problem in tried:
        if not (runs and shapes(n, problem) & shapes(*runs[-1][0])):
            runs.append([])
        runs[-1].append((n, problem))
    said = []
    for run in runs:
        first, more = run[0], ", ".join(str(n) for n, _ in run[1:-1])
        said += [f"{axis} {n}: {problem}" for n, problem in run] if len(run) < 3 else \
            [f"{axis} {first[0]}: {first[1]}, and likewise {axis} {more} and {run[-1][0]}"]
    return "; ".join(said)
