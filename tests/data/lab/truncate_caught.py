import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.rank
if rank == 0:
    comm.Send(np.arange(10, dtype="d"), dest=1, tag=0)
elif rank == 1:
    buf = np.empty(5, dtype="d")   # too small
    try:
        comm.Recv(buf, source=0, tag=0)
    except MPI.Exception as e:
        print("rank 1 caught:", e.Get_error_class() == MPI.ERR_TRUNCATE, MPI.Get_error_string(e.Get_error_code()).split(",")[0])
comm.Barrier()
print(f"rank {rank} done")
