# Rank 0 polls for a flag rank 1 never sets, while the others wait for a message rank 0 never sends: with Sync
# on its own window ("Sync") or by reading rank 1's with Lock, Get and Unlock ("Get"). MPI: hangs.
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
mem = np.zeros(1)
win = MPI.Win.Create(mem, comm=comm)
flag = np.zeros(1)
if comm.rank == 0 and sys.argv[1] == "Sync":
    win.Lock_all()
    while mem[0] == 0:
        win.Sync()
elif comm.rank == 0:
    while flag[0] == 0:
        win.Lock(1, MPI.LOCK_SHARED)
        win.Get(flag, 1)
        win.Unlock(1)
else:
    comm.Recv(np.empty(1), source=0, tag=5)
