import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
n = 1_000_000
h = 1.0 / n
i = np.arange(rank, n, size)
x = h * (i + 0.5)
local = np.array(np.sum(4.0 / (1.0 + x * x)) * h)
pi = np.array(0.0)
comm.Reduce(local, pi, op=MPI.SUM, root=0)
if rank == 0:
    print(f"pi ~ {pi:.12f}, error {abs(pi - np.pi):.2e}")
