"""`spmdsim estimate gpt`: one rank's memory, FLOPs, bytes and predicted step time per pipeline stage.

    spmdsim estimate gpt --layers 48 --hidden 6144 --heads 64 --seq 2048 --vocab 51200 --micro-batch 4 \\
        --global-batch 4 --tp 8 --pp 1 --dp 1 --sp --recompute selective --precision bf16-mixed \\
        --machine a100-dgx

The figures are those of the dry run of the real training step (spmdsim.tools.estimate.ledger), priced at
the precision's widths and timed on the machine file (spmdsim.tools.estimate.steptime); docs/howto/estimate.md.
"""
from __future__ import annotations

import argparse
import math
from typing import Any

from ...errors import SpmdsimError
from ...base.typed_numbers import add_noted, flag_float, given_flags, said_fields, typed
from ...models.gpt.config import GPTConfig, said_as
from ...models.gpt.memory import reshard_problem, shard_group_problem, sharded_problem
from ...models.gpt.options import capacity_problem
from ...models.gpt.flags import (ARCHITECTURE_SAID, LLAMA_FLAGS, MAX_SIZE, architecture_arguments,
                                 architecture_fields, architecture_problem, size_problem)
from ...models.moe.config import MoEConfig
from ...models.moe.fold import fold_problem, mesh_ep
from ..estimate.machine import machines
from .estimate_overlap import OVERLAP_HELP, overlap_phases
from ..estimate.held import PRECISIONS, TRAINED_ONLY
from ...base.once_parser import Choices

from ...models.axes import DATA, EXPERT, PIPELINE, TENSOR
from ...programs.pipeline.options import (default_virtual_problem, layer_split, schedule_choice, split_arguments,
                                         virtual_stages)
from ...runtime.sim.run import MAX_DRY_RANKS

__all__ = ["register", "run", "config_record", "CONFIG_FIELDS", "MAX_DRY_LAYERS", "MAX_DRY_TOKENS"]

#: Most layers a dry run of the GPT steps through (here and in autoshard's search by a machine file): each takes
#: about 7 ms and 0.5 MB (1,000 small layers: 9 s, 500 MB; 3,000: 31 s, 1.4 GB), and the largest published
#: models have under 200; --layers 100000 would run for minutes without a word.
MAX_DRY_LAYERS = 1024

#: Most tokens a microbatch may hold (--micro-batch x --seq, so --seq too): the dry run makes its token ids and
#: their embedding's index arrays for real, 8 bytes a token and more (at this bound about 1.1 GB and 5 s;
#: --seq 10,000,000,000 asked numpy for 149 GiB). The longest published contexts are 10,000,000 tokens.
MAX_DRY_TOKENS = 1 << 24


def no_moe_block(layers: int) -> str:
    """What too large a moe_every makes of `layers` blocks (one block said as one, not "none of the 1 blocks")."""
    return "no MoE layer of the only block" if layers == 1 else f"none of the {layers} blocks an MoE layer"


