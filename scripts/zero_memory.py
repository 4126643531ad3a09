r"""One rank's memory under ZeRO stages 0 to 3, side by side, counted from the program's dry run.

For each stage, the dry run of one training step of the GPT (spmdsim.tools.estimate.ledger.gpt_ledger, the
ledger `spmdsim estimate` prints: shapes only, one rank's bytes from the blocks the program holds) priced
at --precision's widths: the model states (parameters, gradients, master copy, optimizer states), the
activations kept for backward, the gathered parameters ZeRO-3 holds beyond them at its peak, and the peak.

Run: python scripts/zero_memory.py --layers 36 --hidden 4096 --heads 32 --seq 1024 --vocab 51200 --dp 64
"""
import argparse
import sys

from spmdsim.models.gpt import GPTConfig
from spmdsim.tools.cli.main import run_script
from spmdsim.tools.estimate.ledger import PRECISIONS, gpt_ledger, stage_memory

ROWS = ("parameters", "gradients", "master copy", "optimizer states", "model states", "activations",
        "gathered beyond", "peak")


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("layers", 4), ("hidden", 128), ("heads", 4), ("seq", 64), ("vocab", 128), ("dp", 8),
                          ("tp", 1), ("micro-batch", 1)):
        parser.add_argument(f"--{name}", type=int, default=default, metavar="N", help=f"default {default}")
    parser.add_argument("--precision", default="fp16-mixed", choices=sorted(PRECISIONS),
                        help="the widths each role is priced at (default fp16-mixed, the ZeRO paper's)")
    args = parser.parse_args()
    for name in ("layers", "hidden", "heads", "seq", "vocab", "dp", "tp", "micro_batch"):
        if getattr(args, name) < 1:
            sys.exit(f"zero_memory.py: error: --{name.replace('_', '-')} {getattr(args, name)} must be >= 1")
    return args


def main() -> int:
    args = _arguments()
    cfg = GPTConfig(layers=args.layers, d_model=args.hidden, heads=args.heads, seq=args.seq, vocab=args.vocab,
                    batch=args.micro_batch * args.dp)
    columns = {}
    for zero in (0, 1, 2, 3):
        (stage,) = gpt_ledger(cfg, 1, args.dp, args.tp, zero=zero)
        mem = stage_memory(stage, args.precision, zero)
        held = dict(mem.held)
        held["model states"] = sum(held[r] for r in ("parameters", "gradients", "master copy", "optimizer states"))
        held["gathered beyond"] = mem.gathered
        held["peak"] = mem.peak
        columns[zero] = held
    print(f"GPT {args.layers} layers, hidden {args.hidden}, {args.heads} heads, seq {args.seq}, vocab {args.vocab}")
    print(f"dp {args.dp} x tp {args.tp}, {args.micro_batch} sequence(s) a rank, priced at {args.precision}")
    unit, scale = ("GB (1e9 bytes)", 1e9) if columns[0]["peak"] >= 1e9 else ("MB (1e6 bytes)", 1e6)
    print(f"one rank's {unit:<15} {'ZeRO-0':>9} {'ZeRO-1':>9} {'ZeRO-2':>9} {'ZeRO-3':>9}")
    for row in ROWS:
        print(f"{row:<26} " + " ".join(f"{columns[z][row] / scale:9.3f}" for z in (0, 1, 2, 3)))
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
