# Rank 1 reads its Irecv buffer before Wait. MPI forbids it: the message may land in the buffer at any time
# until the receive completes. On one node MPICH has often copied it by then (here during the barrier), so
# the program seems right; a cluster's receive of a large message may land it only inside Wait.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.rank
if rank == 0:
    comm.Send(np.full(4, 7.0), dest=1, tag=3)
elif rank == 1:
    buf = np.zeros(4)
    req = comm.Irecv(buf, source=0, tag=3)
    comm.Barrier()
    print(f"rank 1 before Wait: {buf[0]}")   # wrong: the receive has not completed
    req.Wait()
    print(f"rank 1 after Wait: {buf[0]}")
if rank != 1:
    comm.Barrier()
