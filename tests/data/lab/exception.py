# One rank raises; the others wait for it in a barrier.
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 2:
    raise ValueError("bad input on rank 2")
comm.Barrier()
