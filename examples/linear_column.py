"""Column-parallel Linear: Megatron ColumnParallelLinear(gather_output=True) / Paddle axis=1.

x (24, 200) @ W (200, 240) + b. Run: timeout -k 5 120 mpiexec -n 8 python examples/linear_column.py
(or `python examples/linear_column.py --ranks 8`: simulated ranks, one process)
"""
import argparse
import sys

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim.runtime.sim import script
from spmdsim import Layout, SeededTensor
from spmdsim.layouts.holdings import holdings
from spmdsim.nn.ops import ColumnParallelLinear
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
k, n = 200, 240
if n % p:
    # Raised on every rank alike: the excepthook prints it once and exits 2.
    raise RankCountError(f"out_features {n} does not split over {p} ranks: run a number that divides it, such as 8",
                         8, p)

mesh = Mesh(Layout((p,), ("mp",)), comm)
xs = SeededTensor((24, k), "float32", seed=0)

# Every rank holds all of x (replicated). The layer makes only rank r's weight
# columns W[:, r*n/p : (r+1)*n/p] and bias b[r*n/p : (r+1)*n/p] from its seeds.
x = DTensor.from_seeded(mesh, mesh.layout(None, None), xs)
layer = ColumnParallelLinear(mesh, k, n, bias=True, gather_output=True, seed=1)

# Each rank computes whole dot products for its n/p output columns (K is not
# split), so no reduction is needed. gather_output=True asks every rank for the
# full (24, 240) rows: one Allgather over all ranks concatenates the columns.
# With gather_output=False the output would stay split and nothing would move.
with collect_trace() as trace:
    y = layer(x)

verdict = y.check(layer.reference(xs))
if comm.rank == 0:
    # Which block of each tensor every rank holds, from the layouts alone (no communication).
    print(holdings({"x": x, "W": layer.weight, "b": layer.bias, "y": y}))
# Every rank's own lines, printed by rank 0 in rank order; ranks with the same lines
# share one entry ("ranks 0-7: ...").
print_ranked(comm, f"weight local {layer.weight.local.shape}, y layout {y.layout}, local {y.local.shape}",
             *trace_lines(trace), verdict)
sys.exit(0 if verdict.passed else 1)
