"""MindSpore operator-parallel tutorial network, end to end on 8 ranks.

    x = flatten(images)                         # (32, 1, 28, 28) -> (32, 784)
    x = MatMul.shard(((2, 4), (4, 1)))(x, fc1)  # (784, 512)
    x = ReLU.shard(((4, 1),))(x)
    x = MatMul.shard(((1, 8), (8, 1)))(x, fc2)  # (512, 512)
    x = ReLU.shard(((8, 1),))(x)
    logits = MatMul()(x, fc3)                   # (512, 10), no strategy: data parallel

Run: timeout -k 5 120 mpiexec -n 8 python examples/net_mindspore_tutorial.py
(or `python examples/net_mindspore_tutorial.py --ranks 8`: simulated ranks, one process)
"""
import argparse
import sys

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim.runtime.sim import script
from spmdsim.errors import RankCountError
from spmdsim.layouts.holdings import rank_blocks
from spmdsim.models.nets import NetworkRunner, mindspore_tutorial
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
    raise RankCountError(f"the tutorial's strategies need 8 ranks, not {comm.size}", 8,
                         comm.size)

# Every operator has its own device matrix, derived from its strategy:
#   MatMul1 (2,4,1) axes (m,k,n): rank r = 4m + k holds x[16m:16m+16, 196k:196k+196]
#           and fc1[196k:196k+196, :] (ranks k and 4 + k hold the same fc1 block);
#   ReLU1   (4,1,2) axes (axis_0,axis_1,rep): rank r holds rows 8*(r//2) .. +8, all 512 columns
#           (neighbours r, r^1 repeat the same work: the "rep" axis MindSpore appends);
#   MatMul2 (1,8,1): rank r holds x[:, 64r:64r+64] and fc2[64r:64r+64, :];
#   ReLU2   (8,1) and MatMul3 (8,1,1): rank r holds rows 4r .. 4r+4; fc3 is whole everywhere.
# The images arrive data parallel (MindSpore's default dataset strategy): rank r holds
# images 4r .. 4r+4, made from the seed, never the whole batch.
net = mindspore_tutorial(comm.size, seed=0)
# Which block of the images and of each weight every rank holds, from the layouts alone.
# Each MatMul has its own device matrix, so the blocks are listed one tensor at a time.
held = [("images", net.input_layout, net.source.shape)] + [
    (f"fc{i}", stage.params[0].layout, stage.params[0].source.shape)
    for i, stage in enumerate((s for s in net.stages if s.kind == "matmul"), 1)]
runner = NetworkRunner(net, comm)
result = runner.forward()

# What the table shows, row by row, and why:
#  1 Flatten: a local reshape (only the batch dim is split).
#  2 -> MatMul1: rows 4r.. must become a (16 rows, 196 columns) block: Alltoall over the
#    4 ranks of "k" (each keeps 1/4 of the columns of its rows and sends the rest).
#  3 MatMul1: K = 784 is split in 4, each product is a partial sum: Allreduce over "k".
#  4 -> ReLU1: MatMul1 left 16 rows replicated over k; ReLU1 wants 8 rows: local slice.
#  6 -> MatMul2: rows split in 4 -> columns split in 8: an exchange in which every
#    rank receives exactly the part of its new block it lacks (Alltoallv).
#  7 MatMul2: K = 512 split in 8: Allreduce over all 8 ranks.
#  8 -> ReLU2: the sum is replicated, ReLU2 wants 4 rows: local slice.
# 10 -> MatMul3: same rows, other device matrix: nothing moves. 11: weights whole, no sum.
table = result.table()
verdicts = result.check_all()  # every hop's value against the numpy network, row by row
# The traced collectives of every hop must be exactly those its plan predicts.
ok = all(verdicts) and all(row.matches() for row in result.rows())
runner.close()
if comm.rank == 0:
    for r in range(comm.size):
        print(f"rank {r}: " + ", ".join(rank_blocks({name: (layout, shape)}, r)
                                        for name, layout, shape in held))
    print(table)
# Every rank's own lines, printed by rank 0 in rank order; ranks with the same lines
# share one entry ("ranks 0-7: ...").
print_ranked(comm, verdicts[-1], "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
