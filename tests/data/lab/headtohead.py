# Both ranks Send first, then Recv: fine for small messages (MPI buffers them), a deadlock for large ones.
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.rank
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
if rank < 2:
    other = 1 - rank
    out, into = np.full(n, rank, dtype="d"), np.empty(n, dtype="d")
    comm.Send(out, dest=other, tag=5)
    comm.Recv(into, source=other, tag=5)
    print(f"rank {rank} got {into[0]} x{n}")
comm.Barrier()
