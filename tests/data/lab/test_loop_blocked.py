# Rank 0 polls with Test for tag 9 from rank 1; the others wait for a message from rank 0 it never sends. MPI: hangs.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
buf = np.empty(3)
if comm.rank == 0:
    req = comm.Irecv(buf, source=1, tag=9)
    while not req.Test():
        pass
else:
    comm.Recv(buf, source=0, tag=5)
