"""Paddle ``distributed.split(x, size, operation="embedding", num_partitions)``.

ids (10, 4) in [0, 960) into a (960, 48) table, vocab-parallel over all ranks.
Run: timeout -k 5 120 mpiexec -n 8 python examples/embedding_vocab.py
(or `python examples/embedding_vocab.py --ranks 8`: simulated ranks, one process) (any rank count dividing 960)
"""
import argparse
import sys

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim.runtime.sim import script
from spmdsim import SeededTensor
from spmdsim.layouts.holdings import holdings
from spmdsim.nn.ops import paddle_mesh, split
from spmdsim.references.forward import embedding_region
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
vocab, dim = 960, 48
if vocab % p:
    # Raised on every rank alike: the excepthook prints it once and exits 2.
    raise RankCountError(f"the vocabulary {vocab} does not split over {p} ranks: run a number that divides it, "
                         f"such as 8", 8, p)

# A 1-D mesh ("mp",) over every rank: Paddle's model-parallel group.
mesh = paddle_mesh(p)
ids_src = SeededTensor((10, 4), "int64", seed=0, low=0, high=vocab)
table = SeededTensor((vocab, dim), "float32", seed=1)

# The ids are replicated: every rank sees all 40 ids.
ids = DTensor.from_seeded(mesh, mesh.layout(None, None), ids_src)

# Rank r holds table rows [r*N/p, (r+1)*N/p) plus one zero padding row (its
# local row N/p). An id it owns becomes id - r*N/p; any other id becomes N/p and
# looks up zeros. So each rank's (10, 4, 48) lookup holds the rows it owns and
# zeros elsewhere: a partial sum, which one Allreduce over all ranks completes.
with collect_trace() as trace:
    out = split(ids, (vocab, dim), operation="embedding", num_partitions=p, weight_attr=table)

# Ids outside [0, 960) would raise the same error on every rank before the
# Allreduce, since every rank checks the same ids.
verdict = out.check(embedding_region(ids_src, table))
if comm.rank == 0:
    # Which block of each tensor every rank holds, from the layouts alone (no communication).
    print(holdings({"ids": ids, "table": (mesh.layout("mp", None), (vocab, dim)), "out": out}))
# Every rank's own lines, printed by rank 0 in rank order; ranks with the same lines
# share one entry ("ranks 0-7: ...").
print_ranked(comm, f"out layout {out.layout}, local {out.local.shape}", *trace_lines(trace), verdict)
sys.exit(0 if verdict.passed else 1)
