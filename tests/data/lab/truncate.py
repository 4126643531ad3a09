# Rank 1's receive buffer holds 5 doubles; rank 0 sends 10.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 0:
    comm.Send(np.arange(10, dtype="d"), dest=1, tag=0)
elif comm.rank == 1:
    buf = np.empty(5, dtype="d")
    comm.Recv(buf, source=0, tag=0)
comm.Barrier()