def _shipped() -> list:
    """The shipped machines' names (spmdsim.tools.estimate.machine.machines), for --machine's help."""
    return list(machines())


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "estimate",
        help="per-rank memory, FLOPs, bytes and step time of a GPT configuration, from its dry run",
        description=("Dry-run one training step of the GPT on a (pp, dp, tp) mesh of simulated ranks (shapes "
                     "only, one rank per stage) and print, for the first, a middle and the last stage (and the "
                     "slowest and the fullest), what one rank holds (priced at --precision), the FLOPs it "
                     "executes, the bytes it sends by kind and link level, and the step time predicted on "
                     f"--machine (docs/howto/estimate.md). Each size is at most {MAX_SIZE:,} (2**24)."))
    parser.add_argument("network", choices=Choices(("gpt",), NETWORK_NOTES),
                        help="the network (the GPT of spmdsim.models.gpt; Llama's and Mixtral's are its options)")
    # The defaults are a toy GPT (it runs in a second): say so, so that a user sizing a real model sets each one.
    for name, default, what in (
            ("layers", 4, "transformer blocks"), ("hidden", 128, "the model width (d_model)"),
            ("heads", 4, "attention heads"), ("seq", 64, "sequence length"), ("vocab", 128, "vocabulary size"),
            ("micro-batch", 1, "sequences per microbatch"), ("global-batch", 8, "sequences per step"),
            (TENSOR, 1, "tensor-parallel ranks"), (PIPELINE, 1, "pipeline stages"),
            (DATA, 1, "data-parallel ranks")):
        add_noted(parser, f"--{name}", type=int, default=default, metavar="N", help=f"{what} (default {default})")
    add_noted(parser, "--virtual-stages", type=int, default=None, metavar="N",  # as the examples' and `pipeline`'s
              help="model chunks per stage (interleaved) (default 2 with --schedule interleaved, else 1)")
    split_arguments(parser)  # --first-stage-layers, --last-stage-layers, --stage-layers (default: balanced)
    parser.add_argument("--pad-vocab-to", type=int, default=1, metavar="N",
                        help="pad the vocabulary to a multiple of N (Megatron pads to 128 x tp: GPT-2's 50257 "
                             "becomes 50304 at tp 1, 51200 at tp 8); default 1: no padding")
    # Llama's architecture (spmdsim.models.gpt.GPTConfig's options; docs/howto/estimate.md, "A Llama"): each default the
    # GPT's, the flags the examples take (spmdsim.models.gpt.options).
    architecture_arguments(parser, width="--hidden")
    parser.add_argument("--dropout", type=flag_float, default=0.1, metavar="P",
                        help="dropout probability of the embeddings, the attention and the residual branches "
                             "(default 0.1, GPT-3's; 0: none, as Llama trains: no dropout kernels, masks or kept "
                             "outputs)")
    parser.add_argument("--schedule", type=schedule_choice, default=None, choices=("gpipe", "1f1b", "interleaved"),
                        help="pipeline schedule (default 1f1b; interleaved with --virtual-stages > 1; any case: "
                             "1F1B, GPipe)")
    parser.add_argument("--sp", action="store_true", help="sequence parallelism (Megatron)")
    parser.add_argument("--cp", type=int, default=1, metavar="N",
                        help="context-parallel ranks: each sequence split over them (default 1)")
    add_noted(parser, "--cp-method", choices=("ring", "allgather", "alltoall"), default="ring",
                        help="how attention meets the split sequence (default ring: its messages run under the "
                             "products; docs/howto/context-parallel.md)")
    parser.add_argument("--recompute", default="none", choices=("none", "selective", "full"),
                        help="activation recomputation (default none)")
    parser.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3),
                        help="1: the distributed optimizer (ZeRO-1: states sharded over dp); 2: the gradients too "
                             "(ZeRO-2); 3: the parameters too (ZeRO-3, FSDP: each layer gathered for its forward "
                             "and again for its backward); default 0")
    add_noted(parser, "--reshard-after-forward", default="true", metavar="{true,false}",
              help="with --zero 3 on one stage, one microbatch a step: false keeps each layer's gathered parameters "
                   "from its forward to its backward (one gather a layer, not two; every layer's held at the "
                   "peak); default true, FSDP2's")
    parser.add_argument("--prefetch", action="store_true",
                        help="with --zero 3 on one stage, one microbatch a step: each layer's parameters gathered "
                             "before the layer ahead of it runs (FSDP's prefetch: two layers' gathered at once)")
    parser.add_argument("--shard-group", type=int, default=None, metavar="N",
                        help="with --zero 3 on one stage, one microbatch a step: hybrid sharding (HSDP), each "
                             "parameter sharded over groups of N of the dp ranks, replicated across the dp / N")
    parser.add_argument("--kept", default="graph", choices=("graph", "megatron"),
                        help="what each block keeps for backward: spmdsim's graph (default), or Megatron's set "
                             "(docs/howto/memory.md, \"Megatron's kept set\"; `autoshard --machine` searches with "
                             "megatron and prints its choice as an estimate command)")
    _moe_arguments(parser)  # --experts, --ep, --etp, --top-k, --moe-every, --capacity-factor, ...
    parser.add_argument("--precision", default="bf16-mixed", choices=Choices(PRECISIONS, TRAINED_ONLY),
                        help="the widths the ledger prices each tensor at (default bf16-mixed); fp8: bf16-mixed with "
                             "TransformerEngine's FP8 linear layers, their products at the machine's fp8 peak")
    parser.add_argument("--machine", default="a100-dgx",
                        help=f"a shipped machine ({', '.join(_shipped())}; default a100-dgx) or a machine file's "
                             "path (spmdsim calibrate --machine-out)")
    parser.add_argument("--overlap", metavar="tp,pp", help=OVERLAP_HELP)
    parser.add_argument("--gradient-accumulation-fusion", action="store_true", help=_FUSION_HELP)
    parser.add_argument("--json", action="store_true", help="print the ledger as JSON")
    parser.set_defaults(func=run)


