# Every rank reads its Iallreduce result before Wait. MPI forbids it: the receive buffer is undefined until the
# request completes. After a barrier MPICH on one node may have the sum there already, so the program seems
# right; with a large message, or on a cluster, it may not.
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.rank
n = int(sys.argv[1]) if len(sys.argv) > 1 else 1
total = np.zeros(n)
req = comm.Iallreduce(np.full(n, rank + 1.0), total)
comm.Barrier()
print(f"rank {rank} before Wait: {total[-1]}")   # wrong: the request has not completed
req.Wait()
print(f"rank {rank} after Wait: {total[-1]}")
