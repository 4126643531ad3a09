import time
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
right, left = (rank + 1) % size, (rank - 1) % size
sb = np.full(100000, rank, dtype="d")
rb = np.empty(100000, dtype="d")
reqs = [comm.Irecv(rb, source=left, tag=1), comm.Isend(sb, dest=right, tag=1)]
MPI.Request.Waitall(reqs)
print(f"rank {rank}: Waitall got {rb[0]}")
r = comm.irecv(source=left, tag=2)
s = comm.isend(rank * 100, dest=right, tag=2)
polls = 0
while True:
    done, val = r.test()
    if done:
        break
    polls += 1
    time.sleep(0.001)
s.wait()
print(f"rank {rank}: test loop got {val}")
req = comm.Isend(sb[:10], dest=right, tag=3)
buf = np.empty(10)
rr = comm.Irecv(buf, source=left, tag=3)
while not rr.Test():
    pass
req.Wait()
print(f"rank {rank}: Test loop got {buf[0]}")
