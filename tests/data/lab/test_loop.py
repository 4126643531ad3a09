# Rank 0 polls with Test for a message with tag 9; rank 1 sent tag 8 and finished. MPI: rank 0 spins forever.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 0:
    buf = np.empty(3)
    req = comm.Irecv(buf, source=1, tag=9)
    while not req.Test():
        pass
elif comm.rank == 1:
    comm.Send(np.ones(3), dest=0, tag=8)
