# Rank 0 polls with Iprobe for tag 9 from rank 1, which waits for a message rank 0 never sends. MPI: hangs.
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 0:
    while not comm.Iprobe(source=1, tag=9):
        pass
elif comm.rank == 1:
    comm.recv(source=0, tag=5)
