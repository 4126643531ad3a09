"""`spmdsim estimate gpt`: one rank's memory, FLOPs, bytes and predicted step time per pipeline stage.

    spmdsim estimate gpt --layers 48 --hidden 6144 --heads 64 --seq 2048 --vocab 51200 --micro-batch 4 \\
        --global-batch 4 --tp 8 --pp 1 --dp 1 --sp --recompute selective --precision bf16-mixed \\
        --machine a100-dgx

The figures are those of the dry run of the real training step (spmdsim.tools.estimate.ledger), priced at
the precision's widths and timed on the machine file (spmdsim.tools.estimate.steptime); docs/howto/estimate.md.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

from ...errors import SpmdsimError
from ...base.sizes import format_size
from ...base.validate import counted
from ...programs.viz.table import wrap_lines
from ...base.typed_numbers import add_noted, flag_float, said_fields, typed
from ...models.axes import DATA, EXPERT, PIPELINE, TENSOR

__all__ = ["register", "run", "config_record", "CONFIG_FIELDS"]

GIB = 1024 ** 3


def no_moe_block(layers: int) -> str:
    """What too large a moe_every makes of `layers` blocks ("none of the 1 blocks an MoE layer" was said)."""
    return "no MoE layer of the only block" if layers == 1 else f"none of the {layers} blocks an MoE layer"


def _shipped() -> list:
    """The shipped machines' names (spmdsim.tools.estimate.machine.machines), for --machine's help."""
    from ..estimate.machine import machines

    return list(machines())


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "estimate",
        help="per-rank memory, FLOPs, bytes and step time of a GPT configuration, from its dry run",
        description=("Dry-run one training step of the GPT on a (pp, dp, tp) mesh of simulated ranks (shapes "
                     "only, one rank per stage) and print, for the first, a middle and the last stage (and the "
                     "slowest and the fullest), what one rank holds (priced at --precision), the FLOPs it "
                     "executes, the bytes it sends by kind and link level, and the step time predicted on "
                     "--machine (docs/howto/estimate.md)."))
    parser.add_argument("network", choices=("gpt",), help="the network (the GPT of spmdsim.models.gpt)")
    # The defaults are a toy GPT (it runs in a second): say so, so that a user sizing a real model sets each one.
    for name, default, what in (
            ("layers", 4, "transformer blocks"), ("hidden", 128, "the model width (d_model)"),
            ("heads", 4, "attention heads"), ("seq", 64, "sequence length"), ("vocab", 128, "vocabulary size"),
            ("micro-batch", 1, "sequences per microbatch"), ("global-batch", 8, "sequences per step"),
            (TENSOR, 1, "tensor-parallel ranks"), (PIPELINE, 1, "pipeline stages"),
            (DATA, 1, "data-parallel ranks"),
            ("virtual-stages", 1, "model chunks per stage (interleaved)")):
        add_noted(parser, f"--{name}", type=int, default=default, metavar="N", help=f"{what} (default {default})")
    from ...programs.pipeline.options import split_arguments

    split_arguments(parser)  # --first-stage-layers, --last-stage-layers, --stage-layers (default: balanced)
    parser.add_argument("--pad-vocab-to", type=int, default=1, metavar="N",
                        help="pad the vocabulary to a multiple of N (Megatron pads to 128 x tp: GPT-2's 50257 "
                             "becomes 50304 at tp 1, 51200 at tp 8); default 1: no padding")
    # Llama's architecture (spmdsim.models.gpt.GPTConfig's options; docs/howto/estimate.md, "A Llama"): each default the GPT's,
    # the flags the examples take (spmdsim.models.gpt.options).
    from ...models.gpt.flags import architecture_arguments

    architecture_arguments(parser, width="--hidden")
    parser.add_argument("--dropout", type=flag_float, default=0.1, metavar="P",
                        help="dropout probability of the embeddings, the attention and the residual branches "
                             "(default 0.1, GPT-3's; 0: none, as Llama trains: no dropout kernels, masks or kept "
                             "outputs)")
    from ...programs.pipeline.options import schedule_choice

    parser.add_argument("--schedule", type=schedule_choice, default=None, choices=("gpipe", "1f1b", "interleaved"),
                        help="pipeline schedule (default 1f1b; interleaved with --virtual-stages > 1; any case: "
                             "1F1B, GPipe)")
    parser.add_argument("--sp", action="store_true", help="sequence parallelism (Megatron)")
    parser.add_argument("--recompute", default="none", choices=("none", "selective", "full"),
                        help="activation recomputation (default none)")
    parser.add_argument("--zero", type=int, default=0, choices=(0, 1, 2),
                        help="1: the distributed optimizer (ZeRO-1: states sharded over dp); 2: the gradients too "
                             "(ZeRO-2; default 0)")
    parser.add_argument("--kept", default="graph", choices=("graph", "megatron"),
                        help="what each block keeps for backward: spmdsim's graph (default), or Megatron's set "
                             "(docs/howto/memory.md, \"Megatron's kept set\"; `autoshard --machine` searches with "
                             "megatron and prints its choice as an estimate command)")
    parser.add_argument("--experts", type=int, default=0, metavar="N",
                        help="mixture-of-experts MLPs with N experts (0: a dense GPT; docs/howto/experts.md)")
    parser.add_argument("--ep", type=int, default=1, metavar="N", help="expert-parallel ranks of each stage")
    parser.add_argument("--top-k", type=int, choices=(1, 2), help="experts per token (default 2)")
    parser.add_argument("--moe-every", type=int, metavar="N", help="every N-th block is an MoE layer (default 2)")
    parser.add_argument("--capacity-factor", type=flag_float, metavar="F",
                        help="each expert's slots: ceil(k x seq x F / experts) per sequence, at most seq (default 1)")
    parser.add_argument("--dropless", action="store_true", help="no capacity: counts exchanged, then Alltoallv")
    parser.add_argument("--routing", choices=("balanced", "worst"),
                        help="how the dry run routes (it has no router values): balanced (default), or worst (every "
                             "token to experts 0..k-1)")
    parser.add_argument("--precision", default="bf16-mixed", choices=("fp64", "bf16-mixed", "fp16-mixed"),
                        help="the widths the ledger prices each tensor at (default bf16-mixed)")
    parser.add_argument("--machine", default="a100-dgx",
                        help=f"a shipped machine ({', '.join(_shipped())}; default a100-dgx) or a machine file's "
                             "path (spmdsim calibrate --machine-out)")
    parser.add_argument("--overlap", metavar="tp,pp",
                        help="also hide, as NeMo's recipes run them: tp, the layers' tensor-parallel collectives "
                             "under their GEMMs (Megatron's --tp-comm-overlap); pp, the pipeline's messages under "
                             "the microbatches' compute (overlap_p2p_comm; interleaved schedule only); each at most "
                             "that compute's time. Default: only the dp gradient sums, under the backward")
    parser.add_argument("--json", action="store_true", help="print the ledger as JSON")
    parser.set_defaults(func=run)


#: The MoE layers' options and their defaults, set in `_config`: None from the parser says the user gave none,
#: so that a dense GPT (no --experts) refuses only what was given (it uses none of them).
MOE_DEFAULTS = {"top_k": 2, "moe_every": 2, "capacity_factor": 1.0, "routing": "balanced"}


#: The options `--json` writes under "config", each by its argparse name (after `_config` filled the MoE
#: defaults): named here, so that an attribute argparse or main() adds (func, _usage_parser, ...) stays out.
CONFIG_FIELDS = ("network", "layers", "hidden", "heads", "seq", "vocab", "micro_batch", "global_batch", TENSOR,
                 PIPELINE, DATA, "virtual_stages", "pad_vocab_to", "schedule", "sp", "recompute", "zero", "kept", "experts",
                 EXPERT, "top_k", "moe_every", "capacity_factor", "dropless", "routing", "precision", "machine",
                 "ffn", "kv_heads", "norm", "mlp", "untied", "rope", "no_bias", "dropout", "overlap", "attention",
                 "first_stage_layers", "last_stage_layers", "stage_layers")


def config_record(args: argparse.Namespace) -> dict[str, Any]:
    """The "config" of `--json`: the command and its options as given (the MoE ones with their defaults)."""
    return {"command": "estimate", **{name: getattr(args, name) for name in CONFIG_FIELDS}}


#: GPTConfig's fields -> the flag of `spmdsim estimate` that sets each (GPTConfig's refusals name it).
ESTIMATE_SAID = {"vocab": "--vocab", "vocab_pad_to": "--pad-vocab-to", "layers": "--layers", "d_model": "--hidden",
                 "heads": "--heads", "seq": "--seq", "batch": "--global-batch", "dropout": "--dropout"}


def _config(args: argparse.Namespace) -> tuple[Any, int]:
    from ...models.gpt.config import GPTConfig, said_as
    from ...models.moe.config import MoEConfig
    from ...models.gpt.flags import ARCHITECTURE_SAID, architecture_fields, architecture_problem

    if args.experts == 0:  # a dense GPT: an MoE option given is refused, not ignored
        given = [flag for flag in MOE_DEFAULTS if getattr(args, flag) is not None] + ["dropless"] * args.dropless
        if given:
            value = getattr(args, given[0])
            shown = "" if value is True else f" {value:g}" if isinstance(value, float) else f" {value}"
            raise SpmdsimError(f"--{given[0].replace('_', '-')}{shown} sets the MoE layers: give --experts N")
    for flag, default in MOE_DEFAULTS.items():
        if getattr(args, flag) is None:
            setattr(args, flag, default)
    for name in ("layers", "hidden", "heads", "seq", "vocab", "micro_batch", "global_batch", TENSOR, PIPELINE, DATA,
                 "virtual_stages", EXPERT, "moe_every", "pad_vocab_to"):
        value = getattr(args, name)
        if value < 1:
            raise SpmdsimError(f"--{name.replace('_', '-')} {value} must be >= 1")
    # its refusals name the flags typed (--hidden, --rope), and a size left alone as the default
    said, defaults = said_fields(args, {**ESTIMATE_SAID, **ARCHITECTURE_SAID})
    problem = architecture_problem(args, said=said.get("heads", "the default heads"))
    if problem:
        raise SpmdsimError(problem)
    if not (math.isfinite(args.dropout) and 0 <= args.dropout < 1):
        raise SpmdsimError(f"--dropout {typed(args.dropout)} must be in [0, 1) (0: no dropout, as Llama trains)")
    if args.experts < 0:
        raise SpmdsimError(f"--experts {args.experts} must be >= 0 (0: no MoE layers)")
    if args.experts and args.top_k > args.experts:
        raise SpmdsimError(f"--top-k {args.top_k} must not exceed --experts {args.experts}")
    if args.experts and not args.dropless and not (math.isfinite(args.capacity_factor) and args.capacity_factor > 0):
        raise SpmdsimError(f"--capacity-factor {typed(args.capacity_factor)} must be a finite number > 0 (or --dropless)")
    if not args.experts and args.ep > 1:
        raise SpmdsimError(f"--ep {args.ep} splits experts: give --experts N (a multiple of {args.ep})")
    if args.experts and args.experts % args.ep:
        raise SpmdsimError(f"--experts {args.experts} must be a multiple of --ep {args.ep} (each ep rank holds "
                           "the same number of experts)")
    per_step = args.micro_batch * args.dp * args.ep  # the dense layers' batch is split over dp x ep
    if args.global_batch % per_step:
        what = "--micro-batch x --dp x --ep" if args.ep > 1 else "--micro-batch x --dp"
        sizes = f"{args.micro_batch} x {args.dp} x {args.ep}" if args.ep > 1 else f"{args.micro_batch} x {args.dp}"
        raise SpmdsimError(f"--global-batch {args.global_batch} must be a multiple of {what} ({sizes} = {per_step})")
    if args.experts and args.moe_every > args.layers:
        raise SpmdsimError(f"--moe-every {args.moe_every} makes {no_moe_block(args.layers)} "
                           f"(the first would be block {args.moe_every - 1}, counted from 0); expected at most "
                           f"--layers {args.layers}")
    moe = MoEConfig(experts=args.experts, top_k=args.top_k, every=args.moe_every,
                    capacity_factor=args.capacity_factor, dropless=args.dropless,
                    dry_routing=args.routing) if args.experts else None
    with said_as(said, defaults):
        cfg = GPTConfig(vocab=args.vocab, d_model=args.hidden, heads=args.heads, layers=args.layers, seq=args.seq,
                        batch=args.global_batch, dropout=args.dropout, moe=moe, vocab_pad_to=args.pad_vocab_to,
                        **architecture_fields(args))
    return cfg, args.global_batch // per_step


def _split(args: argparse.Namespace) -> Any:
    """The layers per chunk that --first-stage-layers, --last-stage-layers or --stage-layers give (None: none
    given, balanced), or the one-line SpmdsimError naming the flag (spmdsim.programs.pipeline.options.layer_split)."""
    from ...programs.pipeline.options import layer_split

    split, problem = layer_split(args, args.layers, args.pp, args.virtual_stages)
    if problem:
        raise SpmdsimError(problem)
    return split


def run(args: argparse.Namespace) -> int:
    from ..estimate.ledger import PRECISIONS, gpt_ledger, peak_bytes, stage_memory, stage_times, unmappable
    from ..estimate.machine import load_machine
    from ..estimate.steptime import Pipeline, assumptions
    from ...base.sizes import UnmappableError
    from ...models.gpt.flags import architecture_words
    from ...models.gpt.stages import chunk_parts

    cfg, microbatches = _config(args)
    split = _split(args)
    schedule = args.schedule or ("interleaved" if args.virtual_stages > 1 else "1f1b")
    overlap = _overlap(args.overlap, args.pp, schedule)
    machine = load_machine(args.machine)
    start = time.perf_counter()
    try:
        stages = gpt_ledger(cfg, args.pp, args.dp, args.tp, sp=args.sp, microbatches=microbatches,
                            schedule=schedule, virtual=args.virtual_stages, recompute=args.recompute, zero=args.zero,
                            kept=args.kept, gpus_per_node=machine.gpus_per_node, ep=args.ep, split=split)
    except UnmappableError as exc:  # a block beyond this machine's address space: more than any GPU's memory
        raise unmappable(exc, args.precision, machine.memory_bytes,
                         f"the {machine.name}'s {_gib(machine.memory_bytes)} per GPU") from None
    seconds = time.perf_counter() - start
    pipeline = Pipeline(args.pp, microbatches, args.virtual_stages, schedule)
    times = stage_times(stages, machine, args.precision, pipeline, overlap)
    # Whether a rank fits: what it holds (the memory line) and, for a moment, the largest kernel's blocks beside it
    # (its peak: the same figure the search by a machine file compares with its memory limit)
    memories = [stage_memory(st, args.precision, args.zero) for st in stages]
    # The first, a middle and the last stage, and the slowest and the fullest where they are others (an uneven
    # split can make a stage between them set the step or the memory line)
    slowest = max(range(len(stages)), key=lambda s: times[s].total_s)  # a step ends with its slowest stage
    fullest = max(range(len(stages)), key=lambda s: memories[s].peak)
    shown = sorted({0, len(stages) // 2, len(stages) - 1, slowest, fullest})
    rows = [(stages[s], memories[s], times[s]) for s in shown]
    ranks = args.pp * args.dp * args.ep * args.tp
    use = _utilization(stages, max(t.total_s for t in times), ranks, machine, args.precision)
    assumed = assumptions(machine, overlap=overlap)
    if args.json:
        print(json.dumps({"config": config_record(args),
                          "microbatches": microbatches, "dry_run_s": seconds,
                          "chunk_layers": [p.stop - p.first for p in chunk_parts(cfg, args.pp * args.virtual_stages,
                                                                                  split)],
                          "memory_bytes_per_gpu": machine.memory_bytes,
                          "fits": peak_bytes(memories) <= machine.memory_bytes,
                          "step_time_s": max(t.total_s for t in times),
                          "utilization": use.as_json(), "assumptions": assumed,
                          "stages": [_as_json(st, mem, timing, args.precision) for st, mem, timing in rows]},
                         default=str, indent=1))
        return 0
    mesh = f"pp {args.pp} x dp {args.dp} x ep {args.ep} x tp {args.tp}" if cfg.moe else \
        f"pp {args.pp} x dp {args.dp} x tp {args.tp}"
    head = [f"GPT {counted(args.layers, 'layer')}, hidden {args.hidden}, {counted(args.heads, 'head')}, seq {args.seq}, "
            f"vocab {cfg.vocab_words}{architecture_words(cfg)}; "
            f"global batch {args.global_batch}",
            f"mesh {mesh} ({ranks:,} rank{'s' if ranks > 1 else ''}){_sp(args)}; "
            f"{counted(microbatches, 'microbatch')} of {args.micro_batch} per {f'{DATA} x {EXPERT}' if cfg.moe else DATA} rank, "
            f"{schedule}",
            f"recompute {args.recompute}, ZeRO {args.zero}{_alone(args)}, kept {args.kept}; machine {machine.name}"]
    if args.tp > machine.gpus_per_node:  # said: each layer's tensor-parallel collectives cross the nodes
        head.append(f"tp {args.tp} spans {-(-args.tp // machine.gpus_per_node)} of the {machine.name}'s "
                    f"{machine.gpus_per_node}-GPU nodes: its collectives are priced on the cluster links")
    chunks = args.pp * args.virtual_stages
    over = f"{args.layers} over {chunks} {'chunks' if args.virtual_stages > 1 else 'stages'}"
    if split is not None:  # the user's split: said, with the flags it came from
        from ...programs.pipeline.options import split_words

        head.append(f"layers split as given: {over}, {split_words(split)}")
    elif chunks > 1 and args.layers % chunks:  # said, not left to be found: the slowest chunk sets the step
        counts = [p.stop - p.first for p in chunk_parts(cfg, chunks)]
        head.append(f"layers uneven: {over}, {', '.join(map(str, counts))} (the first take one more)")
    if cfg.moe:
        m = cfg.moe
        moe_layers = sum(cfg.is_moe(i) for i in range(cfg.layers))
        capacity = "dropless" if m.dropless else f"capacity factor {m.capacity_factor:g}"
        head.append(f"experts: {counted(moe_layers, 'MoE layer')} of {m.experts} experts, top-{m.top_k}, {capacity}; "
                    f"{m.experts // args.ep} per ep rank; the dry run routes {m.dry_routing}")
    from math import prod

    from ...models.gpt.params import param_specs

    elements = sum(prod(spec.shape) for spec in param_specs(cfg))
    flops = sum(st.flops() * len(st.ranks) for st in stages)
    worst = cfg.moe is not None and cfg.moe.dry_routing == "worst" and args.ep > 1
    head.append(f"model {elements:,} parameters; one step: {flops:.4e} FLOPs of matrix products, all ranks"
                + (" (each as busy as rank 0: at most)" if worst else ""))
    head.append(f"dry run of one step: {counted(len(stages), 'representative rank')}, {seconds:.1f} s; bytes and "
                f"GEMMs at {args.precision} ({PRECISIONS[args.precision].about})")
    print("\n".join(wrap_lines(head)))
    holds = _holds(cfg, args.pp, args.virtual_stages, split) if args.pp > 1 else {}
    for st, mem, timing in rows:
        print()
        print("\n".join(_stage_lines(st, mem, timing, args.zero, args.precision, worst=worst,
                                     holds=holds.get(st.stage))))
    total = times[slowest].total_s
    when = f"{total:,.3f} s" if total >= 1 else f"{total * 1e3:,.3f} ms"
    print(f"\npredicted step time: {when} (stage {slowest}'s, the slowest of {len(stages)})")
    print("\n".join(wrap_lines(_utilization_lines(use, args.precision, worst) + assumed)))
    print("\n".join(wrap_lines([_fit_line(memories, machine)])))
    hint = _to_fit(memories, machine, args)
    if hint:
        print("\n".join(wrap_lines([hint])))
    return 0


#: The transfer phases the step time lets the backward hide (spmdsim.tools.estimate.steptime's overlap): the
#: data-parallel gradient sums, as DDP's and Megatron's buckets run under the backward.
OVERLAP = ("gradients",)

#: --overlap's words and the transfer phase each adds to OVERLAP (spmdsim.tools.estimate.steptime.OVERLAP_UNDER).
OVERLAP_WORDS = {TENSOR: "layers", PIPELINE: "pipeline"}


def _overlap(given: Any, pp: int, schedule: str) -> tuple[str, ...]:
    """The transfer phases the step time hides: OVERLAP and those --overlap names ("tp,pp"; None: none)."""
    if given is None:
        return OVERLAP
    words = [w.strip() for w in given.split(",")]
    for word in words:
        if word not in OVERLAP_WORDS:
            raise SpmdsimError(f"--overlap {given!r}: {word!r} is unknown; expected a comma-separated list of "
                               f"{', '.join(OVERLAP_WORDS)} (e.g. --overlap tp,pp)")
    if PIPELINE in words and pp > 1 and schedule != "interleaved":
        raise SpmdsimError(f"--overlap pp hides the pipeline's messages as Megatron's overlap_p2p_comm does, in the "
                           f"interleaved schedule only, not {schedule}; give --virtual-stages N > 1 or leave out pp")
    return OVERLAP + tuple(OVERLAP_WORDS[w] for w in OVERLAP_WORDS if w in words)


def _utilization(stages: list, step_s: float, gpus: int, machine: Any, precision: str) -> Any:
    """The step's spmdsim.tools.estimate.steptime.Utilization: the dry run's products of every stage, each rank of a
    stage alike (forward and backward: the model's FLOPs; and the recomputed: the hardware's), at the
    predicted step time, against the machine's peak at the precision's compute dtype."""
    from ..estimate.ledger import PRECISIONS
    from ..estimate.steptime import utilization

    model = sum((st.flops("forward") + st.flops("backward")) * len(st.ranks) for st in stages)
    hardware = sum(st.flops() * len(st.ranks) for st in stages)
    return utilization(model, hardware, gpus, step_s, machine.peak(PRECISIONS[precision].compute))


def _utilization_lines(use: Any, precision: str, worst: bool) -> list[str]:
    """MFU (and HFU, where recomputation adds products) at the predicted step time: the papers' figures."""
    from ..estimate.ledger import PRECISIONS

    out = [f"MFU {use.mfu:.1%}: {use.tflops_per_gpu:,.1f} TFLOP/s per GPU of the {PRECISIONS[precision].compute} "
           f"peak {use.peak / 1e12:,.4g}, from {use.model_flops:.4e} model FLOPs a step"]
    what = "the dry run's forward and backward products, all ranks" + (
        ", each as busy as rank 0: at most" if worst else "")
    if use.hardware_flops > use.model_flops:
        out += [f"  ({what})", f"HFU {use.hfu:.1%}: {use.hardware_tflops_per_gpu:,.1f} TFLOP/s per GPU with the "
                               f"{use.hardware_flops - use.model_flops:.4e} FLOPs recomputed"]
    else:
        out.append(f"  ({what}; nothing recomputed: HFU the same)")
    return out


