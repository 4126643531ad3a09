"""`spmdsim autoshard --network gpt --machine F`: the GPT's configuration by predicted step time.

    spmdsim autoshard --network gpt --gpt layers=48,d_model=6144,heads=64,seq=2048,vocab=51200,batch=4 \\
        --devices 8 --machine a100-dgx --memory-limit 80G

Every configuration is priced by its own dry run's ledger (spmdsim.tools.estimate.search); the table shows
the chosen one, the runners-up and why each lost, each by its peak (transient blocks included, as
`spmdsim estimate`'s verdict: what the memory limit bounds) (docs/howto/estimate.md). `--fix NAME=VALUE` (tp, pp, v,
dp, ep, etp, cp, cp-method, mb, recompute, zero, sp) holds a degree and searches the rest; the table's cp column
names each one's method by a letter (r ring, g allgather, a alltoall). With MoE layers its ep and etp columns are
the experts' (as `spmdsim estimate --ep/--etp` take them): an etp below tp is Megatron-Core's parallel folding,
tp / etp of attention's tp ranks in the experts' ep (ep x etp x dp x pp = the devices).
"""
from __future__ import annotations

import argparse
import json
import shlex
import time
from typing import Any

from ...errors import SpmdsimError
from ..estimate.search import ABOVE, KEPT, OVER, STATES, TIED, UNPRICED, search
from ...base.sizes import format_size
from ...base.threads import cores_available
from ...base.validate import counted
from ...models.axes import CONTEXT, DATA, EXPERT, PIPELINE, TENSOR
from ...models.gpt.config import GPTConfig
from ...models.gpt.flags import architecture_fields, architecture_flags, architecture_problem, architecture_words
from ...programs.viz.table import wrap_lines
from ..estimate.configs import FIXABLE, context_note, fold_note, parse_fixed, vocab_note
from ..estimate.machine import load_machine
from ...runtime.sim.run import MAX_DRY_RANKS
from .autoshard_common import gpt_config, gpt_said, gpt_typed, still_working
from .estimate import MAX_DRY_LAYERS, MAX_DRY_TOKENS

#: The line a search of an MoE GPT adds where it searched ZeRO-3 too (spmdsim.tools.estimate.search.search).
SHARDED_NOTE = ("searched again with ZeRO-3 (the experts sharded over dp, the rest over dp x ep): none of ZeRO 0 "
                "to 2 priced fits")

__all__ = ["run_machine"]

GIB = 1024 ** 3
MIB = 1024 ** 2

#: The cores this process may run on, and the most --jobs: each worker a dry run of up to MAX_DRY_RANKS threads.
CORES = cores_available()
MAX_JOBS = 2 * CORES

#: Runners-up the table shows (the JSON has every candidate).
SHOWN = 8

#: The table's letter after cp for its method: ring, all-gather, all-to-all (`--json`: cp_method).
CP_SHORT = {"ring": "r", "allgather": "g", "alltoall": "a"}


def _notes(cfg: Any, result: Any, devices: int, gpus_per_node: int) -> str:
    """The search's notes, one line joined by "; ": the vocabulary's padding, the folded experts, context
    parallelism and ZeRO-3 beside the experts, each where the search left it out (or ran again with it)."""
    searched = [c.config for c in result.candidates]
    return "; ".join(filter(None, (vocab_note(cfg, devices, gpus_per_node),
                                   "" if result.folded else fold_note(cfg, searched),
                                   "" if result.contexts else context_note(cfg, searched, devices, gpus_per_node),
                                   SHARDED_NOTE if result.sharded else "")))


