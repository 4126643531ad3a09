# A root, rank or tag as mpi4py takes it: a float truncated (root=size / 2), a numpy number, a bool; a str or
# None a TypeError, a value past a C int an OverflowError.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size


def tried(call):
    try:
        return call()
    except (TypeError, OverflowError) as e:
        return type(e).__name__


for root in (size / 2, size - 0.5, np.int64(1), np.float64(2.0), True, -0.5, "0", None, 2**40):
    got = tried(lambda: comm.bcast(rank, root=root))
    buf = np.full(1, rank)
    tried(lambda: comm.Bcast(buf, root=root))
    print(f"rank {rank}: root {root!r} bcast {got} Bcast {buf.tolist()}")
peer = rank ^ 1
for dest, source, tag in ((peer + 0.5, np.float64(peer), 3.9), (np.int32(peer), np.int64(peer), True)):
    r = comm.isend(rank, dest=dest, tag=tag)
    print(f"rank {rank}: got {comm.recv(source=source, tag=tag)} dest {dest!r} source {source!r} tag {tag!r}")
    r.wait()
for bad in ("1", None, 2**40):  # (None is no wildcard: MPI.ANY_SOURCE and MPI.ANY_TAG are)
    print(f"rank {rank}: {bad!r}: send dest {tried(lambda: comm.send(0, dest=bad))}, send tag "
          f"{tried(lambda: comm.send(0, dest=peer, tag=bad))}, recv source {tried(lambda: comm.recv(source=bad))} "
          f"tag {tried(lambda: comm.recv(tag=bad))}, Recv source {tried(lambda: comm.Recv(buf, source=bad))} "
          f"tag {tried(lambda: comm.Recv(buf, tag=bad))}, probe source {tried(lambda: comm.probe(source=bad))} "
          f"Iprobe tag {tried(lambda: comm.Iprobe(tag=bad))}, Sendrecv source "
          f"{tried(lambda: comm.Sendrecv(buf, dest=peer, recvbuf=buf, source=bad))}")
