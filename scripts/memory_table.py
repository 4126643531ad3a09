#!/usr/bin/env python
"""The GPT example's memory per rank with each recompute and ZeRO choice, measured (docs/howto/memory.md, "Memory").

Trains examples/train_gpt.py's model (4 layers, d_model 128, 4 heads, seq 64, batch 8) two steps on
8 simulated ranks, dp 2 x tp 4 with sequence parallelism, once per combination, and prints rank 0's
figures at the second step as two markdown tables: what the graph kept for backward after the
forward (spmdsim.nn.autograd.kept_bytes), per layer in Korthikanti et al.'s units (s sequence, b the
samples a dp rank runs, h d_model, a heads) beside their formula at the run's activation width (every
value and dropout mask 8 bytes at the default fp64: spmdsim.models.gpt.memory.korthikanti_bytes); and the
parameters, gradients, master copy, optimizer states, buffers and peak (spmdsim.models.gpt.memory.MemoryReport).

    python scripts/memory_table.py
    python scripts/memory_table.py --dry-run --dp 64 --tp 8 --vocab 50304 --layers 24 --d-model 1024 \
        --heads 16 --seq 1024 --batch 128        # GPT-2 medium's shape on 512 ranks, shapes only
    python scripts/memory_table.py --kept megatron   # Megatron's kept set, against the formula at 1-byte masks
    python scripts/memory_table.py --kept megatron --precision bf16-mixed   # the paper's widths: 2-byte values

With --dry-run the ranks run on shapes only (spmdsim.runtime.sim.dry): the same kept bytes, parameters and
optimizer figures as a real run (the saved blocks are zeros of their real sizes, never touched).
"""
from __future__ import annotations

import argparse

import spmdsim
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.nn.autograd.kept import KEPT
from spmdsim.models.gpt.memory import BLOCK_KINDS, RECOMPUTE, korthikanti_bytes, per_layer_units
from spmdsim.models.gpt.parallel import mesh_problem
from spmdsim.models.gpt.train import train
from spmdsim.base.precision import PRESETS, precision_problem
from spmdsim.tools.cli.main import run_script


#: The ZeRO stages the table measures: 0 and 1 (ZeRO-2 is ZeRO-1 with the gradients at 1/dp: docs/howto/train.md,
#: "ZeRO-2", quotes its run beside ZeRO-1's).
TABLED = (0, 1)


def measured(cfg: GPTConfig, ids, dp: int, tp: int, recompute: str, zero: int, dry: bool, kept: str = "graph",
             precision: str = "fp64"):
    """Rank 0's MemoryReport at the second step."""
    steps = spmdsim.simulate(dp * tp, lambda: train(cfg, spmdsim.world(), dp, tp, 2, ids, sp=True, check=False,
                                                    recompute=recompute, zero=zero, memory=True, kept=kept,
                                                    precision=precision)[1],
                             dry_run=dry)
    return steps[0][-1].memory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = GPTConfig()
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--tp", type=int, default=4)
    for name in ("vocab", "layers", "d_model", "heads", "seq", "batch"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    parser.add_argument("--dry-run", action="store_true", help="shapes only (large models)")
    parser.add_argument("--kept", choices=KEPT, default="graph",
                        help="what the graph keeps for backward (megatron: Megatron-LM's set, 1-byte masks)")
    parser.add_argument("--precision", choices=tuple(PRESETS), default="fp64",
                        help="the precision policy (bf16-mixed: 2-byte activations, Korthikanti et al.'s widths)")
    args = parser.parse_args()
    problem = precision_problem(args.precision)
    if problem:
        parser.error(problem)
    for name in ("dp", "tp"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} must be at least 1")
    try:
        cfg = GPTConfig(vocab=args.vocab, layers=args.layers, d_model=args.d_model, heads=args.heads,
                        seq=args.seq, batch=args.batch)
    except SpmdsimError as e:
        parser.error(str(e))
    problem = mesh_problem(cfg, args.dp, args.tp, True)
    if problem:
        parser.error(f"the GPT cannot run on dp {args.dp} x tp {args.tp}: {problem}")
    ids = encode(load_text())
    dp, tp = args.dp, args.tp
    s, b, h, a = cfg.seq, cfg.batch // dp, cfg.d_model, cfg.heads
    megatron = args.kept == "megatron"
    policy = PRESETS[args.precision]
    width = policy.dtype("activation").itemsize  # each kept value's bytes: 8 at fp64, 2 at bf16-mixed
    stat = 4 if policy.low else width  # a layer norm's row statistics: float32 beside bfloat16 values (Apex's)
    reports = {(r, z): measured(cfg, ids, dp, tp, r, z, args.dry_run, args.kept, args.precision)
               for r in RECOMPUTE for z in TABLED}
    print(f"GPT {cfg.layers} layers, d_model {h}, {a} heads, seq {s}, batch {cfg.batch}; dp {dp} x tp {tp} "
          f"with sp; rank 0, bytes{' (dry run)' if args.dry_run else ''}{'; kept megatron' if megatron else ''}"
          f"{'' if args.precision == 'fp64' else '; precision ' + args.precision}")
    print(f"s·b·h = {s} x {b} x {h} = {s * b * h:,}; a·s²·b = {a} x {s}² x {b} = {a * s * s * b:,} "
          "(b: the samples of one dp rank)")
    print()
    at = policy.activation  # the formula's widths: the activations' (and 1-byte masks in Megatron's set)
    if megatron:  # boolean masks: 1 byte; the layer norms' row statistics, the one difference, apart
        print("| recompute | kept for backward | in the blocks | per layer, measured | per layer, Korthikanti "
              f"et al. at {at}, 1-byte masks | per layer, measured - formula |")
        print("| --- | ---: | ---: | --- | --- | --- |")
    else:
        print("| recompute | kept for backward | in the blocks | per layer, measured | per layer, Korthikanti "
              f"et al. at {at} |")
        print("| --- | ---: | ---: | --- | --- |")
    for recompute in RECOMPUTE:
        m = reports[(recompute, 0)]
        kept = dict(m.kept)
        blocks = sum(n for kind, n in kept.items() if kind in BLOCK_KINDS)
        rest, core = per_layer_units(kept, cfg.layers, s, b, h, a)
        f_rest, f_core = korthikanti_bytes(s, b, h, a, tp, True, recompute, width, 1 if megatron else width)
        line = (f"| {recompute} | {m.kept_total:,} | {blocks:,} | {_units(rest, core)} | "
                f"{_units(f_rest / (s * b * h), f_core / (a * s * s * b))} |")
        if megatron:
            extra = blocks / cfg.layers - f_rest - f_core
            stats = 0 if recompute == "full" else 2 * 2 * stat * s * b // tp  # 2 layer norms, mean and deviation
            named = f" = the layer norms' row statistics, 2 x 2 x {stat} s·b/t" if extra == stats and stats else ""
            line += f" {extra:,.0f} bytes{named} |"
        print(line)
    print()
    print("| recompute | ZeRO | parameters | gradients | master copy | optimizer states | buffers | peak |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for (recompute, zero), m in reports.items():
        print(f"| {recompute} | {zero} | {m.params:,} | {m.grads:,} | {m.master:,} | {m.states:,} | "
              f"{m.buffers:,} | {m.peak:,} {m.moment} |")
    return 0


def _units(rest: float, core: float) -> str:
    return f"{rest:.2f} sbh" + (f" + {core:.2f} as²b" if core else "")


if __name__ == "__main__":
    raise SystemExit(run_script(main))