def run_machine(args: argparse.Namespace) -> int:
    from dataclasses import replace

    if args.network != "gpt":
        raise SpmdsimError(f"--machine chooses the GPT's configuration; --network {args.network!r} is not 'gpt'")
    # The operator search's options: their parser defaults are None, False or [], so only what the user gave,
    # 0 included (compared by identity: 0 == False)
    for flag in ("run", "training", "flops", "objective", "method", "node_limit", "repeat", "ranks"):
        value = getattr(args, flag)
        if value is not None and value is not False and value != []:
            given = "" if value is True else f" {value[0] if isinstance(value, list) else value}"
            raise SpmdsimError(f"--{flag.replace('_', '-')}{given} does not go with --machine (the dry run of a "
                               "training step prices it)")
    fixed = parse_fixed(args.fix)  # --fix tp=8 ...: those degrees held, the rest searched
    args.precision = args.precision or "bf16-mixed"
    args.kept = args.kept or "megatron"
    devices, jobs = _counts(args)
    cfg = gpt_config(args.gpt, max_layers=MAX_DRY_LAYERS, sizes=False, moe=True)  # no --gpt: GPTConfig's sizes
    if cfg.seq > MAX_DRY_TOKENS:  # each dry run makes 2 x seq token ids first (seq=10**10: numpy asked 149 GiB)
        raise SpmdsimError(f"--gpt seq={cfg.seq:,} is too long; expected at most {MAX_DRY_TOKENS:,} (the dry run "
                           "makes a microbatch's token ids, 8 bytes a token)")
    heads = "--gpt heads" if "heads" in gpt_typed(args.gpt) else "the default heads"  # not "--gpt heads 4" untyped
    problem = architecture_problem(args, cfg.heads, heads)
    if problem:
        raise SpmdsimError(problem)
    dropout = {} if args.dropout is None else {"dropout": args.dropout}
    with gpt_said(args.gpt):  # Llama's options (--ffn, --rope, ...), --dropout: GPTConfig checks them, naming the flags
        cfg = replace(cfg, **architecture_fields(args), **dropout)
    if args.moe_cells and cfg.moe is None:
        raise SpmdsimError("--moe-cells bounds an MoE GPT's search by its layer cells (a dense GPT's always are): "
                           "give --gpt ...,experts=N")
    machine = load_machine(args.machine)
    limit = machine.memory_bytes if args.memory_limit is None else args.memory_limit
    if limit < 1:
        raise SpmdsimError(f"--memory-limit {args.memory_limit!r} must be >= 1 byte")
    if limit > machine.memory_bytes:  # its choice would not fit the GPU: the estimate it prints would say so
        raise SpmdsimError(f"--memory-limit {format_size(limit)} is more than machine {machine.name}'s "
                           f"{format_size(machine.memory_bytes)} a GPU; expected at most that (or a machine file "
                           "with more memory, docs/howto/add-machine-file.md)")
    start = time.perf_counter()
    hint = f"; --jobs {CORES} runs it on {CORES} cores" if jobs == 1 and CORES > 1 else ""  # (within 100 columns)
    with still_working(args, devices, hint):  # a line on stderr every PATIENCE_S s (an MoE search's cells: minutes)
        result = search(cfg, devices, machine, limit, precision=args.precision, kept=args.kept,
                        max_dry_runs=args.max_dry_runs, moe_cells=bool(args.moe_cells), fixed=fixed, jobs=jobs)
    seconds = time.perf_counter() - start
    note = _notes(cfg, result, devices, machine.gpus_per_node)
    # the chosen configuration as `spmdsim estimate` takes it: every option spelled out, --kept and --precision
    # included (the estimate's own defaults differ: --kept graph), so that it prints the same step time and peak
    command = None if result.chosen is None else estimate_command(cfg, result.chosen.config, args.machine,
                                                                  args.precision, args.kept)
    if args.json:
        print(json.dumps(_as_json(cfg, result, seconds) | ({"note": note} if note else {})
                         | {"estimate_command": command, "fixed": _fixed_json(fixed)}, indent=1))
    else:
        print("\n".join(_lines(cfg, result, seconds, note, fixed)))
        if command is not None:  # a command to paste into a shell: continued lines, each within 100 columns
            print("the chosen one, stage by stage (`spmdsim estimate`, the same step time and peak):")
            print(_shell_lines(command))
    if result.chosen is None:
        priced = [c.peak for c in result.candidates if c.peak is not None]
        unpriced = sum(c.verdict == "not priced" for c in result.candidates)
        # the limit as the user set it, or the machine's memory a GPU when no --memory-limit was given
        within = (f"--memory-limit {format_size(limit)}" if args.memory_limit is not None else
                  f"machine {machine.name}'s {format_size(limit)} a GPU")
        if unpriced:
            those = "the 1 configuration priced does not fit" if len(priced) == 1 else \
                f"none of the {len(priced)} configurations priced fits"  # (--max-dry-runs 1: "none of the 1 ...")
            raise SpmdsimError(f"{those} {within}; {unpriced:,} not priced: raise --max-dry-runs")
        least = min(priced) if priced else min(c.bound_bytes for c in result.candidates)
        plural = "s" if devices != 1 else ""
        unit = f" (a limit without a unit is bytes: {limit}G is {limit} GiB)" if limit < 1024 else ""  # "80": GB?
        raise SpmdsimError(f"no configuration fits {within} on {devices:,} device{plural}; the least needs "
                           f"{format_size(least)}" + (" at its peak" if priced else "") + unit)
    return 0


