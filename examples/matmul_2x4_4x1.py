"""MindSpore ``ops.MatMul().shard(((2, 4), (4, 1)))`` (the operator-level parallel tutorial's matmul1) on 8 ranks.

x (32, 784) @ fc1_weight (784, 512). Run: timeout -k 5 120 mpiexec -n 8 python examples/matmul_2x4_4x1.py
(or `python examples/matmul_2x4_4x1.py --ranks 8`: simulated ranks, one process)
"""
import argparse
import sys

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim.runtime.sim import script
from spmdsim import SeededTensor
from spmdsim.layouts.dialects.strategy import matmul_layouts
from spmdsim.layouts.holdings import holdings
from spmdsim.nn.ops import matmul
from spmdsim.references.forward import matmul_region, matmul_rounding
from spmdsim import DTensor, Mesh, collect_trace, install_excepthook
from spmdsim.runtime.ranked import print_ranked, trace_lines

# --help prints this docstring; an argument other than --ranks N and --dry-run is refused (exit 2)
parser = OnceParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--ranks", metavar="N", help="run on N simulated ranks in this process (no mpiexec)")
parser.add_argument("--dry-run", action="store_true", help="with --ranks: shapes only, each rank's bytes and peak")
parser.parse_args()
# With --ranks N this file runs on N simulated ranks in this process (no mpiexec).
script(__file__)
comm = spmdsim.world()  # MPI's COMM_WORLD, or this simulated rank's
# An error on some ranks only ends the whole job instead of hanging the others.
install_excepthook(comm)

# Strategy ((2, 4), (4, 1)): x rows cut in 2, x columns (= K) cut in 4, w rows
# (= K) cut in 4. Device matrix (m, k, n) = (2, 4, 1): rank = 4 * i_m + i_k.
m = matmul_layouts("((2,4),(4,1))", 8)
mesh = Mesh(m.layout, comm)  # 8 ranks: on another count it says how to get 8, and exits 2
xs = SeededTensor((32, 784), "float32", seed=0)
ws = SeededTensor((784, 512), "float32", seed=1)

# Each rank makes only its own blocks: x[16*i_m : 16*(i_m+1), 196*i_k : 196*(i_k+1)]
# and w[196*i_k : 196*(i_k+1), :] (the whole 512 columns, since n is cut once).
x = DTensor.from_seeded(mesh, m.x, xs)
w = DTensor.from_seeded(mesh, m.w, ws)

# The local product x_blk @ w_blk (16, 512) covers only 196 of the 784 terms of
# each dot product: it is a partial sum. The 4 ranks sharing i_m (one "k" group,
# e.g. ranks {0,1,2,3}) add their partial sums with one Allreduce.
with collect_trace() as trace:
    y = matmul(x, w)

# Check: each rank compares its (16, 512) block with X[rows, :] @ W[:, :] made
# from the seeds, never the whole result.
# Within 2 k eps of the magnitudes that entered each output (|x| @ |w|, docs/explanation/tolerances.md "Tolerances"),
# whatever order the ranks summed in.
rtol, scale = matmul_rounding(xs, ws)
verdict = y.check(matmul_region(xs, ws), rtol=rtol, scale=scale)
if comm.rank == 0:
    # Which block of each tensor every rank holds, from the layouts alone (no communication).
    print(holdings({"x": x, "w": w, "y": y}))
# Every rank's own lines, printed by rank 0 in rank order; ranks with the same lines
# share one entry ("ranks 0-7: ...").
print_ranked(comm, f"y layout {y.layout}, local {y.local.shape}", *trace_lines(trace), verdict)
sys.exit(0 if verdict.passed else 1)
