import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
val = (rank * 7) % size + 0.5
mx = comm.reduce(val, op=MPI.MAX, root=0)
mn = comm.allreduce((val, rank), op=MPI.MINLOC)
mxl = comm.allreduce((val, rank), op=MPI.MAXLOC)
buf = np.array([val], dtype="d")
out = np.zeros(1)
comm.Allreduce(buf, out, op=MPI.MAX)
pair = np.array([(val, rank)], dtype=[("v", "f8"), ("i", "i4")])

def absmax(a, b, dtype):
    x = np.frombuffer(a, dtype="d"); y = np.frombuffer(b, dtype="d")
    np.copyto(y, np.where(np.abs(x) > np.abs(y), x, y))

op = MPI.Op.Create(absmax, commute=True)
s = np.array([(-1) ** rank * rank], dtype="d")
r = np.zeros(1)
comm.Allreduce(s, r, op=op)
op.Free()
pyop = comm.allreduce(str(rank), op=lambda a, b: a + b)
print(f"rank {rank}: max={mx} minloc={mn} maxloc={mxl} Allreduce MAX={out[0]} absmax={r[0]} lambda={pyop}")