def _counts(args: argparse.Namespace) -> tuple[int, int]:
    """(devices, worker processes) of the search `args` ask for, each checked, and their dry runs' cap
    (`args.max_dry_runs`, 24 unless given)."""
    args.max_dry_runs = 24 if args.max_dry_runs is None else args.max_dry_runs
    if args.max_dry_runs < 1:
        raise SpmdsimError(f"--max-dry-runs {args.max_dry_runs} must be >= 1")
    jobs = 1 if args.jobs is None else args.jobs
    if not 1 <= jobs <= MAX_JOBS:
        raise SpmdsimError(f"--jobs {jobs} must be between 1 and {MAX_JOBS} (worker processes; this machine has "
                           f"{CORES} cores)")
    devices = 8 if args.devices is None else args.devices
    if devices < 1:
        raise SpmdsimError(f"--devices {devices} must be >= 1")
    if devices > MAX_DRY_RANKS:  # each configuration's dry run runs them all (--devices 10**12: no end in sight)
        raise SpmdsimError(f"--devices {devices:,} is too many; expected at most {MAX_DRY_RANKS:,} (the ranks a "
                           "dry run simulates)")
    return devices, jobs


def estimate_command(cfg: Any, x: Any, machine: str, precision: str, kept: str) -> str:
    """The `spmdsim estimate gpt` command line of configuration `x` (spmdsim.tools.estimate.configs.Config) of the GPT
    `cfg`, as the search priced it: its dry run, its memory and its step time are the search's."""
    micro = cfg.batch // (x.dp * x.ep * x.microbatches)
    words = ["spmdsim estimate gpt", f"--layers {cfg.layers}", f"--hidden {cfg.d_model}", f"--heads {cfg.heads}",
             f"--seq {cfg.seq}", f"--vocab {cfg.vocab}"] + architecture_flags(cfg)
    if cfg.vocab_pad_to > 1:
        words.append(f"--pad-vocab-to {cfg.vocab_pad_to}")
    if cfg.dropout != GPTConfig.dropout:  # (the estimate's default is the GPT's)
        words.append(f"--dropout {cfg.dropout + 0.0:g}")  # (-0: 0)
    if cfg.moe is not None:
        m = cfg.moe
        # --ep the experts' (folded, the mesh's ep x tp / etp: --etp below --tp)
        words += [f"--experts {m.experts}", f"--top-k {m.top_k}", f"--moe-every {m.every}", f"--ep {x.experts_ep}"]
        words += [f"--etp {x.etp}"] if x.etp else []
        if m.dropless:
            words.append("--dropless")
        elif m.capacity_factor != 1.0:
            words.append(f"--capacity-factor {m.capacity_factor:g}")
        if m.dry_routing != "balanced":
            words.append(f"--routing {m.dry_routing}")
    words += [f"--micro-batch {micro}", f"--global-batch {cfg.batch}", f"--tp {x.tp}"] + (["--sp"] if x.sp else [])
    words += [f"--pp {x.pp}"] + ([f"--virtual-stages {x.virtual}"] if x.virtual > 1 else [])
    if getattr(x, "split", None) is not None:  # layers per chunk (the search's own are balanced: None)
        words.append("--stage-layers " + ",".join(map(str, x.split)))
    words += [f"--dp {x.dp}"] + ([f"--cp {x.cp}", f"--cp-method {x.cp_method}"] if x.cp > 1 else [])
    words += [f"--recompute {x.recompute}", f"--zero {x.zero}", f"--kept {kept}",
              f"--precision {precision}", f"--machine {shlex.quote(machine)}"]
    return " ".join(words)


