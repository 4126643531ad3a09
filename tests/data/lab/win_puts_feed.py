# Rank 1 puts 0 into rank 0's window again and again for 3 s (or the seconds given), then 1; rank 0 polls its
# window (Sync) until it sees the 1, while ranks 2 and 3 wait in a barrier. MPI: prints rank 0's line.
import sys
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
mem = np.zeros(1)
win = MPI.Win.Create(mem, comm=comm)
win.Lock_all()
if comm.rank == 0:
    while mem[0] == 0:
        win.Flush(0)
        win.Sync()
    print(f"rank 0 saw {mem[0]}")
elif comm.rank == 1:
    end = time.monotonic() + (float(sys.argv[1]) if len(sys.argv) > 1 else 3)
    while time.monotonic() < end:
        win.Put(np.zeros(1), 0)
        win.Flush(0)
    win.Put(np.ones(1), 0)
    win.Flush(0)
win.Unlock_all()
comm.Barrier()
win.Free()
