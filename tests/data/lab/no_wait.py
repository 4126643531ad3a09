# Rank 0 posts an Isend and rank 1 an Irecv, and neither ever waits: MPI requires every request to be
# completed (Wait, Test) or freed; the message may never reach rank 1's buffer.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.rank
buf = np.zeros(4)
if rank == 0:
    comm.Isend(np.full(4, 7.0), dest=1, tag=3)   # no Wait
elif rank == 1:
    comm.Irecv(buf, source=0, tag=3)   # no Wait
comm.Barrier()
print(f"rank {rank} got {buf[0]}")