def _shell_lines(command: str, width: int = 100) -> str:
    """`command` cut between its options into lines of at most `width` columns, each but the last ending in
    a backslash (a shell reads them as one line)."""
    words = command.replace(" --", "\0--").split("\0")
    lines, line = [], "  " + words[0]
    for word in words[1:]:
        if len(line) + 1 + len(word) + 2 > width:
            lines.append(line + " \\")
            line = "    " + word
        else:
            line += " " + word
    return "\n".join(lines + [line])


#: Every verdict, in the order the table counts and shows them (spmdsim.tools.estimate.search.Candidate).
_VERDICTS = ("chosen", TIED, "slower", OVER, UNPRICED) + ABOVE[::-1] + (KEPT, STATES)


def _limit(n: int) -> str:
    """The memory limit in MiB as the table's peaks are ("80,000.0 MiB"), or where under 1 MiB, as format_size
    says it ("10 KiB": 0.0 MiB would read as no memory)."""
    return f"{n / MIB:,.1f} MiB" if n >= MIB else format_size(n)


def _gib(n: int) -> str:
    return f"{n / GIB:,.2f} GiB"


def _row(rank: str, c: Any, moe: bool = False) -> str:
    x = c.config
    step = f"{c.step_s * 1e3:,.3f}" if c.step_s is not None else f">{c.bound_s * 1e3:,.3f}"
    # the peak (a bound of the memory held is one of the peak too)
    memory = f"{c.peak / MIB:,.1f}" if c.peak is not None else f">{c.bound_bytes / MIB:,.1f}"
    ep = f"{x.experts_ep:>4}{x.experts_tp:>4}" if moe else ""  # the experts' ep and tp (folded: tp's ranks in ep)
    cp = f"{x.cp:>4}{CP_SHORT[x.cp_method] if x.cp > 1 else ' ':<2}"
    return (f"{rank:<5}{x.tp:>3}{'+sp' if x.sp else '   '}{x.pp:>4}{x.virtual:>3}{x.dp:>5}{ep}{cp}{x.microbatches:>5} "
            f"{x.recompute:<10}{x.zero:>2}{step:>13}{memory:>14}  {c.verdict}")


def _fixed_json(fixed: dict) -> dict:
    """{--fix name: value} of the degrees held ({Config field: value}, spmdsim.tools.estimate.configs.parse_fixed)."""
    return {name: fixed[f] for name, f in FIXABLE.items() if f in fixed}


