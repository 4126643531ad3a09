import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
data = np.arange(4, dtype="d") if rank == 0 else np.empty(4, dtype="d")
comm.Bcast(data, root=0)
send = np.arange(size * 2, dtype="i") if rank == 0 else None
part = np.empty(2, dtype="i")
comm.Scatter(send, part, root=0)
recv = np.empty(size * 2, dtype="i") if rank == 0 else None
comm.Gather(part * 10, recv, root=0)
tot = np.zeros(2, dtype="i")
comm.Reduce(part, tot, op=MPI.SUM, root=0)
all_ = np.zeros(2, dtype="i")
comm.Allreduce(part, all_, op=MPI.SUM)
# Scatterv/Gatherv: rank r gets r+1 items
counts = [r + 1 for r in range(size)]
displs = [sum(counts[:r]) for r in range(size)]
full = np.arange(sum(counts), dtype="d") if rank == 0 else None
mine = np.empty(counts[rank], dtype="d")
comm.Scatterv([full, counts, displs, MPI.DOUBLE] if rank == 0 else None, mine, root=0)
back = np.empty(sum(counts), dtype="d") if rank == 0 else None
comm.Gatherv(mine * 2, [back, counts, displs, MPI.DOUBLE] if rank == 0 else None, root=0)
print(f"rank {rank}: bcast={data.tolist()} part={part.tolist()} allreduce={all_.tolist()} mine={mine.tolist()}")
if rank == 0:
    print("gather", recv.tolist(), "reduce", tot.tolist(), "gatherv", back.tolist())