def _to_fit(memories: list, machine: Any, args: argparse.Namespace) -> str:
    """What to change when a stage does not fit ("" when every one does): the fullest stage's activations and
    what it holds besides them, by value, each with the options of this command that shrink it."""
    most = max(range(len(memories)), key=lambda s: memories[s].peak)
    if memories[most].peak <= machine.memory_bytes:
        return ""
    held = memories[most].held
    activations = held["activations"]
    rest = sum(held.values()) - activations + memories[most].backward  # (the gradients held beyond the line too)
    flash = getattr(args, "attention", "unfused") == "flash"  # no scores kept: selective drops nothing more
    fewer = {"none": ["--recompute full" if flash else "--recompute selective or full"],
             "selective": ["--recompute full"]}.get(args.recompute, [])
    fewer += ["--attention flash"] if not flash and args.recompute == "none" else []
    fewer += ["--kept megatron"] if args.kept == "graph" else []
    fewer += ["--sp"] if args.tp > 1 and not args.sp else []
    fewer += ["a smaller --micro-batch"] if args.micro_batch > 1 else []
    less = [] if args.zero else ["--zero 1" if args.dp * args.ep > 1 else "--zero 1 with --dp above 1"]
    parts = [f"activations {_gib(activations)}" + (f" (fewer with {', '.join(fewer)})" if fewer else ""),
             f"{_gib(rest)} besides them" + (f" (less with {', '.join(less)})" if less else "")]
    return (f"to fit: stage {most} holds {parts[0]} and {parts[1]}; a larger --tp or --pp splits both; or let "
            "`spmdsim autoshard --network gpt --machine` choose (docs/howto/estimate.md)")


