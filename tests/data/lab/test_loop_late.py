# Rank 0 polls with Testany and Iprobe for rank 1's answers, which rank 1 sends after 3 s of work (or the seconds
# given). MPI: prints them.
import sys
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 0:
    a, b = np.zeros(2), np.zeros(2)
    reqs = [comm.Irecv(a, source=1, tag=1), comm.Irecv(b, source=1, tag=2)]
    while not MPI.Request.Testany(reqs)[1]:
        pass
    while not comm.Iprobe(source=1, tag=3):
        pass
    MPI.Request.Waitall(reqs)
    print(f"rank 0 got {a.sum()} {b.sum()} {comm.recv(source=1, tag=3)}")
elif comm.rank == 1:
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 3)
    comm.Send(np.ones(2), dest=0, tag=1)
    comm.Send(np.ones(2), dest=0, tag=2)
    comm.send("done", dest=0, tag=3)
