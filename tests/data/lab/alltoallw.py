# Alltoallw (a datatype per block, displacements in bytes), its neighbour, nonblocking and persistent forms.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
# Rank r sends rank j (j + 1) float64s if j is even, else (j + 1) int32s, packed end to end in one byte buffer.
types = [MPI.DOUBLE if j % 2 == 0 else MPI.INT32_T for j in range(n)]
sizes = [8 if j % 2 == 0 else 4 for j in range(n)]
counts = [j + 1 for j in range(n)]
displs = list(np.cumsum([0] + [c * s for c, s in zip(counts, sizes)])[:-1])
send = bytearray(sum(c * s for c, s in zip(counts, sizes)))
for j in range(n):
    dtype = np.float64 if j % 2 == 0 else np.int32
    np.frombuffer(send, dtype, counts[j], displs[j])[:] = 100 * r + 10 * j + np.arange(counts[j])
# Rank r receives (r + 1) items of its own type from every rank, each block 64 bytes apart.
mine = np.float64 if r % 2 == 0 else np.int32
recv = bytearray(64 * n)
comm.Alltoallw([send, (counts, displs), types], [recv, ([r + 1] * n, [64 * j for j in range(n)]), [types[r]] * n])
print(r, "alltoallw", [np.frombuffer(recv, mine, r + 1, 64 * j).tolist() for j in range(n)])
recv2 = bytearray(64 * n)
comm.Ialltoallw([send, counts, displs, types], [recv2, [r + 1] * n, [64 * j for j in range(n)], [types[r]] * n]).Wait()
print(r, "ialltoallw same", recv2 == recv)
request = comm.Alltoallw_init([send, counts, displs, types], [recv2, [r + 1] * n, [64 * j for j in range(n)],
                                                              [types[r]] * n])
for step in range(2):
    for j in range(0, n, 2):  # each Start sends what the buffer holds then
        np.frombuffer(send, np.float64, 1, displs[j])[:] = 1000 * (step + 1) + 100 * r + 10 * j
    request.Start()
    request.Wait()
    print(r, "persistent start", step, np.frombuffer(recv2, mine, r + 1, 0).tolist())
request.Free()
# The directed ring of distances 1 and 2: to (r + 1) two int16s, to (r + 2) one float32.
dist = comm.Create_dist_graph_adjacent([(r - 1) % n, (r - 2) % n], [(r + 1) % n, (r + 2) % n])
out = bytearray(8)
np.frombuffer(out, np.int16, 2, 0)[:] = [r, -r]
np.frombuffer(out, np.float32, 1, 4)[:] = [r + 0.5]
got = bytearray(16)
dist.Neighbor_alltoallw([out, ([2, 1], [0, 4]), [MPI.INT16_T, MPI.FLOAT]],
                        [got, ([2, 1], [8, 0]), [MPI.INT16_T, MPI.FLOAT]])
print(r, "neighbor alltoallw", np.frombuffer(got, np.int16, 2, 8).tolist(), np.frombuffer(got, np.float32, 1).tolist())
gathered = np.full(2, -1.0)
request = dist.Neighbor_allgather_init(np.array([r * 1.0]), gathered)
request.Start()
request.Wait()
print(r, "persistent neighbor allgather", gathered.tolist())
request.Free()
dist.Free()
# Derived datatypes per block: to rank j the j-th column of an n x n matrix (a vector type), received as a
# contiguous row; then the same matrix from MPI.BOTTOM, each block a struct type of absolute addresses.
matrix = np.arange(n * n, dtype=np.float64).reshape(n, n) + 100 * r
column = MPI.DOUBLE.Create_vector(n, 1, n).Commit()
rows = np.full((n, n), -1.0)
comm.Alltoallw([matrix, [1] * n, [8 * j for j in range(n)], [column] * n],
               [rows, [n] * n, [8 * n * j for j in range(n)], [MPI.DOUBLE] * n])
print(r, "alltoallw of columns", rows.tolist())
base, into = MPI.Get_address(matrix), MPI.Get_address(rows)
sent = [MPI.Datatype.Create_struct([1], [base + 8 * j], [column]).Commit() for j in range(n)]
landing = [MPI.Datatype.Create_struct([n], [into + 8 * n * (n - 1 - j)], [MPI.DOUBLE]).Commit() for j in range(n)]
rows[:] = -1.0
comm.Alltoallw([MPI.BOTTOM, ([1] * n, [0] * n), sent], [MPI.BOTTOM, ([1] * n, [0] * n), landing])
print(r, "alltoallw from MPI.BOTTOM, rows reversed", rows.tolist())
for t in sent + landing + [column]:
    t.Free()
