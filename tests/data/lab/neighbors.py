# Neighbour collectives on 2-D grids (periodic or not, dims of 1 and 2 ranks). MPI: each rank prints what it got.
import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
for dims, periods in (([2, 2], [True, False]), ([4, 1], [False, True]), ([1, 4], [True, True])):
    cart = comm.Create_cart(dims, periods=periods)
    r, k = cart.rank, 4
    tag = f"{dims} {periods} rank {r}:"
    got = np.full(k, -1.0)
    cart.Neighbor_allgather(np.array([float(r)]), got)
    print(tag, "allgather", got.tolist())
    got = np.full(2 * k, -1)
    cart.Neighbor_allgatherv(np.array([r, 10 * r]), [got, [2] * k, [0, 2, 4, 6], MPI.INT64_T])
    print(tag, "allgatherv", got.tolist())
    got = np.full(k, -1.0)
    cart.Neighbor_alltoall(np.arange(k, dtype=float) + 100 * r, got)
    print(tag, "alltoall", got.tolist())
    send = np.arange(10, dtype=np.int64) + 100 * r  # the neighbours along dimension d get d + 1 items
    got = np.full(9, -1, dtype=np.int64)
    cart.Neighbor_alltoallv([send, [1, 1, 2, 2], [0, 1, 2, 5], MPI.INT64_T],
                            [got, [1, 1, 2, 2], [0, 2, 4, 7], MPI.INT64_T])
    print(tag, "alltoallv", got.tolist())
    cart.Free()
cart = comm.Create_cart([2, 2], periods=[True, False])
objects = cart.neighbor_alltoall([f"{cart.rank}>{i}" for i in range(4)])
print(cart.rank, "objects", cart.neighbor_allgather(cart.rank), objects)
got = np.full(4, -1.0)
cart.Ineighbor_alltoall(np.arange(4.0) + 10 * cart.rank, got).Wait()
print(cart.rank, "ialltoall", got.tolist())
