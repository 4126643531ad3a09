# Every rank posts an Ibarrier and never waits for it: MPI requires every request to be completed (Wait,
# Test) or freed, a nonblocking collective's too.
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.rank
comm.Ibarrier()   # no Wait
print(f"rank {rank} done")
