# Rank 1 sends with tag 4; rank 0 receives with tag 3.
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 1:
    comm.send({"x": 1}, dest=0, tag=4)
elif comm.rank == 0:
    data = comm.recv(source=1, tag=3)
comm.Barrier()