def _fit_line(memories: list, machine: Any) -> str:
    """Whether one rank of every stage holds its peak (`memories`, by stage: spmdsim.tools.estimate.ledger.StageMemory,
    the ledger's bytes and the largest kernel's blocks) in the machine's memory per GPU; a stage over it names
    that kernel when its blocks alone are more than the memory."""
    held = [m.peak for m in memories]
    most = max(range(len(held)), key=lambda s: held[s])
    limit = f"the {machine.name}'s {_gib(machine.memory_bytes)} per GPU"
    over = [s for s in range(len(held)) if held[s] > machine.memory_bytes]
    if not over:
        return f"memory: every stage fits {limit} at its peak (the most, stage {most}: {_gib(held[most])})"
    if len(over) == 1:
        line = f"memory: stage {over[0]} needs {_gib(held[over[0]])} a rank at its peak, more than {limit}"
    else:
        line = f"memory: {len(over)} of {len(held)} stages need more than {limit} at their peak (the most, stage " \
               f"{most}: {_gib(held[most])})"
    alone = memories[most].transient
    if alone.nbytes > machine.memory_bytes:
        line += f"; {alone.what} alone reads and writes {_gib(alone.nbytes)} at once"
    return line


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB" if n >= GIB // 100 else format_size(n)


def _holds(cfg: Any, pp: int, virtual: int, split: Any) -> dict:
    """{stage: the line saying which layers (and ends) it holds}: its chunks (stage k holds chunks k, k + pp, ...)
    of spmdsim.models.gpt.stages.chunk_parts, with the split given (None: balanced)."""
    from ...models.gpt.stages import chunk_parts

    parts = chunk_parts(cfg, pp * virtual, split)
    out = {}
    for stage in range(pp):
        mine = parts[stage::pp]
        layers = sum(p.stop - p.first for p in mine)
        what = "; ".join(str(p) for p in mine) if virtual == 1 else \
            f"{counted(len(mine), 'chunk')}: " + "; ".join(str(p) for p in mine)
        out[stage] = f"holds {what} ({counted(layers, 'layer')})"
    return out


