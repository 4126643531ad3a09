# A matrix's columns scattered with a resized vector datatype (the classic exercise), gathered back and
# allgathered through it, a Scatterv/Gatherv/Allgatherv of 1 or 2 columns a rank, and an Allgather of a strided
# send.
# Every rank's lines are printed by rank 0, in rank order.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
said = []
rows = 3
A = np.arange(rows * n, dtype="d").reshape(rows, n) if r == 0 else None
column = MPI.DOUBLE.Create_vector(rows, 1, n).Create_resized(0, 8).Commit()  # the next column starts 8 bytes on
mine = np.zeros(rows)
comm.Scatter([A, 1, column] if r == 0 else None, mine, root=0)
said.append(f"{r} column {mine.tolist()}")
B = np.zeros((rows, n)) if r == 0 else None
comm.Gather(mine * 10, [B, 1, column] if r == 0 else None, root=0)
if r == 0:
    said.append(f"gathered {B.tolist()}")
C = np.zeros((rows, n))
comm.Allgather(mine + 0.5, [C, 1, column])
said.append(f"{r} allgathered {C.tolist()}")
# Rank j takes j % 2 + 1 columns of a wider matrix.
counts = [j % 2 + 1 for j in range(n)]
displs = [sum(counts[:j]) for j in range(n)]
W = np.arange(rows * sum(counts), dtype="d").reshape(rows, sum(counts)) if r == 0 else None
wide = MPI.DOUBLE.Create_vector(rows, 1, sum(counts)).Create_resized(0, 8).Commit()
got = np.zeros(rows * counts[r])
comm.Scatterv([W, (counts, displs), wide] if r == 0 else None, got, root=0)
said.append(f"{r} scatterv {got.tolist()}")
back = np.zeros((rows, sum(counts))) if r == 0 else None
comm.Gatherv(got, [back, (counts, displs), wide] if r == 0 else None, root=0)
if r == 0:
    said.append(f"gatherv {back.tolist()}")
everything = np.zeros((rows, sum(counts)))
comm.Allgatherv(got, [everything, (counts, displs), wide])
said.append(f"{r} allgatherv {everything.tolist() == np.arange(rows * sum(counts)).reshape(rows, -1).tolist()}")
# The sender's side strided: each rank sends its local array's second column.
local = np.arange(12, dtype="d").reshape(4, 3) + 100 * r
stride = MPI.DOUBLE.Create_vector(4, 1, 3).Commit()
everyone = np.zeros(4 * n)
comm.Allgather([local.reshape(-1)[1:], 1, stride], everyone)
said.append(f"{r} allgather of strided sends {everyone.tolist()}")
# Rank r holds 2 rows of a (2 x 2n) block row; an Alltoall sends rank j its 2 x 2 block column by column (a
# resized vector type picks one column of the block), an Alltoallv 1 or 2 columns to each rank.
k = 2
M = (np.arange(k * n * k, dtype="d") + 1000 * r).reshape(k, k * n)
col_of_block = MPI.DOUBLE.Create_vector(k, 1, k * n).Create_resized(0, 8).Commit()
T = np.zeros((k, k * n))
comm.Alltoall([M, k, col_of_block], T)  # block j: columns j*k..j*k+k-1, each as a column of the block
said.append(f"{r} alltoall transposed {T.tolist()}")
counts2 = [1 + (j + r) % 2 for j in range(n)]  # rank r sends rank j 1 or 2 columns of its rows
recv_counts = [1 + (r + j) % 2 for j in range(n)]
V = np.zeros(k * sum(recv_counts))
comm.Alltoallv([M, (counts2, [j * k for j in range(n)]), col_of_block],
               [V, ([c * k for c in recv_counts], [k * sum(recv_counts[:j]) for j in range(n)])])
said.append(f"{r} alltoallv {V.tolist()}")
for datatype in (column, wide, stride, col_of_block):
    datatype.Free()
lines = comm.gather(said, root=0)
if r == 0:
    print("\n".join(line for rank_lines in lines for line in rank_lines))
