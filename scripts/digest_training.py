#!/usr/bin/env python
"""A digest of what training computes, to check that a change keeps every result bit for bit.

    python scripts/digest_training.py                      # every configuration below, one line each
    python scripts/digest_training.py --only dense,pp-1f1b # some of them
    python scripts/digest_training.py --list               # their names and commands (as shell lines)

Each configuration is a training example run on 8 simulated ranks (`--ranks 8`, its own Python) for a few
steps with `--save` into a fresh folder: its line is the SHA-256 of the checkpoint it saved (every rank's
file and rank 0's metadata, by name: the parameters and the optimizer's state after the last step, bit for
bit) and of the rows it printed for its steps (`--every 1`: each step's loss, calls, bytes and differences
from the one numpy process it is checked against). Run it before a change that should compute the same
(a speed change, a restructuring) and after it: equal lines, the same bits; the first differing line names a
configuration that computes otherwise. The configurations cover the kinds of step (fp64, fp32 and bf16-mixed;
both kept sets; recomputation; ZeRO-1 and ZeRO-2; Llama's options; the pipeline schedules; replayed steps;
the MoE GPT's dispatch, dropless and pipelined). Exit 1 when a run fails (its last lines printed).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from spmdsim.tools.cli.main import run_script

ROOT = Path(__file__).resolve().parent.parent
_SMALL = "--d-model 32 --seq 16 --steps 3 --every 1"
_GPT = f"examples/train_gpt.py --ranks 8 {_SMALL} --sample 0"
_MOE = f"examples/train_moe_gpt.py --ranks 8 {_SMALL}"
#: name -> the command's arguments after `python`
CONFIGS = {
    "dense": f"{_GPT} --dp 2 --tp 4 --sp",
    "fp32": f"{_GPT} --dp 2 --tp 4 --sp --precision fp32",
    "bf16": f"{_GPT} --dp 2 --tp 4 --sp --precision bf16-mixed",
    "megatron": f"{_GPT} --dp 2 --tp 4 --sp --kept megatron",
    "selective": f"{_GPT} --dp 2 --tp 4 --sp --recompute selective",
    "full": f"{_GPT} --dp 2 --tp 4 --sp --recompute full",
    "zero1": f"{_GPT} --dp 2 --tp 4 --sp --zero 1",
    "zero2": f"{_GPT} --dp 4 --tp 2 --sp --zero 2",
    "llama": f"{_GPT} --dp 4 --tp 2 --norm rms --mlp swiglu --rope --kv-heads 2 --no-bias --untied --dropout 0",
    "flash": f"{_GPT} --dp 2 --tp 4 --sp --attention flash --clip 1.0",
    "replay": f"{_GPT} --dp 2 --tp 4 --sp --replay",
    "pp-1f1b": f"{_GPT} --pp 2 --dp 2 --tp 2 --sp --microbatches 4 --schedule 1f1b",
    "pp-gpipe": f"{_GPT} --pp 2 --dp 2 --tp 2 --microbatches 4 --schedule gpipe",
    "pp-interleaved": f"{_GPT} --pp 2 --dp 2 --tp 2 --microbatches 4 --schedule interleaved --virtual-stages 2",
    "pp-zero1-replay": f"{_GPT} --pp 2 --dp 2 --tp 2 --sp --microbatches 4 --zero 1 --replay",
    "moe": f"{_MOE} --ep 2 --dp 2 --tp 2 --sp",
    "moe-dropless": f"{_MOE} --ep 4 --tp 2 --dropless",
    "moe-bf16-replay": f"{_MOE} --ep 2 --dp 2 --tp 2 --sp --precision bf16-mixed --replay",
    "moe-pp": f"{_MOE} --ep 2 --pp 2 --tp 2 --microbatches 2",
}
_LOSS_ROW = re.compile(r"^\s*\d+\s+\d+\.\d+")  # a step's row: its number, then its loss


def command(name: str) -> list:
    """The configuration's arguments after `python`, `--save` aside: its CONFIGS entry and its layers (2; 4 with
    virtual stages, two chunks a stage)."""
    return [*CONFIGS[name].split(), "--layers", "4" if "--virtual-stages" in CONFIGS[name] else "2"]


def digest(name: str) -> tuple[str, str]:
    """(the configuration's line, "" or its failure's last lines)."""
    with tempfile.TemporaryDirectory(prefix="spmdsim-digest-") as folder:
        saved = Path(folder) / "ckpt"
        argv = [sys.executable, *command(name), "--save", str(saved)]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
        if done.returncode != 0:
            last = (done.stdout + done.stderr).splitlines()[-6:]
            return f"{name:16} failed (exit {done.returncode})", "\n".join(last)
        state = hashlib.sha256()
        files = sorted(p for p in saved.rglob("*") if p.is_file())
        for path in files:
            state.update(path.relative_to(saved).as_posix().encode())
            state.update(path.read_bytes())
        rows = [line for line in done.stdout.splitlines() if _LOSS_ROW.match(line)]
        printed = hashlib.sha256("\n".join(rows).encode()).hexdigest()
        return f"{name:16} state {state.hexdigest()[:16]} ({len(files)} files)  steps {printed[:16]} " \
               f"({len(rows)} rows)", ""


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=None, help="comma list of configuration names (default: all; --list)")
    ap.add_argument("--list", action="store_true", help="print each configuration's name and command, and exit")
    args = ap.parse_args(argv)
    if args.list:
        for name in CONFIGS:  # within 100 columns: the command's lines continued with a backslash
            lines = textwrap.wrap(f"python {' '.join(command(name))} --save DIR", 80, break_long_words=False,
                                  break_on_hyphens=False)
            print(f"{name:16} " + " \\\n                 ".join(lines))
        return 0
    names = list(CONFIGS) if args.only is None else [n.strip() for n in args.only.split(",")]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        ap.error(f"--only {args.only!r}: unknown configuration {', '.join(map(repr, unknown)) or '(none)'}; "
                 f"expected names from {', '.join(CONFIGS)}")
    failed = False
    for name in names:
        line, error = digest(name)
        print(line, flush=True)
        if error:
            print(error, file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_script(main))
