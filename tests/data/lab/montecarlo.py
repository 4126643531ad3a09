# Monte Carlo pi: every rank seeds its own generators with its rank, then draws (after a barrier, so that
# the ranks seed before any draws).
import random

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
np.random.seed(rank)
random.seed(rank)
comm.Barrier()
n = 100000
xy = np.random.random((n, 2))
hits = int(np.sum(np.sum(xy * xy, axis=1) <= 1.0))
coin = sum(random.random() < 0.5 for _ in range(1000))
total = comm.reduce(hits, op=MPI.SUM, root=0)
print(f"rank {rank}: hits {hits} coin {coin} randint {np.random.randint(100)} {random.randint(0, 99)}")
if rank == 0:
    print(f"pi ~ {4.0 * total / (n * size):.6f}")
