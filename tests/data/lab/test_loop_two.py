# Rank 0 polls with Test for tag 9 from rank 1, which waits (not finished) for a message rank 0 never sends. MPI: hangs.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 0:
    buf = np.empty(3); req = comm.Irecv(buf, source=1, tag=9)
    while not req.Test():
        pass
elif comm.rank == 1:
    buf = np.empty(3); comm.Recv(buf, source=0, tag=5)
