# Rank 0 opens an exposure epoch to rank 1 (Post) and polls Win.Test for its end; rank 1 never opens the access
# epoch (Start, Complete): it waits for a message rank 0 never sends (or, with "finished", ends). MPI: hangs.
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
win = MPI.Win.Create(np.zeros(4), comm=comm)
if comm.rank == 0:
    win.Post(comm.group.Incl([1]))
    while not win.Test():
        pass
elif comm.rank == 1 and sys.argv[1:] != ["finished"]:
    comm.Recv(np.empty(1), source=0, tag=5)
