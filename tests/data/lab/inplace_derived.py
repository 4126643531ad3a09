# MPI.IN_PLACE with a derived datatype in the gathers and all-to-alls: a rank's own block is already where it
# goes (in its receive buffer); only the type's data moves, the gaps between them are left as they were.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, g = comm.rank, comm.size
column = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()  # doubles 0 and 2 of an extent of 3


def mine(n=3 * g, at=0):  # -1.0 everywhere but this rank's column at extent `at` (its gap too)
    b = np.full(n, -1.0)
    b[3 * at:3 * at + 3] = [r, 100 + r, 10 * r]
    return b


b = mine(at=r)
comm.Allgather(MPI.IN_PLACE, [b, 1, column])
print(r, "Allgather", b.tolist())
b = mine(3 * g + 3, at=r + 1)
comm.Allgatherv(MPI.IN_PLACE, [b, ([1] * g, [j + 1 for j in range(g)]), column])
print(r, "Allgatherv", b.tolist())
b = mine(at=r)
comm.Gather(MPI.IN_PLACE if r == 1 else [b[3 * r:], 1, column], [b, 1, column], root=1)
print(r, "Gather to 1", b.tolist())
b = mine(at=r)
comm.Igatherv(MPI.IN_PLACE if r == 2 else [b[3 * r:], 1, column], [b, ([1] * g, list(range(g))), column],
              root=2).Wait()
print(r, "Igatherv to 2", b.tolist())
b = np.arange(3.0 * g) + 100 * r
comm.Alltoall(MPI.IN_PLACE, [b, 1, column])
print(r, "Alltoall", b.tolist())
b = np.arange(3.0 * g) + 100 * r
comm.Alltoallv(MPI.IN_PLACE, [b, ([1] * g, list(range(g))), column])
print(r, "Alltoallv", b.tolist())
try:  # a receive buffer too small for g columns
    comm.Allgather(MPI.IN_PLACE, [np.zeros(3 * g - 3), column])
except Exception as exc:
    print(r, "Allgather into 3 columns:", type(exc).__name__)
column.Free()
