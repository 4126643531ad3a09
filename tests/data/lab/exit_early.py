# Rank 1 leaves with sys.exit(3) before a barrier the others wait in.
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 1:
    sys.exit(3)
comm.Barrier()
print(f"rank {comm.rank} passed the barrier")
