# Rank 1 receives with tag -5. MPI: an invalid-tag error (MPI_ERR_TAG), the job aborts.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 0:
    comm.Send(np.ones(3), dest=1, tag=5)
elif comm.rank == 1:
    comm.Recv(np.empty(3), source=0, tag=-5)
