#!/usr/bin/env python
"""`spmdsim estimate` beside two papers' published step times, every row with the paper's own settings.

Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM"), Table 1: ten GPT models from 1.7B on 32 A100s to 1T on 3,072, with the settings of
Megatron-LM's examples/sc21/run_table_1.sh and CONFIG.sh (tp, pp, micro-batch, batch, layers, hidden,
heads, the layers per virtual stage where it sets them; seq 2048, fp16, full recomputation; GPT-2's
vocabulary padded to 128 x tp; where it sets DDP=local, Megatron's own data parallelism, which sums
the gradients after the backward: `--overlap none`). The paper's figure is TFLOP/s per GPU counting its eq. 3's FLOPs
(96Bslh²(1 + s/6h + V/16lh), the recomputed forward included); the script gives the same count at the
predicted step time. Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models"), Table 5: four models, each with full recomputation (no sequence parallelism) and with
sequence parallelism and selective recomputation, with the settings of Calculon's validation files
(validation/seqsel/tab5/*.json: tp, pp, interleaving, batch, micro-batch); the figure is the step time.

Every row runs `spmdsim estimate gpt ... --json` on the shipped a100-dgx machine (one dry run each,
about 1 to 8 CPU-seconds; 18 rows in about a minute) and prints predicted, published and the error,
then the mean |error| of each table.

    python scripts/estimate_tables.py
    python scripts/estimate_tables.py --table korthikanti --machine path/to/machine.json
    python scripts/estimate_tables.py --table korthikanti --calculon path/to/calculon

`--calculon DIR` adds Calculon's error beside each Table 5 row: the end-to-end table its own
`calculon llm-validation` prints from a checkout of https://github.com/calculon-ai/calculon (which
needs pandas), its "Delta" (published - predicted) / published turned to predicted / published - 1.
Calculon validates Table 5 only.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import NamedTuple, Optional

from spmdsim.tools.cli.main import run_script


class Row(NamedTuple):
    name: str
    layers: int
    hidden: int
    heads: int
    tp: int
    pp: int
    gpus: int
    micro: int
    batch: int
    virtual: int
    flags: tuple
    published: float  # TFLOP/s per GPU (Narayanan) or seconds a step (Korthikanti)
    local_ddp: bool = False  # run_table_1.sh's DDP=local: the gradient sums after the backward, not under it


_FULL = ("--recompute", "full")
_SEQSEL = ("--sp", "--recompute", "selective")

#: Narayanan et al. 2021, Table 1: parameters, heads, hidden, layers, tp, pp, GPUs, batch, TFLOP/s per GPU;
#: micro-batch and virtual stages (layers per virtual stage: 5, 5, 3, 1) from run_table_1.sh.
NARAYANAN = (
    Row("1.7B", 24, 2304, 24, 1, 1, 32, 16, 512, 1, _FULL, 137),
    Row("3.6B", 30, 3072, 32, 2, 1, 64, 16, 512, 1, _FULL, 138),
    Row("7.5B", 36, 4096, 32, 4, 1, 128, 16, 512, 1, _FULL, 142),
    Row("18.4B", 40, 6144, 48, 8, 1, 256, 8, 1024, 1, _FULL, 135),
    Row("39.1B", 48, 8192, 64, 8, 2, 512, 4, 1536, 1, _FULL, 138, True),
    Row("76.1B", 60, 10240, 80, 8, 4, 1024, 2, 1792, 3, _FULL, 140, True),
    Row("145.6B", 80, 12288, 96, 8, 8, 1536, 2, 2304, 2, _FULL, 148, True),
    Row("310.1B", 96, 16384, 128, 8, 16, 1920, 1, 2160, 2, _FULL, 155, True),
    Row("529.6B", 105, 20480, 128, 8, 35, 2520, 1, 2520, 3, _FULL, 163, True),
    Row("1008.0B", 128, 25600, 160, 8, 64, 3072, 1, 3072, 1, _FULL, 163, True),
)

#: Korthikanti et al. 2022, Table 5 (seconds a step); settings from Calculon's validation/seqsel/tab5 files.
KORTHIKANTI = (
    Row("22B full", 48, 6144, 64, 8, 1, 8, 4, 4, 1, _FULL, 1.42),
    Row("22B sp+sel", 48, 6144, 64, 8, 1, 8, 4, 4, 1, _SEQSEL, 1.10),
    Row("175B full", 96, 12288, 96, 8, 8, 64, 1, 64, 3, _FULL, 18.13),
    Row("175B sp+sel", 96, 12288, 96, 8, 8, 64, 1, 64, 3, _SEQSEL, 13.75),
    Row("530B full", 105, 20480, 128, 8, 35, 280, 1, 280, 3, _FULL, 49.05),
    Row("530B sp+sel", 105, 20480, 128, 8, 35, 280, 1, 280, 3, _SEQSEL, 37.83),
    Row("1T full", 128, 25600, 160, 8, 64, 512, 1, 512, 1, _FULL, 94.42),
    Row("1T sp+sel", 128, 25600, 160, 8, 64, 512, 1, 512, 1, _SEQSEL, 71.49),
)

SEQ, VOCAB = 2048, 50257

#: Calculon's names of Table 5's models and modes (its validation/seqsel/tab5 files), as rows here.
CALCULON_ROWS = {("megatron-22B", 0): "22B full", ("megatron-22B", 1): "22B sp+sel", ("gpt3-175B", 0): "175B full",
                 ("gpt3-175B", 1): "175B sp+sel", ("turing-530B", 0): "530B full", ("turing-530B", 1): "530B sp+sel",
                 ("megatron-1T", 0): "1T full", ("megatron-1T", 1): "1T sp+sel"}


def command(row: Row, machine: str) -> list:
    """The `spmdsim estimate` command of `row`."""
    dp = row.gpus // (row.tp * row.pp)
    cmd = ["spmdsim", "estimate", "gpt", "--layers", row.layers, "--hidden", row.hidden, "--heads", row.heads,
           "--seq", SEQ, "--vocab", VOCAB, "--pad-vocab-to", 128 * row.tp, "--micro-batch", row.micro,
           "--global-batch", row.batch, "--tp", row.tp, "--pp", row.pp, "--dp", dp, "--kept", "megatron",
           "--precision", "fp16-mixed", "--machine", machine, *row.flags]
    if row.virtual > 1:
        cmd += ["--virtual-stages", row.virtual]
    if row.local_ddp:
        cmd += ["--overlap", "none"]
    return [str(part) for part in cmd]


def eq3_flops(row: Row) -> float:
    """Narayanan et al.'s eq. 3: 96 B s l h² (1 + s / 6h + V / 16 l h), V = 51,200."""
    b, s, l, h, v = row.batch, SEQ, row.layers, row.hidden, 51200
    return 96 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))


