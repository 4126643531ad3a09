#!/usr/bin/env python
"""How far a bf16-mixed run lies from three references, step by step: the figures of docs/howto/bf16.md's
"Can it fail?".

    python scripts/bf16_references.py --steps 50    # 3 runs of 50 steps: about a CPU-minute
    python scripts/bf16_references.py --layers 2 --d-model 32 --seq 16 --steps 3    # a small one: 2 CPU-s

Each run is examples/train_gpt.py's default GPT (4 layers, d_model 128, seq 64, batch 8, dropout 0.1; --layers,
--d-model and --seq change its size) on
dp 2 x tp 4 with sequence parallelism, 8 simulated ranks in this process, under bf16-mixed, from the same
start, and its check compares each step with one reference: the policy's own (the check's,
spmdsim.models.gpt.mixed), float64 throughout (spmdsim.models.gpt.reference: a reference that ignores the
policy) and the policy's with each norm rounding its normalized values, their product with the weight and
the bias's sum (three roundings where the fused kernel makes one). Each is put in place of the check's for
its run only. Per reference, one row: the loss's difference (median and largest over the steps), the steps
whose loss differs by more than its tolerance (and the first), the gradients' (median and largest) and
the steps over their tolerance.
"""
from __future__ import annotations

import argparse
import statistics

import numpy as np

import spmdsim
from spmdsim import SpmdsimError
from spmdsim.base.precision import wide
from spmdsim.models.gpt import GPTConfig, encode, load_text, mixed, reference
from spmdsim.models.gpt import reference_step
from spmdsim.models.gpt.train import train
from spmdsim.tools.cli.main import run_script

_MIXED_STEP = reference_step._mixed_step  # the policy's step, which the float64 reference still updates with


def _float64_step(start, x, y, cfg, step, policy, grads, *rest, **options):
    """The policy's step for the update (the check reads the run's optimizer exactly), float64's loss and
    gradients."""
    _, _, updated = _MIXED_STEP(start, x, y, cfg, step, policy, grads, *rest, **options)
    loss, grads64 = reference.loss_and_grads(start["params"], x, y, cfg, step)
    return loss, grads64, updated


def _norm_rounded_three_times(P, pre, h, cfg, r):
    """A layer norm that rounds its normalized values, their product with the weight and the sum with the bias."""
    block = wide(h)
    inv = 1.0 / h.shape[-1]
    c = block - np.sum(block, axis=-1, keepdims=True) * inv
    root = np.sqrt(np.sum(c * c, axis=-1, keepdims=True) * inv + cfg.ln_eps)
    yn = wide(r(c / root))
    return r(wide(r(yn * wide(P[pre + ".w"]))) + wide(P[pre + ".b"])), (yn, 1.0 / root)


REFERENCES = {"the same policy": {}, "float64 throughout": {(reference_step, "_mixed_step"): _float64_step},
              "norm rounded three times": {(mixed, "_ln"): _norm_rounded_three_times}}


def run(cfg: GPTConfig, ids: np.ndarray, steps: int, swaps: dict) -> list:
    """Each step's StepResult of the run on the text `ids`, checked against the reference with `swaps` in place."""
    saved = {key: getattr(*key) for key in swaps}
    try:
        for (module, name), value in swaps.items():
            setattr(module, name, value)
        return spmdsim.simulate(8, lambda: train(cfg, spmdsim.world(), 2, 4, steps, ids, sp=True,
                                                 precision="bf16-mixed")[1])[0]
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)


def row(name: str, results: list) -> str:
    """The table's row for one reference."""
    loss, grads = [r.errors[0] for r in results], [r.errors[1] for r in results]
    tol_loss, tol_grads = results[0].tolerances[:2]
    over = [r.step for r in results if r.errors[0] > tol_loss]
    first = f", step {over[0]}" if over else ""
    over_grads = sum(g > tol_grads for g in grads)
    return (f"| {name} | {statistics.median(loss):.1e}, {max(loss):.1e} | {len(over)} of {len(results)}{first} | "
            f"{statistics.median(grads):.1e}, {max(grads):.1e} | {over_grads} of {len(results)} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="steps a run (default 50; ~0.4 CPU-s each)")
    parser.add_argument("--layers", type=int, default=GPTConfig.layers, help="the GPT's layers (default 4)")
    parser.add_argument("--d-model", type=int, default=GPTConfig.d_model, help="its width (default 128)")
    parser.add_argument("--seq", type=int, default=GPTConfig.seq, help="its sequence (default 64)")
    args = parser.parse_args()
    for name, value, top in (("steps", args.steps, 1000), ("layers", args.layers, 64),
                             ("d-model", args.d_model, 4096), ("seq", args.seq, 4096)):
        if not 1 <= value <= top:
            parser.error(f"--{name} {value} must be 1 to {top}")
    try:  # a size GPTConfig refuses: its line (one the mesh cannot split: train's, before any collective)
        cfg = GPTConfig(layers=args.layers, d_model=args.d_model, seq=args.seq)
    except SpmdsimError as e:
        parser.error(str(e))
    print(f"bf16-mixed on dp 2 x tp 4 with sp, 8 simulated ranks, {args.steps} steps against each reference "
          f"({len(REFERENCES)} runs)", flush=True)
    ids = encode(load_text())  # the example's text, once for the three runs
    tolerances = None
    lines = []
    for name, swaps in REFERENCES.items():
        results = run(cfg, ids, args.steps, swaps)
        tolerances = results[0].tolerances
        lines.append(row(name, results))
        print(f"  {name}: done", flush=True)
    print(f"\n| reference | loss: median, max | over {tolerances[0]:.1e}, first | gradients: median, max | "
          f"over {tolerances[1]:.1e} |")
    print("| --- | ---: | ---: | ---: | ---: |")
    print("\n".join(lines))


if __name__ == "__main__":
    run_script(main)
