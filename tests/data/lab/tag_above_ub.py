# Rank 0 sends with a tag past MPI.TAG_UB. MPI: an invalid-tag error (MPICH: "Invalid tag, value is 536870912",
# on both ranks), the job aborts.
from mpi4py import MPI

comm = MPI.COMM_WORLD
ub = comm.Get_attr(MPI.TAG_UB)
if comm.rank == 0:
    comm.send("hi", dest=1, tag=ub + 1)
elif comm.rank == 1:
    comm.recv(source=0, tag=ub + 1)
