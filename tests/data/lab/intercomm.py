"""An intercommunicator of the even and the odd ranks: point to point both ways, Bcast with MPI.ROOT,
Allreduce and Allgather of the other group's data, Merge."""
import numpy as np
from mpi4py import MPI

world = MPI.COMM_WORLD
rank = world.Get_rank()
color = rank % 2
local = world.Split(color, rank)
inter = local.Create_intercomm(0, world, 1 - color, tag=7)
me, size, rsize = inter.Get_rank(), inter.Get_size(), inter.Get_remote_size()
print(f"rank {rank}: group {color}, local {me} of {size}, remote size {rsize}, inter {inter.Is_inter()}")

if color == 0:
    inter.send(("hello", rank), dest=me % rsize, tag=3)
    status = MPI.Status()
    got = inter.recv(source=MPI.ANY_SOURCE, tag=4, status=status)
    print(f"rank {rank}: got {got} from remote rank {status.Get_source()}")
else:
    status = MPI.Status()
    got = inter.recv(source=MPI.ANY_SOURCE, tag=3, status=status)
    print(f"rank {rank}: got {got} from remote rank {status.Get_source()}")
    inter.send(("reply", rank), dest=status.Get_source(), tag=4)

buf = np.zeros(3, dtype="i")
if color == 0:
    if me == 0:
        buf[:] = [10, 20, 30]
        inter.Bcast(buf, root=MPI.ROOT)
    else:
        inter.Bcast(buf, root=MPI.PROC_NULL)
else:
    inter.Bcast(buf, root=0)
print(f"rank {rank}: Bcast {buf.tolist()}")

total = np.zeros(2, dtype="d")
inter.Allreduce(np.array([rank, 1.0]), total, op=MPI.SUM)
print(f"rank {rank}: Allreduce of the other group {total.tolist()}")
print(f"rank {rank}: allgather of the other group {inter.allgather(rank)}")

merged = inter.Merge(high=bool(color))
print(f"rank {rank}: merged rank {merged.Get_rank()} of {merged.Get_size()}, sum {merged.allreduce(rank)}")
merged.Free()
inter.Barrier()
inter.Free()
local.Free()
