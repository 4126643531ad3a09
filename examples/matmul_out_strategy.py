"""MindSpore MatMul ((2, 4), (4, 1)) with ``out_strategy ((8, 1),)``: Reduce_scatter, not Allreduce.

x (32, 784) @ w (784, 512). Run: timeout -k 5 120 mpiexec -n 8 python examples/matmul_out_strategy.py
(or `python examples/matmul_out_strategy.py --ranks 8`: simulated ranks, one process)
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
from spmdsim.programs.infer import out_layout_from_strategy
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

# Same inputs as examples/matmul_2x4_4x1.py: device matrix (m, k, n) = (2, 4, 1);
# each rank's (16, 512) product is a partial sum over the 4 ranks of its "k" group.
m = matmul_layouts("((2,4),(4,1))", 8)
mesh = Mesh(m.layout, comm)  # 8 ranks: on another count it says how to get 8, and exits 2
xs = SeededTensor((32, 784), "float32", seed=0)
ws = SeededTensor((784, 512), "float32", seed=1)
x = DTensor.from_seeded(mesh, m.x, xs)
w = DTensor.from_seeded(mesh, m.w, ws)

# out_strategy (8, 1) asks for the rows cut 8 ways: the 2 "m" pieces, each cut
# again over "k". Reduce_scatter over "k" adds the partial sums and leaves each
# rank only its 4 rows: output layout (("m", "k"), "n"), half the bytes of Allreduce.
out_layout = out_layout_from_strategy(m.out, (8, 1))
with collect_trace() as trace:
    y = matmul(x, w, out_layout=out_layout)

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
