"""Row-parallel Linear: Paddle ``split(x, size, "linear", axis=0)`` / Megatron RowParallelLinear.

x (24, 240) @ W (240, 72) + b. Run: timeout -k 5 120 mpiexec -n 8 python examples/linear_row.py
(or `python examples/linear_row.py --ranks 8`: simulated ranks, one process)
"""
import argparse
import sys

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim.runtime.sim import script
from spmdsim import SeededTensor
from spmdsim.layouts.holdings import holdings
from spmdsim.nn.ops import paddle_mesh, split
from spmdsim.references.forward import linear_region, matmul_rounding
from spmdsim.errors import RankCountError
from spmdsim import DTensor, collect_trace, install_excepthook
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
k, n = 240, 72
if k % p:
    # Raised on every rank alike: the excepthook prints it once and exits 2.
    raise RankCountError(f"in_features {k} does not split over {p} ranks: run a number that divides it, such as 8",
                         8, p)

mesh = paddle_mesh(p)  # 1-D ("mp",) over every rank
xs = SeededTensor((24, k), "float32", seed=0)
ws, bs = SeededTensor((k, n), "float32", seed=1), SeededTensor((n,), "float32", seed=2)

# x is replicated; split() keeps on each rank only its columns
# x[:, r*k/p : (r+1)*k/p] (no communication: the rank already has them),
# matching its weight rows W[r*k/p : (r+1)*k/p, :]. The bias is replicated.
x = DTensor.from_seeded(mesh, mesh.layout(None, None), xs)

# Each rank's x_cols @ W_rows (24, 72) sums only k/p of the k terms: a partial
# sum. Allreduce over all ranks adds them; the bias is added once, after the
# sum (adding it before would count it p times).
with collect_trace() as trace:
    y = split(x, (k, n), operation="linear", axis=0, num_partitions=p,
              weight_attr=ws, bias_attr=bs)

# Within 2 (k + 1) eps of the magnitudes that entered each output (|x| @ |w| + |b|, docs/explanation/semantics.md
# "Tolerances"), whatever order the ranks summed in.
rtol, scale = matmul_rounding(xs, ws, bias=bs)
verdict = y.check(linear_region(xs, ws, bs), rtol=rtol, scale=scale)
if comm.rank == 0:
    # Which block of each tensor every rank holds, from the layouts alone (no communication).
    print(holdings({"x": x, "W": (mesh.layout("mp", None), (k, n)), "y": y}))
# Every rank's own lines, printed by rank 0 in rank order; ranks with the same lines
# share one entry ("ranks 0-7: ...").
print_ranked(comm, f"y layout {y.layout}, local {y.local.shape}", *trace_lines(trace), verdict)
sys.exit(0 if verdict.passed else 1)
