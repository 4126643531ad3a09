# Rank 1 sends 3 bytes; rank 0 receives them into an array of 2 doubles.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 1:
    comm.Send(np.arange(3, dtype=np.uint8), dest=0, tag=7)
elif comm.rank == 0:
    data = np.empty(2)
    comm.Recv(data, source=1, tag=7)
    print(data)