def _moe_arguments(parser: Any) -> None:
    """The MoE layers' flags (docs/howto/experts.md)."""
    parser.add_argument("--experts", type=int, default=0, metavar="N",
                        help="mixture-of-experts MLPs with N experts (0: a dense GPT; docs/howto/experts.md)")
    parser.add_argument("--ep", type=int, default=1, metavar="N", help="expert-parallel ranks of each stage")
    parser.add_argument("--etp", type=int, metavar="N",
                        help="the experts' tensor-parallel ranks (Megatron's --expert-tensor-parallel-size): --tp "
                             "(default) or a divisor of it, the rest of attention's tp ranks folded into the "
                             "experts' ep (Megatron-Core's parallel folding: --ep counts them, --dp the ranks "
                             "holding the same experts)")
    parser.add_argument("--top-k", type=int, choices=(1, 2), help="experts per token (default 2)")
    parser.add_argument("--moe-every", type=int, metavar="N", help="every N-th block is an MoE layer (default 2)")
    parser.add_argument("--capacity-factor", type=flag_float, metavar="F",
                        help="each expert's slots: ceil(k x seq x F / experts) per sequence, at most seq (default 1)")
    parser.add_argument("--dropless", action="store_true", help="no capacity: counts exchanged, then Alltoallv")
    parser.add_argument("--routing", choices=("balanced", "worst"),
                        help="how the dry run routes (it has no router values): balanced (default), or worst (every "
                             "token to experts 0..k-1)")


#: The MoE layers' options and their defaults, set in `_config`: None from the parser says the user gave none,
#: so that a dense GPT (no --experts) refuses only what was given (it uses none of them).
MOE_DEFAULTS = {"top_k": 2, "moe_every": 2, "capacity_factor": 1.0, "routing": "balanced"}


_FUSION_HELP = ("price the weight gradients as Megatron's --gradient-accumulation-fusion (its default; NeMo's "
                "gradient_accumulation_fusion) runs them: each microbatch's added into the fp32 main gradient by "
                "the weight-gradient GEMM, no kernel of its own (default: the program's, an add kernel a "
                "microbatch)")


#: The networks a user may name that are the GPT's options (`spmdsim estimate llama`).
NETWORK_NOTES = {
    "llama": f"Llama's architecture is the GPT's options: spmdsim estimate gpt {LLAMA_FLAGS}",
    "mixtral": f"Mixtral's experts are the GPT's options: spmdsim estimate gpt --experts N --top-k 2 (with Llama's: "
               f"{LLAMA_FLAGS})"}
#: The options `--json` writes under "config", each by its argparse name (after `_config` filled the MoE
#: defaults): named here, so that an attribute argparse or main() adds (func, ...) stays out.
CONFIG_FIELDS = ("network", "layers", "hidden", "heads", "seq", "vocab", "micro_batch", "global_batch", TENSOR,
                 PIPELINE, DATA, "virtual_stages", "pad_vocab_to", "schedule", "sp", "recompute", "zero",
                 "reshard_after_forward", "prefetch", "shard_group", "kept", "experts",
                 EXPERT, "etp", "top_k", "moe_every", "capacity_factor", "dropless", "routing", "precision", "machine",
                 "ffn", "kv_heads", "norm", "mlp", "untied", "rope", "no_bias", "dropout", "overlap", "attention",
                 "first_stage_layers", "last_stage_layers", "stage_layers", "cp", "cp_method",
                 "gradient_accumulation_fusion")


