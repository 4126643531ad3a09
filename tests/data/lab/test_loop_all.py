# Every rank polls (Test, napping 10 ms) for a message from the next rank, which nobody sends. MPI: every rank
# spins forever.
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
req = comm.irecv(source=(comm.rank + 1) % comm.size, tag=3)
while not req.Test():
    time.sleep(0.01)
