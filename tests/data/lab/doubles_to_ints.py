# Rank 1 sends 3 doubles with Send; rank 0 receives them with Recv into an int64 array.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 1:
    comm.Send(np.arange(3.0), dest=0, tag=7)
elif comm.rank == 0:
    data = np.empty(3, dtype=np.int64)
    comm.Recv(data, source=1, tag=7)
    print(data)