def _stage_lines(st: Any, mem: Any, timing: Any, zero: int, precision: str, worst: bool = False,
                 holds: Any = None) -> list[str]:
    from ..estimate.ledger import kernel_bytes, layers_activations

    bytes_, transient = mem.held, mem.transient
    lo, hi = st.ranks[0], st.ranks[-1]
    if worst:  # every rank runs rank 0's routing (spmdsim.models.moe.routing.planned): rank 0 is the busiest
        out = [f"stage {st.stage} (ranks {lo}-{hi}; rank {lo}'s figures: routed worst, the busiest; the others "
               "receive fewer tokens)"]
    else:
        alike = counted(len(st.ranks), "rank")
        out = [f"stage {st.stage} (rank {lo})" if lo == hi else
               f"stage {st.stage} (ranks {lo}-{hi}: {alike} alike; one rank's figures)"]
    if holds:
        out.append("  " + holds)
    out.append(f"  memory {_gib(mem.memory)}: " + ", ".join(f"{role} {_gib(n)}" for role, n in bytes_.items()))
    states = sum(bytes_[role] for role in ("parameters", "gradients", "master copy", "optimizer states"))
    line = f"    model states {_gib(states)} ({states / 1e9:,.2f} GB)"
    if not zero:  # every element is updated on this rank: the layers' share is theirs exactly
        layers = states * st.layer_params // st.params
        line += f", of which the transformer layers' {_gib(layers)} ({layers / 1e9:,.2f} GB)"
    out.append(line)
    out.append(f"    activations {_gib(bytes_['activations'])}, of which the transformer layers' "
               f"{_gib(layers_activations(st, precision))}; {st.in_flight} microbatch-chunk(s) in flight at "
               f"the most; transformer layers' parameters {st.layer_params:,} of {st.params:,}"
               + (f", of which the experts' {st.expert_params:,}" if st.expert_params else ""))
    beside = f", {_gib(mem.backward)} more gradients in the backward (measured, beside those above)" \
        if mem.backward else ""
    out.append(f"  peak (transient included) {_gib(mem.peak)}: the memory above{beside} and, "
               f"for a moment, the blocks of {transient.what}: {_gib(transient.nbytes)}")
    out.append("  TFLOP: " + ", ".join(f"{p} {st.flops(p) / 1e12:,.3f}" for p in ("forward", "backward", "recompute"))
               + f"; total {st.flops() / 1e12:,.3f}")
    traffic = kernel_bytes(st.kernels, precision)
    out.append("  element-wise and optimizer kernels read and write: " + ", ".join(
        f"{p} {_gib(traffic.get(p, 0))}" for p in ("forward", "backward", "recompute", "optimizer")))
    sent = ", ".join(f"{kind} ({level}) {format_size(n)}" for (kind, level), n in sorted(st.sent(precision).items())
                     if n)
    out.append(f"  sent: {sent or 'nothing'}")
    out.extend("  " + line for line in timing.lines())
    return wrap_lines(out)


