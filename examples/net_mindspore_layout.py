"""MindSpore advanced operator parallel: the tutorial network with Layout tuples.

    layout = Layout((2, 2, 2), ("dp", "sp", "mp")); layout2 = Layout((8,), ("tp",))
    matmul1.shard((layout("mp", ("sp", "dp")), layout(("sp", "dp"), "None")))
    matmul2.shard((layout2("None", "tp"), layout2("tp", "None")))
    (flatten, ReLU.shard(((4,1),)), ReLU.shard(((8,1),)) and MatMul3 as in the tutorial)

Run: timeout -k 5 120 mpiexec -n 8 python examples/net_mindspore_layout.py
(or `python examples/net_mindspore_layout.py --ranks 8`: simulated ranks, one process)
"""
import argparse
import sys

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim.runtime.sim import script
from spmdsim.errors import RankCountError
from spmdsim.models.nets import NetworkRunner, mindspore_layout
from spmdsim import install_excepthook
from spmdsim.runtime.ranked import print_ranked

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
if comm.size != 8:
    # Raised on every rank alike: the excepthook prints it once, with how to get 8 ranks as this run was
    # launched (--ranks, spmdsim mpirun or mpiexec), and exits 2.
    raise RankCountError(f"Layout((2,2,2)) and Layout((8,)) need 8 ranks, not {comm.size}", 8,
                         comm.size)

net = mindspore_layout(comm.size, seed=0)
runner = NetworkRunner(net, comm)
result = runner.forward()

# Who holds what at MatMul1 (rank = 4 dp + 2 sp + mp; ("sp", "dp") = sp major):
# x rows over "mp" (2 blocks of 16), x columns and fc1 rows over ("sp", "dp") (4 blocks
# of 196, block 2 sp + dp). Device (dp, sp, mp) = (0, 1, 0), rank 2, holds x[0:16, 392:588]
# and fc1[392:588, :]. MatMul2: rank r holds x[:, 64r:64r+64] and fc2[64r:64r+64, :].
stage = net.stages[1]
x_block = ", ".join(f"{a}:{b}" for a, b in stage.x.bounds(comm.rank, (32, 784)))
lines = comm.gather(f"rank {comm.rank} (dp,sp,mp)={stage.x.layout.coords(comm.rank)}: "
                    f"MatMul1 x[{x_block}]", root=0)

# Why each row of the table communicates:
#  2 -> MatMul1: the images came data parallel (4 rows each); MatMul1 wants a (16, 196)
#    block: an exchange (Alltoallv) in which each rank receives only what it lacks.
#  3 MatMul1: K = 784 split over ("sp", "dp"): partial sums, Allreduce over the 4 ranks
#    sharing mp; the result is split on rows over "mp" (rank r holds rows 16 (r % 2)..).
#  4 -> ReLU1: ReLU1 wants rows 8 (r // 2)..: most of them live on another rank (exchange).
#  6 -> MatMul2: rows split in 4 -> columns split in 8 over "tp" (exchange).
#  7 MatMul2: K = 512 split over "tp": Allreduce over all 8 ranks.
#  8 -> ReLU2 and 10 -> MatMul3: the value is whole / already in place: local slice, nothing.
table = result.table()
verdicts = result.check_all()  # every hop's value against the numpy network, row by row
ok = all(verdicts) and all(row.matches() for row in result.rows())
runner.close()
if comm.rank == 0:
    print("\n".join(lines))
    print(table)
# Every rank's own lines, printed by rank 0 in rank order; ranks with the same lines
# share one entry ("ranks 0-7: ...").
print_ranked(comm, verdicts[-1], "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
