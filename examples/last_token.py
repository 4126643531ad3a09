"""The last position of a sequence-split activation, x[:, -1]: who sends what, against gathering the sequence.

A GPT's next-token logits read the hidden state of the last position only.
Under sequence parallelism the positions are split over tp, so one rank of
each tp group holds the last one: `x[:, -1]` moves only that position's row
to the rest of its group, where making the sequence whole first (one
Allgather) would bring every rank every position. Forward and x's gradient
are checked against numpy.
Run: python examples/last_token.py --ranks 4   (or: timeout -k 5 120 mpiexec -n 4 python ...)
"""
import argparse

import numpy as np

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim import DTensor, Layout, Mesh, SeededTensor, collect_trace, ops, print_ranked

# --help prints this docstring; an argument other than --ranks N and --dry-run is refused (exit 2)
parser = OnceParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--ranks", metavar="N", help="run on N simulated ranks in this process (no mpiexec)")
parser.add_argument("--dry-run", action="store_true", help="with --ranks: shapes only, each rank's bytes and peak")
parser.parse_args()
spmdsim.script(__file__, ranks=4)  # --ranks N: N simulated ranks here (1 process alone: says how to get 4)
world = spmdsim.world()
tp = 2 if world.size % 2 == 0 else 1
mesh = Mesh(Layout((world.size // tp, tp), ("dp", "tp")), world)
L = mesh.layout
B, T, D = 2 * (world.size // tp), 4 * tp, 6  # batch over dp, positions over tp
source = SeededTensor((B, T, D), "float64", seed=1)
x = DTensor.from_seeded(mesh, L("dp", "tp", None), source).requires_grad_()
with collect_trace() as sliced:
    last = x[:, -1]  # (B, D): whole on tp afterwards
with collect_trace() as gathered:
    x.redistribute(L("dp", None, None))  # the alternative: every position on every rank
ops.sum(last * last).backward()

full = source.full()
verdicts = [last.check(full[:, -1]), x.grad.check(np.where(np.arange(T)[None, :, None] == T - 1, 2 * full, 0.0))]
(lo, hi), sent = x.layout.bounds(mesh.rank, (B, T, D))[1], sliced.entries[0] if sliced.entries else None
if mesh.rank == 0:
    print(f"x {(B, T, D)} mapped {x.layout}; x[:, -1] mapped {last.layout}")
    print("        positions   x[:, -1] sent   received   the positions gathered: received")
moved = (sent.bytes_sent, sent.bytes_received) if sent else (0, 0)
whole = sum(e.bytes_received for e in gathered.entries)
print_ranked(world, f"{f'{lo}:{hi}':<9} {moved[0]:>10,} B {moved[1]:>8,} B {whole:>31,} B", fold=False)
if mesh.rank == 0:
    print(f"forward and x's gradient vs numpy: {'PASS' if all(verdicts) else 'FAILED'}")
raise SystemExit(0 if all(verdicts) else 1)