def _sp(args: argparse.Namespace) -> str:
    """The mesh line's word for sequence parallelism ("" without it): at tp 1 it splits nothing."""
    if not args.sp:
        return ""
    return ", sp" if args.tp > 1 else ", sp (at tp 1 the sequence is not split)"


def _alone(args: argparse.Namespace) -> str:
    """ZeRO-1 over a data-parallel group of one shards nothing: said beside it ("" otherwise)."""
    return " (a data-parallel group of one: nothing sharded)" if args.zero and args.dp * args.ep == 1 else ""


def _as_json(st: Any, mem: Any, timing: Any, precision: str) -> dict:
    from dataclasses import asdict

    from ..estimate.ledger import kernel_bytes

    return {"stage": st.stage, "ranks": [st.ranks[0], st.ranks[-1]], "bytes": mem.held,
            "program_bytes": asdict(st.memory), "flops": {p: st.flops(p) for p in ("forward", "backward",
                                                                                       "recompute")},
            "sent": {f"{k} {lvl}": n for (k, lvl), n in st.sent(precision).items()}, "in_flight": st.in_flight,
            "kernel_bytes": kernel_bytes(st.kernels, precision),
            "peak_held": st.peak_held, "step_time_s": timing.total_s,
            "transient": {"bytes": mem.transient.nbytes, "what": mem.transient.what},
            "backward_gradient_bytes": mem.backward, "peak_bytes": mem.peak,
            "params": st.params, "layer_params": st.layer_params, "expert_params": st.expert_params}
