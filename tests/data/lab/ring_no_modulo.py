# A ring without the modulo: the last rank sends to rank 4 of 4 (rank 0 receives from -1, MPI.PROC_NULL).
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.send(comm.rank, dest=comm.rank + 1)
print(comm.recv(source=comm.rank - 1))
