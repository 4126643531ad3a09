# None where a collective's buffer goes: mpi4py's TypeError ("message: expecting buffer or list/tuple"), except
# where MPI reads no buffer (a non-root's receive buffer of Gather and Reduce, a non-root's send buffer of Scatter)
# and where None is MPI.IN_PLACE (a send buffer; the root's of Gather and Reduce, the root's receive buffer of
# Scatter).
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
one = MPI.COMM_SELF  # a root's own refusals, with no other rank to leave waiting


def tried(name, call, a):
    try:
        call()
        print(rank, name, "ran", a.tolist())
    except TypeError as e:
        print(rank, name, "TypeError", "expecting buffer or list/tuple" in str(e))


a = np.full(size, rank + 1.0)
b = np.zeros(size)
c = np.zeros(1)
tried("Allreduce", lambda: comm.Allreduce(a, None), a)
tried("Iallreduce", lambda: comm.Iallreduce(a, None), a)
tried("Scan", lambda: comm.Scan(a, None), a)
tried("Exscan", lambda: comm.Exscan(a, None), a)
tried("Reduce_scatter_block", lambda: comm.Reduce_scatter_block(a, None), a)
tried("Allgather", lambda: comm.Allgather(a[:1], None), a)
tried("Allgatherv", lambda: comm.Allgatherv(a[:1], None), a)
tried("Alltoall", lambda: comm.Alltoall(a, None), a)
tried("Alltoallv", lambda: comm.Alltoallv(a, None), a)
tried("Bcast", lambda: comm.Bcast(None, root=0), a)
tried("Sendrecv_replace", lambda: comm.Sendrecv_replace(None, dest=(rank + 1) % size, source=(rank - 1) % size), a)
tried("Neighbor_alltoall", lambda: comm.Create_cart([size], periods=[True]).Neighbor_alltoall(a[:2], None), a)
tried("Reduce root", lambda: one.Reduce(a, None, root=0), a)
tried("Gather root", lambda: one.Gather(a, None, root=0), a)
tried("Scatter root", lambda: one.Scatter(None, a, root=0), a)
tried("Bcast root", lambda: one.Bcast(None, root=0), a)
tried("Reduce non-root", lambda: comm.Reduce(a, b if rank == 0 else None, root=0), b)
tried("Gather non-root", lambda: comm.Gather(a[:1], b if rank == 0 else None, root=0), b)
tried("Scatter non-root", lambda: comm.Scatter(a if rank == 0 else None, c, root=0), c)
tried("Sendrecv_replace PROC_NULL", lambda: comm.Sendrecv_replace(None, MPI.PROC_NULL, 0, MPI.PROC_NULL, 0), c)
tried("Allreduce in place", lambda: comm.Allreduce(None, a), a)
tried("Reduce root in place", lambda: comm.Reduce(None if rank == 0 else a, a, root=0), a)
tried("Gather root in place", lambda: comm.Gather(None if rank == 0 else a[rank:rank + 1], a, root=0), a)
tried("Scatter root in place", lambda: comm.Scatter(a, None if rank == 0 else c, root=0), c)