def config_record(args: argparse.Namespace) -> dict[str, Any]:
    """The "config" of `--json`: the command and its options as given (the MoE ones with their defaults)."""
    return {"command": "estimate", **{name: getattr(args, name) for name in CONFIG_FIELDS}}


#: GPTConfig's fields -> the flag of `spmdsim estimate` that sets each (GPTConfig's refusals name it).
ESTIMATE_SAID = {"vocab": "--vocab", "vocab_pad_to": "--pad-vocab-to", "layers": "--layers", "d_model": "--hidden",
                 "heads": "--heads", "seq": "--seq", "batch": "--global-batch", "dropout": "--dropout"}


def _config(args: argparse.Namespace) -> tuple[Any, int]:
    if args.experts == 0:  # a dense GPT: an MoE option given is refused, not ignored
        given = [flag for flag in MOE_DEFAULTS if getattr(args, flag) is not None] + ["dropless"] * args.dropless
        if given:
            value = getattr(args, given[0])
            shown = "" if value is True else f" {value:g}" if isinstance(value, float) else f" {value}"
            raise SpmdsimError(f"--{given[0].replace('_', '-')}{shown} sets the MoE layers: give --experts N")
    if args.dropless and args.capacity_factor is not None:  # typed (None: left out), refused as the example does
        raise SpmdsimError(capacity_problem(True, args.capacity_factor, True))
    for flag, default in MOE_DEFAULTS.items():
        if getattr(args, flag) is None:
            setattr(args, flag, default)
    if args.virtual_stages is None:  # spmdsim.programs.pipeline.options.virtual_stages' default, said if refused
        problem = default_virtual_problem(args)
        if problem:
            raise SpmdsimError(problem)
        args.virtual_stages = virtual_stages(args)
    for name in ("layers", "hidden", "heads", "seq", "vocab", "micro_batch", "global_batch", TENSOR, PIPELINE, DATA,
                 "virtual_stages", EXPERT, "moe_every", "pad_vocab_to", "cp"):
        value = getattr(args, name)
        if value < 1:
            raise SpmdsimError(f"--{name.replace('_', '-')} {value} must be >= 1")
    for name in ("hidden", "heads", "vocab", "global_batch", "pad_vocab_to", "experts"):  # before any is multiplied
        problem = size_problem(f"--{name.replace('_', '-')}", getattr(args, name))
        if problem:
            raise SpmdsimError(problem)
    if args.layers > MAX_DRY_LAYERS:
        raise SpmdsimError(f"--layers {args.layers:,} is too many; expected at most {MAX_DRY_LAYERS:,} (the dry run "
                           "steps through every layer, about 7 ms and 0.5 MB each)")
    _token_bounds(args)
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
    problem = capacity_problem(args.dropless, args.capacity_factor, False) if args.experts else None
    if problem:
        raise SpmdsimError(problem)
    if not args.experts and args.ep > 1:
        raise SpmdsimError(f"--ep {args.ep} splits experts: give --experts N (a multiple of {args.ep})")
    _etp_problems(args)
    if args.experts and args.experts % args.ep:
        raise SpmdsimError(f"--experts {args.experts} must be a multiple of --ep {args.ep} (each ep rank holds "
                           "the same number of experts)")
    ep = mesh_ep(args.ep, args.tp, args.etp or 0)  # folded (--etp below --tp): the mesh's ep axis, ep / (tp / etp)
    per_step = args.micro_batch * args.dp * ep  # the dense layers' batch is split over dp x ep
    if args.global_batch % per_step:
        what = "--micro-batch x --dp x --ep" if ep > 1 else "--micro-batch x --dp"
        what += (" / --tp" if args.etp == 1 else " / (--tp / --etp)") if ep != args.ep else ""
        sizes = f"{args.micro_batch} x {args.dp} x {args.ep}" if ep > 1 else f"{args.micro_batch} x {args.dp}"
        sizes += f" / {args.ep // ep}" if ep != args.ep else ""
        raise SpmdsimError(f"--global-batch {args.global_batch} must be a multiple of {what} ({sizes} = {per_step})")
    if args.experts and args.moe_every > args.layers:
        raise SpmdsimError(f"--moe-every {args.moe_every} makes {no_moe_block(args.layers)} "
                           f"(the first would be block {args.moe_every - 1}, counted from 0); expected at most "
                           f"--layers {args.layers}")
    moe = MoEConfig(experts=args.experts, top_k=args.top_k, every=args.moe_every,
                    capacity_factor=args.capacity_factor, dropless=args.dropless,
                    dry_routing=args.routing, etp=args.etp if ep != args.ep else 0) if args.experts else None
    with said_as(said, defaults):
        cfg = GPTConfig(vocab=args.vocab, d_model=args.hidden, heads=args.heads, layers=args.layers, seq=args.seq,
                        batch=args.global_batch, dropout=args.dropout, moe=moe, vocab_pad_to=args.pad_vocab_to,
                        **architecture_fields(args))
    return cfg, args.global_batch // per_step


