# Rank 0 polls for rank 1's answer while sending it a task every 0.5 s (or the seconds given); rank 1 answers after
# 5 tasks (2.5 s).
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 0:
    req = comm.irecv(source=1, tag=7)
    period = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
    last, sent = time.time(), 0
    while True:
        done, result = req.test()
        if done:
            break
        if time.time() - last > period and sent < 5:
            comm.send(sent, dest=1, tag=1)
            sent, last = sent + 1, time.time()
    print(f"rank 0: result {result} after {sent} tasks")
elif comm.rank == 1:
    comm.send(sum(comm.recv(source=0, tag=1) for _ in range(5)), dest=0, tag=7)
