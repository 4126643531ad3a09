"""MindSpore ``ops.MatMul().shard(((2, 1), (1, 4)))`` on 8 ranks: no communication at all.

x (256, 128) @ w (128, 192). Run: timeout -k 5 120 mpiexec -n 8 python examples/matmul_2x1_1x4.py
(or `python examples/matmul_2x1_1x4.py --ranks 8`: simulated ranks, one process)
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
from spmdsim.references.forward import matmul_region
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

# Strategy ((2, 1), (1, 4)): x rows cut in 2, w columns cut in 4, K never cut.
# Device matrix (m, k, n) = (2, 1, 4): rank = 4 * i_m + i_n.
m = matmul_layouts("((2,1),(1,4))", 8)
mesh = Mesh(m.layout, comm)  # 8 ranks: on another count it says how to get 8, and exits 2
xs = SeededTensor((256, 128), "float32", seed=0)
ws = SeededTensor((128, 192), "float32", seed=1)

# Rank (i_m, i_n) holds x[128 i_m : 128 (i_m+1), :] (replicated over the 4 n
# ranks) and w[:, 48 i_n : 48 (i_n+1)] (replicated over the 2 m ranks).
x = DTensor.from_seeded(mesh, m.x, xs)
w = DTensor.from_seeded(mesh, m.w, ws)

# Each rank has whole dot products (all 128 terms of K), so its (128, 48)
# block of y is final: no collective is needed, and the trace stays empty.
with collect_trace() as trace:
    y = matmul(x, w)

verdict = y.check(matmul_region(xs, ws))
if comm.rank == 0:
    # Which block of each tensor every rank holds, from the layouts alone (no communication).
    print(holdings({"x": x, "w": w, "y": y}))
# Every rank's own lines, printed by rank 0 in rank order; ranks with the same lines
# share one entry ("ranks 0-7: ...").
print_ranked(comm, f"y layout {y.layout}, local {y.local.shape}", *trace_lines(trace), verdict)
sys.exit(0 if verdict.passed and not trace.counts() else 1)
