# A 2-D halo exchange on a ring of ranks: each rank's block of a grid, its edge columns sent as vector
# datatypes with Isend/Irecv (the classic Jacobi lab), then rows with Sendrecv and a persistent Recv_init.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
left, right = (r - 1) % n, (r + 1) % n
rows, cols = 4, 5
grid = np.full((rows, cols + 2), -1.0)  # one ghost column each side
grid[:, 1:-1] = 100 * r + np.arange(rows * cols).reshape(rows, cols)
flat = grid.reshape(-1)  # the grid's memory; flat[k:] starts at column k
column = MPI.DOUBLE.Create_vector(rows, 1, cols + 2).Commit()  # one column of the grid
requests = [comm.Irecv([flat[0:], 1, column], left, 0), comm.Irecv([flat[cols + 1:], 1, column], right, 1),
            comm.Isend([flat[cols:], 1, column], right, 0), comm.Isend([flat[1:], 1, column], left, 1)]
MPI.Request.Waitall(requests)
print(r, "ghost columns", grid[:, 0].tolist(), grid[:, -1].tolist())
# Two columns at once (a vector of 2-wide blocks), received into a contiguous array.
pair = MPI.DOUBLE.Create_vector(rows, 2, cols + 2).Commit()
got = np.zeros(2 * rows)
status = MPI.Status()
comm.Sendrecv([flat[1:], 1, pair], right, 2, got, left, 2, status)
print(r, "pair", got.tolist(), "count", status.Get_count(MPI.DOUBLE), status.Get_count(pair))
# A persistent receive into a column, started twice.
recv = comm.Recv_init([flat, 1, column], left, 3)
for step in range(2):
    recv.Start()
    comm.Send(np.arange(rows, dtype=float) + 10 * step + r, right, 3)
    recv.Wait()
    print(r, "persistent step", step, grid[:, 0].tolist())
recv.Free()
pair.Free()
# Rank 0's grid column 3 broadcast as a vector type: every rank's column 3 becomes rank 0's, the rest its own.
comm.Bcast([flat[3:], 1, column], root=0)
print(r, "broadcast column", grid[:, 3].tolist(), "the rest kept", grid[0, 4] == 100 * r + 3)
column.Free()
# The same ghost columns by one neighbour collective on a periodic 1-D Cartesian grid: the two edge columns
# are the send blocks (a column type resized to the distance between them), the ghost columns the receive ones.
ring = comm.Create_cart([n], periods=[True])
grid2 = np.full((rows, cols + 2), -1.0)
grid2[:, 1:-1] = 100 * r + np.arange(rows * cols).reshape(rows, cols)
flat2 = grid2.reshape(-1)
edges = MPI.DOUBLE.Create_vector(rows, 1, cols + 2).Create_resized(0, (cols - 1) * 8).Commit()
ghosts = MPI.DOUBLE.Create_vector(rows, 1, cols + 2).Create_resized(0, (cols + 1) * 8).Commit()
ring.Neighbor_alltoall([flat2[1:], 1, edges], [flat2, 1, ghosts])
print(r, "neighbour ghost columns", grid2[:, 0].tolist(), grid2[:, -1].tolist())  # the Isend/Irecv ones
one_column = MPI.DOUBLE.Create_vector(rows, 1, cols + 2).Commit()
everyone = np.zeros(2 * rows)
ring.Neighbor_allgather([flat2[1:], 1, one_column], everyone)  # each neighbour's left edge column
print(r, "neighbours' left edges", everyone.tolist())
for datatype in (edges, ghosts, one_column):
    datatype.Free()
ring.Free()