def predicted_step(row: Row, machine: str) -> float:
    out = subprocess.run([sys.executable, "-m", "spmdsim", *command(row, machine)[1:], "--json"],
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{row.name}: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode}")
    return json.loads(out.stdout)["step_time_s"]


def calculon_errors(checkout: str) -> dict:
    """{row name: Calculon's error} from `calculon llm-validation` run in `checkout` (its end-to-end table:
    model, |, published, predicted, Delta, GiB, then the same for the second mode)."""
    script = os.path.join(checkout, "bin", "calculon")
    if not os.path.isfile(script):
        raise SystemExit(f"--calculon {checkout!r}: no bin/calculon there; expected a checkout of "
                         "https://github.com/calculon-ai/calculon")
    env = dict(os.environ, PYTHONPATH=checkout)
    out = subprocess.run([sys.executable, script, "llm-validation", "-b", checkout], capture_output=True,
                         text=True, timeout=600, env=env, cwd=checkout)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
        raise SystemExit(f"--calculon {checkout!r}: calculon llm-validation failed: {last}")
    lines = out.stdout.split("End-to-end", 1)[-1].splitlines()
    errors = {}
    for line in lines:
        cells = line.split(",")
        for mode in (0, 1):
            name = CALCULON_ROWS.get((cells[0], mode))
            if name is not None and len(cells) > 5 + 5 * mode:
                errors[name] = -float(cells[4 + 5 * mode].rstrip("%")) / 100
    if len(errors) != len(CALCULON_ROWS):
        raise SystemExit(f"--calculon {checkout!r}: found {len(errors)} of Table 5's 8 rows in its output")
    return errors


def _table(title: str, rows: tuple, machine: str, tflops: bool, verbose: bool,
           peer: Optional[dict] = None) -> float:
    unit = "TFLOP/s per GPU" if tflops else "s a step"
    print(f"{title} ({unit})")
    print(f"{'row':<14}{'predicted':>12}{'published':>12}{'error':>9}" + (f"{'Calculon':>10}" if peer else ""))
    errors = []
    for row in rows:
        step = predicted_step(row, machine)
        value = eq3_flops(row) / (row.gpus * step) / 1e12 if tflops else step
        errors.append(value / row.published - 1)
        theirs = f"{peer[row.name]:>+10.1%}" if peer else ""
        print(f"{row.name:<14}{value:>12.2f}{row.published:>12.2f}{errors[-1]:>+9.1%}{theirs}", flush=True)
        if verbose:
            print("  " + " ".join(command(row, machine)))
    mean = sum(abs(e) for e in errors) / len(errors)
    print(f"mean |error| {mean:.1%}, worst {max(errors, key=abs):+.1%}")
    if peer:
        theirs = [peer[row.name] for row in rows]
        print(f"Calculon: mean |error| {sum(abs(e) for e in theirs) / len(theirs):.1%}, "
              f"worst {max(theirs, key=abs):+.1%}")
    print()
    return mean


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", choices=("all", "narayanan", "korthikanti"), default="all")
    ap.add_argument("--machine", default="a100-dgx", help="a shipped machine or a machine file (default a100-dgx)")
    ap.add_argument("--commands", action="store_true", help="print each row's estimate command")
    ap.add_argument("--calculon", metavar="DIR", help="a Calculon checkout: its error beside Table 5's rows")
    args = ap.parse_args()
    peer = calculon_errors(args.calculon) if args.calculon and args.table != "narayanan" else None
    if args.table in ("all", "narayanan"):
        _table("Narayanan et al. 2021, Table 1", NARAYANAN, args.machine, True, args.commands)
    if args.table in ("all", "korthikanti"):
        _table("Korthikanti et al. 2022, Table 5", KORTHIKANTI, args.machine, False, args.commands, peer)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
