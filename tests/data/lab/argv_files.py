import os
import sys
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.rank
path = sys.argv[1]
with open(path) as f:
    lines = f.read().splitlines()
mine = [int(x) for x in lines[rank].split()]
print(f"rank {rank}: argv0={os.path.basename(sys.argv[0])} args={sys.argv[1:]} line={mine} sum={comm.allreduce(sum(mine))}")
if rank == 0:
    with open("out_rank0.txt", "w") as f:
        f.write("ok\n")
