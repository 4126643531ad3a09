# Rank 0 sends a small message rank 1 never receives: MPI completes the send and drops it at exit.
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.rank
if rank == 0:
    comm.send("hello", dest=1, tag=3)   # rank 1 never receives
print(f"rank {rank} done")
