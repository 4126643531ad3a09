# Master and workers: tasks out by rank 0, results back from any rank (tag 7), then Waitany and Bsend.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
WORK, STOP = 1, 2
tasks = list(range(10))
if rank == 0:
    results = {}
    st = MPI.Status()
    active = 0
    for w in range(1, size):
        if tasks:
            comm.send(tasks.pop(0), dest=w, tag=WORK); active += 1
        else:
            comm.send(None, dest=w, tag=STOP)
    while active:
        res = comm.recv(source=MPI.ANY_SOURCE, tag=7, status=st)
        results[res[0]] = res[1]
        w = st.Get_source()
        if tasks:
            comm.send(tasks.pop(0), dest=w, tag=WORK)
        else:
            comm.send(None, dest=w, tag=STOP); active -= 1
    print("results", sorted(results.items()))
else:
    st = MPI.Status()
    done = 0
    while True:
        t = comm.recv(source=0, tag=MPI.ANY_TAG, status=st)
        if st.Get_tag() == STOP:
            break
        comm.send((t, t * t), dest=0, tag=7)
        done += 1
    reqs = [comm.Isend(np.array([done], dtype="i"), dest=0, tag=99)]
    MPI.Request.Waitall(reqs)
if rank == 0:
    counts = np.zeros(1, dtype="i"); total = 0
    reqs = [comm.Irecv(np.zeros(1, dtype="i"), source=w, tag=99) for w in range(1, size)]
    bufs = []
    for _ in range(size - 1):
        idx = MPI.Request.Waitany(reqs)
    print("workers reported", size - 1)
MPI.Attach_buffer(bytearray(1 << 16))
comm.Bsend(np.ones(4), dest=(rank + 1) % size, tag=5)
b = np.empty(4); comm.Recv(b, source=(rank - 1) % size, tag=5)
MPI.Detach_buffer()
print(rank, "bsend ok", b.sum())
