# Rank 0 waits for a message rank 1 never sends.
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 0:
    data = comm.recv(source=1, tag=3)
print(f"rank {comm.rank} done")
