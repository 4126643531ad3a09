#!/usr/bin/env python
"""Eager against replayed in one process: a GPT training step on N simulated ranks, the two modes alternating.

    python scripts/bench_eager.py                          # bench_gpt.py's GPT (d_model 128) on 8 ranks
    python scripts/bench_eager.py --ranks 1,2,4,8          # the ratio as the ranks split the same model
    python scripts/bench_eager.py --d-model 128,256,512    # and as the model widens
    python scripts/bench_eager.py --kept megatron          # the blocks of Megatron's fused pieces

Each configuration runs in a fresh process (`spmdsim.simulate`, bench_gpt.py's environment: one BLAS thread,
the heap kept as `spmdsim launch` keeps it). The step (forward, backward with buckets, AdamW) is captured
once (spmdsim.runtime.replay); then each of `--rounds` rounds runs the eager step and the replayed one, each
timed by its ranks' thread CPU, summed over the ranks. A line per configuration gives each mode's median CPU
a step and the median over rounds of the round's eager / replayed with its spread, and the load average
before and after. The mesh is dp x tp with tp = gcd(ranks, 4), sequence parallel when tp > 1 (8 ranks:
bench_gpt.py's dp 2 x tp 4). What the eager step adds is each operator's Python (the replay reruns the
recorded numpy calls and collectives alone), about the same per rank whatever the ranks and the width, so
the ratio falls as each rank's share of the arithmetic grows (docs/explanation/performance.md). `--kept megatron`: the
GPT's blocks built from Megatron's fused pieces (spmdsim.nn.ops.megatron), which keep Korthikanti et al.'s set
for backward (docs/howto/train.md), in place of the graph's operators.

`--apart N` runs each mode in processes of its own instead, as bench_gpt.py's launches do: N launches of an
eager process (the step alone, nothing captured) and N of a replayed one (captured, then replayed alone),
alternating; a launch's figure is the median of its rounds, and eager / replayed is taken launch by launch
(the median and spread over the N pairs). An eager step in a process that also holds a replayed step's record
costs more CPU than one alone (docs/explanation/performance.md), so the alternating figure overstates the ratio.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # spmdsim from this checkout, also when run by path

from spmdsim.base.malloc import glibc_env  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402


def _ints(ap: argparse.ArgumentParser, text: str, flag: str, example: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        ap.error(f"{flag} {text!r} must be a comma list of integers >= 1, e.g. {example}")
    return values


def _child(args: argparse.Namespace) -> dict:
    """One configuration's rounds (in this process): {"eager": [s, ...], "replayed": [s, ...]}, CPU a step."""
    import time

    import spmdsim
    from spmdsim import DTensor, Layout, Mesh
    from spmdsim.models.gpt import GPTConfig, batch, encode, load_text
    from spmdsim.runtime.replay import Scalar, capture
    from _bench_gpt_shared import gpt_step  # the step bench_gpt.py times, built alike

    cfg = GPTConfig(layers=args.layers, d_model=args.d_model, heads=4, seq=args.seq, batch=8, dropout=0.1)
    ids = encode(load_text())
    tp = math.gcd(args.ranks, 4)

    def body() -> dict:
        comm = spmdsim.world()
        mesh = Mesh(Layout((args.ranks // tp, tp), ("dp", "tp")), comm)
        model, params, train_step = gpt_step(cfg, mesh, args.kept)
        x, y = batch(ids, cfg, 0)
        xd, yd = (DTensor.from_global(mesh, a, mesh.layout(model.batch, None)) for a in (x, y))
        modes = ("eager", "replayed") if args.mode == "both" else (args.mode,)
        graph = capture(train_step, xd, yd, Scalar(0), state=params) if "replayed" in modes else None
        for _ in range(2):  # warm-up: each mode's caches and heap
            for mode in modes:
                train_step(xd, yd, 1) if mode == "eager" else graph(xd, yd, 1)
        out: dict = {mode: [] for mode in modes}
        for _ in range(args.rounds):
            for mode in modes:
                comm.Barrier()
                start = time.thread_time()
                train_step(xd, yd, 1) if mode == "eager" else graph(xd, yd, 1)
                out[mode].append(comm.allreduce(time.thread_time() - start))
        mesh.close()
        return out

    return spmdsim.simulate(args.ranks, body)[0]


def _launch(args: argparse.Namespace, mode: str, n: int, d: int, env: dict) -> Optional[dict]:
    """One child process of `mode` ("both", "eager" or "replayed") on `n` ranks at d_model `d`: the rounds' CPU
    a step it printed ({mode: [s, ...]}), else None and one line saying why."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--mode", mode, "--ranks", str(n),
           "--d-model", str(d), "--layers", str(args.layers), "--seq", str(args.seq), "--rounds", str(args.rounds),
           "--kept", args.kept]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    result = next((json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    if result is None:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"bench_eager: ranks {n}, d_model {d} failed (exit {done.returncode}): {last}", file=sys.stderr)
    return result


def _say(line: str) -> None:
    """Print `line` within 100 columns (its continuation indented)."""
    from spmdsim.programs.viz.table import wrap_lines

    print("\n".join(wrap_lines([line])), flush=True)


def _load() -> str:
    return f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "?"


def main() -> int:
    from spmdsim.nn.autograd.kept import KEPT  # the sets a GPT's blocks may keep (its `kept`)

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="8", help="simulated ranks, a comma list (default 8)")
    ap.add_argument("--d-model", default="128", help="the GPT's width, a comma list (default 128)")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=8, help="eager and replayed steps timed, each (default 8)")
    ap.add_argument("--apart", type=int, default=0, metavar="N",
                    help="each mode in processes of its own: N launches of each, alternating (default: both "
                         "modes alternating in one process)")
    ap.add_argument("--kept", choices=KEPT, default="graph",
                    help="what the blocks keep for backward: the graph's operators (default) or Megatron's fused "
                         "pieces")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=("both", "eager", "replayed"), default="both", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.apart < 0:
        ap.error(f"--apart {args.apart} must be at least 1 (or 0: both modes in one process)")
    for flag in ("rounds", "layers", "seq"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} {getattr(args, flag)} must be at least 1")
    if args.child:
        args.ranks, args.d_model = int(args.ranks), int(args.d_model)
        print("RESULT " + json.dumps(_child(args)))
        return 0
    ranks, widths = _ints(ap, args.ranks, "--ranks", "1,2,4,8"), _ints(ap, args.d_model, "--d-model", "32,128,256")
    for d in widths:
        if d % 4:
            ap.error(f"--d-model {d} must be a multiple of the 4 heads")
    for n in ranks:
        tp = math.gcd(n, 4)
        if 8 % (n // tp) or args.seq % tp:
            ap.error(f"--ranks {n} makes dp {n // tp} x tp {tp}: dp must divide the batch of 8 and tp the seq "
                     f"{args.seq}")
    _say(f"load average at start {_load()}; GPT {args.layers} layers, seq {args.seq}, batch 8"
         + (", Megatron's fused pieces; " if args.kept == "megatron" else "; ")
         + (f"{args.apart} launches of each mode, {args.rounds} steps timed in each" if args.apart else
            f"{args.rounds} rounds of an eager and a replayed step") + ", CPU summed over the ranks")
    env = glibc_env(dict(os.environ, OMP_NUM_THREADS="1"))
    for d in widths:
        for n in ranks:
            tp = math.gcd(n, 4)
            if args.apart:  # a launch per mode, in turn (each pair's first mode alternating); a launch's median
                eager, replayed = [], []
                for i in range(args.apart):
                    for mode in ("eager", "replayed") if i % 2 == 0 else ("replayed", "eager"):
                        result = _launch(args, mode, n, d, env)
                        if result is None:
                            return 1
                        (eager if mode == "eager" else replayed).append(statistics.median(result[mode]))
                where = f", each mode in its own process ({args.apart} launches each)"
            else:
                result = _launch(args, "both", n, d, env)
                if result is None:
                    return 1
                eager, replayed, where = result["eager"], result["replayed"], ""
            ratios = [e / r for e, r in zip(eager, replayed)]
            _say(f"ranks {n} (dp {n // tp} x tp {tp}), d_model {d}{where}: eager "
                 f"{statistics.median(eager) * 1e3:,.1f} ms, replayed {statistics.median(replayed) * 1e3:,.1f} ms "
                 f"of CPU a step; eager / replayed {statistics.median(ratios):.2f}x "
                 f"({min(ratios):.2f}-{max(ratios):.2f})")
    _say(f"load average at end {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
