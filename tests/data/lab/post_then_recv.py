"""Posting a nonblocking collective does not wait for the other ranks (MPI): rank 0 posts Ibarrier, then
receives 800 kB from rank 1, which sends them (past MPICH's eager limit: its Send waits for the receive)
before it posts its own Ibarrier. Then a blocking allreduce runs while an Iallreduce is pending."""
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
data = np.zeros(100000)
if rank == 0:
    req = comm.Ibarrier()
    comm.Recv(data, source=1)
    req.Wait()
elif rank == 1:
    comm.Send(np.full(100000, 7.0), dest=0)
    comm.Ibarrier().Wait()
else:
    comm.Ibarrier().Wait()
total = np.zeros(1)
req = comm.Iallreduce(np.full(1, rank + 1.0), total)
count = comm.allreduce(1)
req.Wait()
print(f"rank {rank}: received {data[0]}, Iallreduce {total[0]}, allreduce {count}")
