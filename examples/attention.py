"""Multi-head attention on DTensors, heads split over the ranks (Megatron's layout): one Allreduce.

x (8, 16) replicated; 2 heads per rank of width 4. Q, K, V are column-parallel,
so rank r computes the columns of its own heads; reshape and transpose give
(heads, seq, width) with the heads split, attention runs per head with no
communication, and the row-parallel output projection ends in the one
Allreduce. Run: timeout -k 5 120 mpiexec -n 8 python examples/attention.py
(or `python examples/attention.py --ranks 8`: simulated ranks, one process)
"""
import argparse
import sys

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim.runtime.sim import dry_run_active, once, script
from spmdsim import Layout, SeededTensor, reference
from spmdsim.layouts.holdings import holdings
from spmdsim.nn.ops import matmul, reshape, scale, softmax, transpose
from spmdsim import DTensor, Mesh, collect_trace, install_excepthook
from spmdsim.runtime.ranked import print_ranked, trace_lines

# --help prints this docstring; an argument other than --ranks N and --dry-run is refused (exit 2)
parser = OnceParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--ranks", metavar="N", help="run on N simulated ranks in this process (no mpiexec)")
parser.add_argument("--dry-run", action="store_true", help="with --ranks: shapes only, each rank's bytes and peak")
parser.parse_args()
# With --ranks N this file runs on N simulated ranks in this process (no mpiexec).
script(__file__, ranks=8)  # 1 process without --ranks: says how to get 8
comm = spmdsim.world()  # MPI's COMM_WORLD, or this simulated rank's
# An error on some ranks only ends the whole job instead of hanging the others.
install_excepthook(comm)
p = comm.size
seq, d_model, heads, width = 8, 16, 2 * p, 4

mesh = Mesh(Layout((p,), ("mp",)), comm)
L = mesh.layout
srcs = {name: SeededTensor(shape, "float64", seed, low=-1, high=1)
        for name, shape, seed in (("x", (seq, d_model), 1), ("Wq", (d_model, heads * width), 2),
                                  ("Wk", (d_model, heads * width), 3), ("Wv", (d_model, heads * width), 4),
                                  ("Wo", (heads * width, d_model), 5))}
x = DTensor.from_seeded(mesh, L(None, None), srcs["x"])  # replicated input
# Column-parallel Q, K, V: rank r holds the columns of heads 2r and 2r+1.
wq, wk, wv = (DTensor.from_seeded(mesh, L(None, "mp"), srcs[n]) for n in ("Wq", "Wk", "Wv"))
# Row-parallel output projection: its rows match the head columns each rank holds.
wo = DTensor.from_seeded(mesh, L("mp", None), srcs["Wo"])


def per_head(t):
    """(seq, heads*width) split on columns -> (heads, seq, width) split on heads: no communication."""
    return transpose(reshape(t, (seq, heads, width)), (1, 0, 2))


with collect_trace() as trace:
    q, k, v = (per_head(matmul(x, w)) for w in (wq, wk, wv))
    # Each rank holds whole heads, so the scores, the softmax along keys and the
    # weighted values are all local (batched matmul over the split head dim).
    scores = scale(matmul(q, k, transpose_b=True), width ** -0.5)
    ctx = matmul(softmax(scores), v)
    # Back to (seq, heads*width) split on columns, then the row-parallel projection:
    # a partial sum over the heads, finished by the one Allreduce.
    merged = reshape(transpose(ctx, (1, 0, 2)), (seq, heads * width))
    y = matmul(merged, wo)


def reference_y():
    """The same attention on the global tensors in one process (numpy)."""
    full = {n: t.full() for n, t in srcs.items()}
    qf, kf, vf = ((full["x"] @ full[w]).reshape(seq, heads, width).transpose(1, 0, 2) for w in ("Wq", "Wk", "Wv"))
    ctx_f = reference.softmax(qf @ kf.transpose(0, 2, 1) * width ** -0.5) @ vf
    return ctx_f.transpose(1, 0, 2).reshape(seq, heads * width) @ full["Wo"]


# Simulated ranks (--ranks) compute the reference once between them; MPI ranks each their own.
# A dry run has no values to check: the check never calls the function, so no reference is made.
verdict = y.check(lambda region: once("attention reference", reference_y)[region])
expected = {"allreduce": 1} if p > 1 else {}
ok = verdict.passed and trace.counts() == expected
if comm.rank == 0 and not dry_run_active():  # a dry run prints its report instead
    # Which block of each tensor every rank holds, from the layouts alone (no communication).
    print(holdings({"x": x, "Wq": wq, "Wo": wo}))                  # the inputs
    print(holdings({"q per head": q, "scores": scores, "y": y}))  # what the heads compute
# Every rank's own lines, printed by rank 0 in rank order; ranks with the same lines
# share one entry ("ranks 0-7: ...").
print_ranked(comm, *trace_lines(trace), verdict, "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