def _lines(cfg: Any, r: Any, seconds: float, note: str = "", fixed: Any = None) -> list[str]:
    from collections import Counter

    moe = cfg.moe is not None
    experts = (f"; {cfg.moe.experts} {'dropless ' if cfg.moe.dropless else ''}experts, top-{cfg.moe.top_k}, in 1 of "
               f"every {cfg.moe.every} blocks (the dry runs route {cfg.moe.dry_routing})") if moe else ""
    head = [f"GPT {counted(cfg.layers, 'layer')}, hidden {cfg.d_model}, {counted(cfg.heads, 'head')}, seq {cfg.seq}, "
            f"vocab {cfg.vocab_words}{architecture_words(cfg)}, "
            f"global batch {cfg.batch}{experts}",
            f"{r.devices:,} device{'s' if r.devices != 1 else ''} on {r.machine}, "
            f"memory limit {_limit(r.memory_limit)} per rank, "
            f"{r.precision}, kept {r.kept}"]
    if fixed:
        head.append("fixed (--fix): " + ", ".join(f"{name} {int(v) if isinstance(v, bool) else v}"
                                                  for name, v in _fixed_json(fixed).items())
                    + "; the rest searched")
    head += [f"{len(r.candidates):,} configurations in {seconds:.1f} s: {r.dry_runs} priced by the dry run of "
             f"their step, {r.cell_runs:,} small dry runs of layer cells for the bounds; "
             + "; ".join(f"{n:,} {v}" for v, n in sorted(Counter(c.verdict for c in r.candidates).items(),
                                                         key=lambda vn: _VERDICTS.index(vn[0]))
                         if v not in ("chosen", TIED, "slower")),
             f"  ({r.stopped})"] + ([note] if note else [])
    if r.chosen is not None:
        x = r.chosen.config
        head.append(f"chosen: {x.short()}: {r.chosen.step_s * 1e3:,.3f} ms, {r.chosen.peak / MIB:,.1f} MiB at its "
                    "peak")
        head.append(f"  ({r.chosen.memory / MIB:,.1f} MiB held, and for a moment one kernel's blocks)")
        head += _unproven(r)
    else:
        head.append("chosen: none fits the memory limit")
    out = list(head)
    eph = f"{EXPERT:>4}{'etp':>4}" if moe else ""
    out.append(f"{'#':<5}{TENSOR:>3}{'':3}{PIPELINE:>4}{'v':>3}{DATA:>5}{eph}{CONTEXT:>4}{'':2}{'mb':>5} "
               f"{'recompute':<10}{'Z':>2}"
               f"{'step ms':>13}{'peak MiB':>14}  why not chosen")
    priced = [c for c in r.candidates if c.step_s is not None]
    # the fastest that fit, then those faster still that the memory limit ruled out
    best = r.chosen.step_s if r.chosen is not None else float("inf")
    over = sorted((c for c in priced if c.verdict == "over the memory limit" and c.step_s < best),
                  key=lambda c: c.step_s)[:SHOWN // 2]
    fit = [c for c in priced if c.verdict != "over the memory limit"][:SHOWN - len(over)]
    for c in fit + over:
        out.append(_row(str(priced.index(c) + 1), c, moe))
    if len(priced) > len(fit) + len(over):
        out.append(f"... {len(priced) - len(fit) - len(over)} more priced (--json lists them all)")
    if len(priced) < len(r.candidates):
        out.append("unpriced, by their lower bounds (> ms, > MiB held, so at the peak too), for instance:")
    unpriced = [c for c in r.candidates if c.step_s is None]
    for verdict in _VERDICTS[_VERDICTS.index(UNPRICED):]:  # the closest of each kind of pruned one
        first = next((c for c in unpriced if c.verdict == verdict), None)
        if first is not None:
            out.append(_row("-", first, moe))

    return wrap_lines(out)


def _unproven(r: Any) -> list[str]:
    """The line saying the choice is not proven best, when configurations the dry-run cap left unpriced have a
    time bound below its time (the table alone lists them without a word); none otherwise."""
    below = [c for c in r.candidates if c.verdict == "not priced" and c.bound_s < r.chosen.step_s]
    if not below:
        return []
    least = min(c.bound_s for c in below)
    return [f"not proven best: {len(below):,} configuration(s) not priced have time bounds below its "
            f"{r.chosen.step_s * 1e3:,.3f} ms (the least {least * 1e3:,.3f} ms); raise --max-dry-runs to price them"]


def _as_json(cfg: Any, r: Any, seconds: float) -> dict:
    from dataclasses import asdict

    return {"model": {k: getattr(cfg, k) for k in ("layers", "d_model", "heads", "seq", "vocab", "batch")},
            "devices": r.devices, "machine": r.machine, "memory_limit": r.memory_limit, "precision": r.precision,
            "kept": r.kept, "dry_runs": r.dry_runs, "cell_runs": r.cell_runs, "seconds": seconds,
            "stopped": r.stopped,
            "chosen": None if r.chosen is None else asdict(r.chosen),
            "candidates": [asdict(c) for c in r.candidates]}
