# Rank 0 sends with a string tag. mpi4py: TypeError before anything is sent.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 0:
    comm.Send(np.ones(3), dest=1, tag="x")
elif comm.rank == 1:
    comm.Recv(np.empty(3), source=0, tag=0)
