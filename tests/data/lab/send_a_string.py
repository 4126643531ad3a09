# Rank 0 Sends a str (not a buffer) to rank 1. mpi4py: TypeError: message: expecting buffer or list/tuple.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 0:
    comm.Send("hello", dest=1)
elif comm.rank == 1:
    buf = np.empty(5, dtype="S1")
    comm.Recv(buf, source=0)
