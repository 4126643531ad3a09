"""Paddle tensor parallelism (Paddle's distributed.split): Embedding -> column Linear -> row Linear on every rank.

    h = paddle.distributed.split(ids, (960, 64), "embedding", num_partitions=p)
    h = paddle.distributed.split(h, (64, 240), "linear", axis=1, num_partitions=p,
                                 gather_out=False)
    y = paddle.distributed.split(h, (240, 64), "linear", axis=0, num_partitions=p)

Adapts to the world size p (1, 2, 4, 8, ...: 960 and 240 must split over p).
Run: timeout -k 5 120 mpiexec -n 8 python examples/net_paddle_tp.py
(or `python examples/net_paddle_tp.py --ranks 8`: simulated ranks, one process)
"""
import argparse
import sys

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim.runtime.sim import script
from spmdsim.layouts.holdings import holdings
from spmdsim.models.nets import NetworkRunner, paddle_needs, paddle_tp
from spmdsim.errors import RankCountError
from spmdsim import install_excepthook
from spmdsim.runtime.ranked import print_ranked

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
reason = paddle_needs(p)
if reason:
    # Raised on every rank alike: the excepthook prints it once and exits 2.
    raise RankCountError(f"{reason}: run a number that divides both, such as 8", 8, p)

# Every rank holds the ids (4, 16) whole (they are tiny; Paddle feeds each mp rank alike).
# Embedding: rank r holds table rows [960r/p, 960(r+1)/p) plus one zero padding row; ids
#   outside its range look up the zero row, so each lookup is a partial sum -> Allreduce.
# ColumnLinear: rank r holds W1[:, 240r/p : 240(r+1)/p] and that slice of the bias; its
#   output columns are final and stay split (gather_out=False: no Allgather).
# RowLinear: rank r holds W2[240r/p : 240(r+1)/p, :], exactly the rows matching the
#   columns it already has, so no redistribution is needed; its product is a partial
#   sum -> Allreduce, then the bias once. Two Allreduces in all, nothing else.
net = paddle_tp(p, seed=0)
# Which block of the ids and of each weight every rank holds, from the layouts alone
# (all on the one ("mp",) mesh); the table's zero padding row is no block of the global table.
(emb_w,), (w1, b1), (w2, b2) = (stage.params for stage in net.stages)
held = {"ids": (net.input_layout, net.source.shape),
        "table": (emb_w.layout, emb_w.source.shape, "+ zero padding row")}
held.update((name, (param.layout, param.source.shape))
            for name, param in (("W1", w1), ("b1", b1), ("W2", w2), ("b2", b2)))
runner = NetworkRunner(net, comm)
result = runner.forward()
table = result.table()
verdicts = result.check_all()  # every hop's value against the numpy network, token by token
rows = result.rows()
counts = [n for row in rows for _, n in row.calls]
ok = all(verdicts) and all(row.matches() for row in rows) and counts == ([1, 1] if p > 1 else [])
runner.close()
if comm.rank == 0:
    # Two blocks of lines (the lookup, then the MLP's weights), each within 100 columns.
    print(holdings({name: held[name] for name in ("ids", "table")}))
    print(holdings({name: held[name] for name in ("W1", "b1", "W2", "b2")}))
    print(table)
# Every rank's own lines, printed by rank 0 in rank order; ranks with the same lines
# share one entry ("ranks 0-7: ...").
print_ranked(comm, verdicts[-1], "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
