# Rank 0 broadcasts 4 doubles; the others receive into 3. MPICH: Message truncated (MPI_ERR_TRUNCATE) on a receiver.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
buf = np.arange(4.0) if comm.rank == 0 else np.empty(3)
comm.Bcast(buf, root=0)
print(comm.rank, buf)
