# Rank 0 checks the arguments and aborts the job.
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 0 and len(sys.argv) < 2:
    print("usage: abort.py N", file=sys.stderr)
    comm.Abort(2)
n = comm.bcast(int(sys.argv[1]) if comm.rank == 0 else None, root=0)
print(comm.rank, n)
