import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
right, left = (rank + 1) % size, (rank - 1) % size
a = np.arange(5, dtype="d") + 100 * rank
b = np.zeros(5)
st = MPI.Status()
comm.Sendrecv(a, dest=right, sendtag=1, recvbuf=b, source=left, recvtag=1, status=st)
print(f"rank {rank}: got {b.tolist()} from {st.Get_source()} count {st.Get_count(MPI.DOUBLE)}")
obj = comm.sendrecv(("hi", rank), dest=right, source=left)
print(f"rank {rank}: sendrecv obj {obj}")
comm.Sendrecv_replace(a, dest=right, source=left)
print(f"rank {rank}: replaced {a[0]}")
