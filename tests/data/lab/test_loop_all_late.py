# Every rank but 0 polls (test, napping 10 ms) for a message from rank 0, which polls once, computes a while
# (argv[1] s, default 3) and sends; then sleeps as long and sends again. Never a deadlock: rank 0 computes or
# sleeps, outside MPI, while the others poll (under MPICH each poller spins a core meanwhile).
import sys
import time

from mpi4py import MPI

comm = MPI.COMM_WORLD
late = float(sys.argv[1]) if len(sys.argv) > 1 else 3


def polled(req):
    while True:
        done, got = req.test()
        if done:
            return got
        time.sleep(0.01)


if comm.rank == 0:
    back = comm.irecv(source=1, tag=2)
    back.test()
    end, n = time.time() + late, 0
    while time.time() < end:
        n += 1
    for r in range(1, comm.size):
        comm.send(10 * r, dest=r, tag=1)
    time.sleep(late)
    for r in range(1, comm.size):
        comm.send(10 * r + 1, dest=r, tag=1)
    print(f"rank 0 got {back.wait()}")
else:
    print(f"rank {comm.rank} got {polled(comm.irecv(source=0, tag=1))} {polled(comm.irecv(source=0, tag=1))}")
    if comm.rank == 1:
        comm.send("back", dest=0, tag=2)
