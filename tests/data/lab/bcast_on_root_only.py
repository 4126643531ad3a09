# The root alone calls bcast (inside the if): the others never reach it.
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 0:
    params = comm.bcast({"n": 10}, root=0)
else:
    params = None
total = comm.allreduce(1)
print(comm.rank, params, total)
