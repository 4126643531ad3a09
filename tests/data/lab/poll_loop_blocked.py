# Rank 0 polls a receive (or probe) from rank 1 with the call argv[1] names (Testall, test, improbe, ...); rank 1
# waits for a message rank 0 never sends. MPI: hangs. The emulator's report names the call the loop makes.
import sys

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
buf = np.empty(3)
if comm.rank == 0:
    reqs = [comm.Irecv(buf, source=1, tag=9)]
    polls = {"Testall": lambda: MPI.Request.Testall(reqs), "test": lambda: reqs[0].test()[0],
             "Get_status_all": lambda: MPI.Request.Get_status_all(reqs),
             "improbe": lambda: comm.improbe(source=1, tag=9) is not None,
             "Message.Iprobe": lambda: MPI.Message.Iprobe(comm, source=1, tag=9) is not None}
    while not polls[sys.argv[1]]():
        pass
elif comm.rank == 1:
    comm.Recv(buf, source=0, tag=5)
