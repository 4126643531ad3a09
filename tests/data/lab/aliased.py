# Send and receive buffers that share memory: MPICH refuses them (MPI.Exception "Invalid buffer pointer ...
# Buffers must not be aliased", MPI.ERR_BUFFER) where MPI.IN_PLACE is meant; a non-root's receive buffer of Reduce
# and empty messages are not checked (nor Sendrecv's: MPICH's result then depends on the timing, so not tried).
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
one = MPI.COMM_SELF  # the root's checks, with no other rank to leave waiting


def tried(name, call, a):
    try:
        call()
        print(rank, name, "ran", a.tolist())
    except MPI.Exception as e:
        print(rank, name, "MPI.Exception", e.Get_error_class() == MPI.ERR_BUFFER)


a = np.full(2 * size, rank + 1.0)
tried("Allreduce", lambda: comm.Allreduce(a, a, op=MPI.SUM), a)
tried("Allreduce view", lambda: comm.Allreduce(a, a.reshape(size, 2), op=MPI.SUM), a)
tried("Allreduce count 0", lambda: comm.Allreduce([a, 0, MPI.DOUBLE], [a, 0, MPI.DOUBLE], op=MPI.SUM), a)
tried("Iallreduce", lambda: comm.Iallreduce(a, a, op=MPI.SUM).Wait(), a)
tried("Scan", lambda: comm.Scan(a, a), a)
tried("Exscan", lambda: comm.Exscan(a, a), a)
tried("Alltoall", lambda: comm.Alltoall(a, a), a)
tried("Reduce_scatter_block", lambda: comm.Reduce_scatter_block(a, a[:2]), a)
tried("Reduce_scatter", lambda: comm.Reduce_scatter(a, a[:2], [2] * size), a)
tried("Allgather own block", lambda: comm.Allgather(a[2 * rank:2 * rank + 2], a), a)
tried("Allgatherv own block", lambda: comm.Allgatherv(a[2 * rank:2 * rank + 2], a), a)
tried("Reduce non-root", lambda: comm.Reduce(MPI.IN_PLACE if rank == 0 else a, a, root=0), a)
b = np.arange(4.0) + 10 * rank
tried("Gather root", lambda: one.Gather(b, b, root=0), b)
tried("Gatherv root", lambda: one.Gatherv(b, b, root=0), b)
tried("Scatter root", lambda: one.Scatter(b, b, root=0), b)
tried("Scatterv root", lambda: one.Scatterv(b, b, root=0), b)
tried("Reduce root", lambda: one.Reduce(b, b, root=0), b)
tried("Allreduce IN_PLACE", lambda: comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM), a)
