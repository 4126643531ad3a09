# Rank 0 receives from any rank once too often (size, not size - 1, messages).
from mpi4py import MPI
comm = MPI.COMM_WORLD
if comm.rank == 0:
    for i in range(comm.size):      # off by one: size - 1 senders
        print(comm.recv(source=MPI.ANY_SOURCE))
else:
    comm.send(comm.rank, dest=0)
