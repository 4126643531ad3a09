# Rank 1 sends an array with Send; rank 0 receives it with the lowercase recv (objects).
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 1:
    comm.Send(np.arange(3, dtype="i"), dest=0, tag=7)
elif comm.rank == 0:
    data = comm.recv(source=1, tag=7)
