"""Megatron's sequence parallelism around the MLP: Allgather + Reduce_scatter instead of one Allreduce.

x [s, b, h] = (48, 2, 96) stays split on the sequence over the ranks outside
the MLP (each rank holds 48/p positions); inner width 480.
Run: timeout -k 5 120 mpiexec -n 8 python examples/mlp_sequence_parallel.py
(or `python examples/mlp_sequence_parallel.py --ranks 8`: simulated ranks, one process)
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
seq, batch, hidden, ffn = 48, 2, 96, 480
if seq % p or ffn % p:
    # Raised on every rank alike: the excepthook prints it once and exits 2.
    raise RankCountError(f"sequence {seq} and inner width {ffn} do not split over {p} ranks: run a number that "
                         f"divides both, such as 8", 8, p)

mesh = Mesh(Layout((p,), ("mp",)), comm)
xs = SeededTensor((seq, batch, hidden), "float32", seed=0)
x = DTensor.from_seeded(mesh, mesh.layout("mp", None, None), xs)  # split on the sequence

# fc1 needs every position: it Allgathers x along the sequence (Megatron's
# gather_from_sequence_parallel_region), then works as the plain column layer.
# fc2's product is a partial sum over the hidden units; instead of Allreducing
# the whole (48, 2, 96) result, a Reduce_scatter sums it and leaves each rank
# its own positions again. Same bytes per rank as the Allreduce, in two halves.
mlp = ParallelMLP(mesh, hidden, ffn, activation="gelu", sequence_parallel=True, seed=1)
with collect_trace() as trace:
    y = mlp(x)

expected = {"allgather": 1, "reduce_scatter": 1} if p > 1 else {}
# The tolerance follows the rounding the two float32 computations (this one and the reference's, summing
# in other orders) can have: the magnitudes that entered each output and the length of its sums.
rtol, scale = mlp.rounding(xs)
verdict = y.check(mlp.reference(xs), rtol=rtol, scale=scale)
if comm.rank == 0:
    # Which block of each tensor every rank holds, from the layouts alone (no communication).
    print(holdings({"x": x, "W1": mlp.linear_fc1.weight, "W2": mlp.linear_fc2.weight, "y": y}))
# Every rank's own lines, printed by rank 0 in rank order; ranks with the same lines
# share one entry ("ranks 0-7: ...").
print_ranked(comm, f"y layout {y.layout}, local {y.local.shape}", *trace_lines(trace), verdict)
sys.exit(0 if verdict.passed and trace.counts() == expected else 1)
