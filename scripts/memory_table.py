#!/usr/bin/env python
"""The GPT example's memory per rank with each recompute and ZeRO choice, measured (docs/training.md, "Memory").

Trains examples/train_gpt.py's model (4 layers, d_model 128, 4 heads, seq 64, batch 8) two steps on
8 simulated ranks, dp 2 x tp 4 with sequence parallelism, once per combination, and prints rank 0's
figures at the second step as two markdown tables: what the graph kept for backward after the
forward (spmdsim.autograd.kept_bytes), per layer in Korthikanti et al.'s units (s sequence, b the
samples a dp rank runs, h d_model, a heads) beside their formula at spmdsim's float64 (every value
and dropout mask 8 bytes: spmdsim.gpt.memory.korthikanti_bytes); and the parameters, gradients,
master copy, optimizer states, buffers and peak (spmdsim.gpt.memory.MemoryReport).

    python scripts/memory_table.py
"""
from __future__ import annotations

import argparse

import spmdsim
from spmdsim.gpt import GPTConfig, encode, load_text
from spmdsim.gpt.memory import BLOCK_KINDS, RECOMPUTE, ZERO, korthikanti_bytes, per_layer_units
from spmdsim.gpt.train import train

DP, TP = 2, 4


def measured(cfg: GPTConfig, ids, recompute: str, zero: int):
    """Rank 0's MemoryReport at the second step."""
    steps = spmdsim.simulate(DP * TP, lambda: train(cfg, spmdsim.world(), DP, TP, 2, ids, sp=True, check=False,
                                                    recompute=recompute, zero=zero, memory=True)[1])
    return steps[0][-1].memory


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    cfg = GPTConfig()
    ids = encode(load_text())
    s, b, h, a = cfg.seq, cfg.batch // DP, cfg.d_model, cfg.heads
    reports = {(r, z): measured(cfg, ids, r, z) for r in RECOMPUTE for z in ZERO}
    print(f"GPT {cfg.layers} layers, d_model {h}, {a} heads, seq {s}, batch {cfg.batch}; dp {DP} x tp {TP} "
          f"with sp; rank 0, bytes")
    print("s·b·h = 64 x 4 x 128 = 32,768; a·s²·b = 4 x 64² x 4 = 65,536 (b: the samples of one dp rank)")
    print()
    print("| recompute | kept for backward | in the blocks | per layer, measured | per layer, Korthikanti "
          "et al. at float64 |")
    print("| --- | ---: | ---: | --- | --- |")
    for recompute in RECOMPUTE:
        m = reports[(recompute, 0)]
        kept = dict(m.kept)
        blocks = sum(n for kind, n in kept.items() if kind in BLOCK_KINDS)
        rest, core = per_layer_units(kept, cfg.layers, s, b, h, a)
        f_rest, f_core = korthikanti_bytes(s, b, h, a, TP, True, recompute, 8, 8)
        print(f"| {recompute} | {m.kept_total:,} | {blocks:,} | {_units(rest, core)} | "
              f"{_units(f_rest / (s * b * h), f_core / (a * s * s * b))} |")
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
    raise SystemExit(main())
