import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
right, left = (rank + 1) % size, (rank - 1) % size
sendbuf = np.full(10, rank, dtype="i")
recvbuf = np.empty(10, dtype="i")
if rank % 2 == 0:
    comm.Send([sendbuf, MPI.INT], dest=right, tag=0)
    comm.Recv([recvbuf, MPI.INT], source=left, tag=0)
else:
    comm.Recv([recvbuf, MPI.INT], source=left, tag=0)
    comm.Send([sendbuf, MPI.INT], dest=right, tag=0)
print(f"rank {rank}: received {recvbuf[0]} x{len(recvbuf)} sum={recvbuf.sum()}")