def _token_bounds(args: argparse.Namespace) -> None:
    """--seq and --micro-batch x --seq refused past MAX_DRY_TOKENS, before the dry run makes their token ids."""
    if args.seq > MAX_DRY_TOKENS:
        raise SpmdsimError(f"--seq {args.seq:,} is too long; expected at most {MAX_DRY_TOKENS:,} (the dry run makes "
                           "a microbatch's token ids, 8 bytes a token)")
    tokens = args.micro_batch * args.seq
    if tokens > MAX_DRY_TOKENS:
        raise SpmdsimError(f"--micro-batch {args.micro_batch:,} x --seq {args.seq:,} is {tokens:,} tokens a "
                           f"microbatch; expected at most {MAX_DRY_TOKENS:,} (the dry run makes their token ids, "
                           "8 bytes a token)")


def _etp_problems(args: argparse.Namespace) -> None:
    """--etp's refusals, each one line before the dry run: without experts, below 1, a size that does not divide
    tp (spmdsim.models.moe.fold), an ep folded that tp / etp does not divide, a microbatch (dropless: a sequence)
    the tp / etp ranks folded cannot share."""
    if args.etp is None:
        return
    if args.etp < 1:
        raise SpmdsimError(f"--etp {args.etp} must be >= 1")
    if not args.experts:
        raise SpmdsimError(f"--etp {args.etp} sets the MoE layers: give --experts N")
    problem = fold_problem(args.tp, args.etp, args.ep)
    if problem:
        raise SpmdsimError(f"--etp {args.etp}: {problem}")
    by = args.tp // args.etp  # the tp ranks folded into the experts' ep, each routing its own share
    tp = "--tp" if args.etp == 1 else "--tp / --etp"
    if by > 1 and args.dropless and args.seq % by:
        raise SpmdsimError(f"--etp {args.etp} with --tp {args.tp} and --dropless: each tp rank routes its own share "
                           f"of a sequence's tokens; --seq {args.seq} must be a multiple of {tp} {by}")
    if by > 1 and not args.dropless and args.micro_batch % by:
        raise SpmdsimError(f"--etp {args.etp} with --tp {args.tp}: each tp rank routes its own share of a "
                           f"microbatch's sequences (with a capacity, whole sequences; --dropless splits them); "
                           f"--micro-batch {args.micro_batch} must be a multiple of {tp} {by}")


def _fold(args: argparse.Namespace) -> None:
    """With --etp below --tp: args.ep becomes the mesh's ep axis (ep / (tp / etp) ranks; attention's tp ranks
    outside etp make up the rest), args.expert_ep keeps the experts' ep; otherwise args.expert_ep is args.ep."""
    args.expert_ep = args.ep
    args.ep = mesh_ep(args.ep, args.tp, args.etp or 0)


def _mesh_size(args: argparse.Namespace) -> None:
    """The mesh's rank count refused past MAX_DRY_RANKS in one line naming the flags whose product it is (the
    dry run's own refusal named only "rank count")."""
    ranks = args.pp * args.dp * args.ep * args.cp * args.tp
    if ranks <= MAX_DRY_RANKS:
        return
    ep = [] if args.ep == 1 and args.expert_ep == 1 else \
        [f"--ep {args.ep}" if args.ep == args.expert_ep else f"ep {args.ep} (--ep {args.expert_ep} / (--tp / --etp))"]
    factors = [f"--pp {args.pp}", f"--dp {args.dp}", *ep, f"--cp {args.cp}", f"--tp {args.tp}"]
    raise SpmdsimError(f"{' x '.join(factors)} is a mesh of {ranks:,} ranks; expected at most {MAX_DRY_RANKS:,} "
                       f"(the largest mesh a dry run steps)")


