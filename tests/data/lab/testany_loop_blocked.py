# Rank 0 polls two receives from rank 1 with Testany; rank 1 waits for a message rank 0 never sends. MPI: hangs.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
a, b = np.empty(3), np.empty(3)
if comm.rank == 0:
    reqs = [comm.Irecv(a, source=1, tag=9), comm.Irecv(b, source=1, tag=10)]
    while not MPI.Request.Testany(reqs)[1]:
        pass
elif comm.rank == 1:
    comm.Recv(a, source=0, tag=5)
