"""MindSpore advanced operator parallel: Layout((2, 2, 2), ("dp", "sp", "mp")).

matmul1.shard((layout("mp", ("sp", "dp")), layout(("sp", "dp"), "None"))) on
x (32, 784) @ fc1_weight (784, 512). Run: timeout -k 5 120 mpiexec -n 8 python examples/matmul_layout_tuple.py
(or `python examples/matmul_layout_tuple.py --ranks 8`: simulated ranks, one process)
"""
import argparse
import sys

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim.runtime.sim import script
from spmdsim import Layout, SeededTensor
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

layout = Layout((2, 2, 2), ("dp", "sp", "mp"))
mesh = Mesh(layout, comm)  # 8 ranks: on another count it says how to get 8, and exits 2
xs = SeededTensor((32, 784), "float32", seed=0)
ws = SeededTensor((784, 512), "float32", seed=1)

# x rows over "mp" (2 pieces of 16); x columns over ("sp", "dp"), sp major
# (4 pieces of 196): device (dp, sp, mp) = (0, 1, 0), rank 2, holds
# x[0:16, 392:588], as the seed's table says. w rows use the same ("sp", "dp")
# cut, so rank 2 holds fc1_weight[392:588, 0:512].
x = DTensor.from_seeded(mesh, layout("mp", ("sp", "dp")), xs)
w = DTensor.from_seeded(mesh, layout(("sp", "dp"), None), ws)

# The contraction dim K is split over ("sp", "dp"): each product holds 196 of
# 784 terms. The 4 ranks with the same mp coordinate ({0,4,2,6} and {1,5,3,7},
# in (sp, dp) order) add them with one Allreduce; y ends as ("mp", None).
with collect_trace() as trace:
    y = matmul(x, w)

# Within 2 k eps of the magnitudes that entered each output (|x| @ |w|, docs/explanation/tolerances.md "Tolerances"),
# whatever order the ranks summed in.
rtol, scale = matmul_rounding(xs, ws)
verdict = y.check(matmul_region(xs, ws), rtol=rtol, scale=scale)
if comm.rank == 0:
    # Which block of each tensor every rank holds, from the layouts alone (no communication);
    # coordinates are (dp, sp, mp).
    print(holdings({"x": x, "w": w, "y": y}))
# Every rank's own lines, printed by rank 0 in rank order; ranks with the same lines
# share one entry ("ranks 0-7: ...").
print_ranked(comm, f"y layout {y.layout}, local {y.local.shape}", *trace_lines(trace), verdict)
sys.exit(0 if verdict.passed else 1)