def _fsdp(args: argparse.Namespace) -> None:
    """--cp-method without --cp 2 or more (the trainers' refusal); --prefetch without --zero 3, --reshard-after-forward
    typed without it, either where the step runs train_pipelined (no prefetch, resharded after forward);
    --shard-group beyond one stage, one microbatch, no --ep or --cp (the first named)."""
    if args.cp == 1 and given_flags(args, "--cp-method"):
        raise SpmdsimError(f"--cp-method {args.cp_method} is for a sequence split over context-parallel ranks: give "
                           "--cp 2 or more with it")
    if args.prefetch and args.zero != 3:
        raise SpmdsimError("--prefetch gathers parameters ahead: give --zero 3 with it")
    problem = reshard_problem(args.reshard_after_forward, args.zero, bool(given_flags(args, "--reshard-after-forward")))
    if problem:
        raise SpmdsimError(problem)
    sequences = args.micro_batch * args.dp * args.ep  # a step of one microbatch
    microbatches = args.global_batch // sequences
    for flag, given, what, step in (("--prefetch", args.prefetch, "do not prefetch", "a prefetching step"),
                                    ("--reshard-after-forward false", args.reshard_after_forward == "false",
                                     "reshard after forward", "a step that keeps its layers gathered")):
        if given and sharded_problem(args.pp, microbatches, args.ep, args.virtual_stages):
            if args.pp > 1 or args.virtual_stages > 1:
                raise SpmdsimError(f"{flag} with --pp {args.pp}: a pipeline's chunks {what}; leave out {flag}")
            raise SpmdsimError(f"{flag} with {microbatches} microbatches a step: {step} runs one; give "
                               f"--global-batch {sequences} (--micro-batch x --dp{' x --ep' * (args.ep > 1)}) or "
                               f"leave out {flag}")
    if args.shard_group is not None:
        beside = [f"{flag} {n}" for flag, n in (("--pp", args.pp), ("--virtual-stages", args.virtual_stages),
                                                ("--ep", args.ep), ("--cp", args.cp)) if n > 1]
        beside += [f"{microbatches} microbatches a step"] * (microbatches > 1)
        problem = shard_group_problem(args.shard_group, args.zero, args.dp)
        if problem or beside:
            raise SpmdsimError(problem or f"--shard-group {args.shard_group} with {beside[0]}: the estimate prices "
                               "hybrid sharding on one stage, one microbatch a step, without --ep or --cp")


def _split(args: argparse.Namespace) -> Any:
    """The layers per chunk that --first-stage-layers, --last-stage-layers or --stage-layers give (None: none
    given, balanced), or the one-line SpmdsimError naming the flag (spmdsim.programs.pipeline.options.layer_split)."""
    split, problem = layer_split(args, args.layers, args.pp, args.virtual_stages)
    if problem:
        raise SpmdsimError(problem)
    return split


def run(args: argparse.Namespace) -> int:
    from .estimate_report import report  # the dry run and the machine model: loaded to estimate, not for --help

    cfg, microbatches = _config(args)
    record = config_record(args)  # as given: --ep the experts'
    _fold(args)
    _mesh_size(args)
    _fsdp(args)
    split = _split(args)
    schedule = args.schedule or ("interleaved" if args.virtual_stages > 1 else "1f1b")
    overlap = overlap_phases(args.overlap, args.pp, schedule) + (("parameters",) if args.prefetch else ())
    if "updates" in overlap and args.zero not in (1, 2):
        raise SpmdsimError(f"--overlap params hides ZeRO-1's and ZeRO-2's gathers of the updated parameters "
                           f"(Megatron's --overlap-param-gather); --zero {args.zero} has none: give --zero 1 or 2"
                           + (" (ZeRO-3's gathers: --prefetch)" if args.zero == 3 else ""))
    if args.cp > 1 and args.cp_method == "ring":  # each block's transfer posted before the block's compute
        overlap += ("context",)
    return report(args, record, cfg, microbatches, split, schedule, overlap)
