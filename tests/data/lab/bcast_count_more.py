# Rank 0 broadcasts 4 doubles; the others expect 5. MPICH: Other MPI error (message sizes do not match) on a receiver.
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
buf = np.arange(4.0) if comm.rank == 0 else np.zeros(5)
comm.Bcast(buf, root=0)
print(comm.rank, buf, flush=True)
