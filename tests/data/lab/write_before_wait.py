# Rank 0 writes into its Isend's buffer before Wait. MPI forbids it: the send buffer must not be modified until
# the send completes. A small message is copied as it is sent (MPICH's eager protocol), so rank 1 gets 7.0 and
# the program seems right; a large one (`write_before_wait.py 100000`) is read from the buffer later, and rank 1
# gets -1.0.
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
if comm.rank == 0:
    buf = np.full(n, 7.0)
    req = comm.Isend(buf, dest=1, tag=3)
    buf[:] = -1.0   # wrong: the send has not completed
    comm.Barrier()
    req.Wait()
else:
    comm.Barrier()
    if comm.rank == 1:
        got = np.zeros(n)
        comm.Recv(got, source=0, tag=3)
        print(f"rank 1 got {got[0]}")
