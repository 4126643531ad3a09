# Rank 1 leaves with os._exit(3) before a barrier the others wait in (MPICH kills the others: exit 9).
import os

from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 1:
    os._exit(3)
comm.Barrier()
print(f"rank {comm.rank} passed the barrier")
