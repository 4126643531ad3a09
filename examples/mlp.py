"""The fused tensor-parallel MLP: ColumnParallelLinear -> GELU -> RowParallelLinear, one Allreduce.

x (24, 96), inner width 480. Run: timeout -k 5 120 mpiexec -n 8 python examples/mlp.py
(or `python examples/mlp.py --ranks 8`: simulated ranks, one process)
"""
import argparse
import sys

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim.runtime.sim import script
from spmdsim import Layout, SeededTensor
from spmdsim.layouts.holdings import holdings
from spmdsim.nn.ops import ParallelMLP
from spmdsim.errors import RankCountError
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
hidden, ffn = 96, 480
if ffn % p:
    # Raised on every rank alike: the excepthook prints it once and exits 2.
    raise RankCountError(f"the inner width {ffn} does not split over {p} ranks: run a number that divides it, "
                         f"such as 8", 8, p)

mesh = Mesh(Layout((p,), ("mp",)), comm)
xs = SeededTensor((24, hidden), "float32", seed=0)
x = DTensor.from_seeded(mesh, mesh.layout(None, None), xs)  # replicated input

# fc1 (96 -> 480) is column-parallel: rank r holds W1[:, 60r : 60(r+1)] and
# computes its 60 hidden units for every row, with no communication.
# GELU acts on each hidden unit alone, so it runs on the split hidden dim.
# fc2 (480 -> 96) is row-parallel: rank r holds W2[60r : 60(r+1), :], exactly the
# rows matching its hidden units, so its input is already in place (no Allgather).
# Its (24, 96) product is a partial sum over the hidden units: one Allreduce,
# then fc2's bias once. The trace proves there is nothing else.
mlp = ParallelMLP(mesh, hidden, ffn, activation="gelu", seed=1)
with collect_trace() as trace:
    y = mlp(x)

expected = {"allreduce": 1} if p > 1 else {}  # one rank holds the whole product: nothing to sum
# The tolerance follows the rounding the two float32 computations (this one and the reference's, summing
# in other orders) can have: the magnitudes that entered each output and the length of its sums.
rtol, scale = mlp.rounding(xs)
verdict = y.check(mlp.reference(xs), rtol=rtol, scale=scale)
ok = verdict.passed and trace.counts() == expected
if comm.rank == 0:
    # Which block of each tensor every rank holds, from the layouts alone (no communication).
    print(holdings({"x": x, "W1": mlp.linear_fc1.weight, "W2": mlp.linear_fc2.weight, "y": y}))
# Every rank's own lines, printed by rank 0 in rank order; ranks with the same lines
# share one entry ("ranks 0-7: ...").
print_ranked(comm, f"y layout {y.layout}, local {y.local.shape}", *trace_lines(trace), verdict,
             "PASS" if ok else f"FAIL: collectives {trace.counts()}, expected {expected}")
sys.exit(0 if ok else 1)
