import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
if rank == 0:
    got = []
    for _ in range(size - 1):
        st = MPI.Status()
        buf = np.zeros(10, dtype="i")
        comm.Recv(buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
        n = st.Get_count(MPI.INT)
        got.append((st.Get_source(), st.Get_tag(), n, buf[:n].tolist()))
    for g in sorted(got):
        print("from %d tag %d count %d data %s" % g)
    comm.Barrier()
    st = MPI.Status()
    for _ in range(size - 1):
        obj = comm.recv(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=st)
        got.append((obj, st.Get_source(), st.Get_tag(), st.Get_count(MPI.BYTE) > 0))
    print("objects", sorted(got[size - 1:]))
else:
    comm.Send(np.arange(rank, dtype="i"), dest=0, tag=10 + rank)
    comm.Barrier()
    comm.send(rank * rank, dest=0, tag=rank)
