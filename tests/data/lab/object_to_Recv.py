# Rank 1 sends a list with the lowercase send (a pickle); rank 0 receives it with Recv into an int array.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 1:
    comm.send([1, 2, 3], dest=0, tag=7)
elif comm.rank == 0:
    data = np.empty(3, dtype=np.int64)
    comm.Recv(data, source=1, tag=7)
    print(data)
