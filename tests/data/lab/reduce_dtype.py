# The root receives float64 into which the ranks send int32: mpi4py refuses (ValueError).
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.rank
x = np.array([rank], dtype="i")          # ints
total = np.zeros(1)                      # float64 receive buffer
comm.Reduce(x, total, op=MPI.SUM, root=0)
print(rank, total)
