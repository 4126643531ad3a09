#!/usr/bin/env python
"""
Ring: a token goes once around the ranks (object send/recv), then every rank
passes its number to the right with a buffer Send before its Recv (which
works because small standard sends are buffered, as MPICH does).

usage::

  $ mpiexec -n <nprocs> python ring.py
"""

import numpy as np

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()
right = (rank + 1) % size
left = (rank - 1) % size

if rank == 0:
    token = ["start"]
    comm.send(token, dest=right, tag=11)
    token = comm.recv(source=left, tag=11)
    print(f"token back at rank 0 after {len(token) - 1} hops: {token}")
else:
    token = comm.recv(source=left, tag=11)
    token.append(rank)
    comm.send(token, dest=right, tag=11)

sendbuf = np.array([rank, rank * rank], dtype="i")
recvbuf = np.empty(2, dtype="i")
comm.Send([sendbuf, MPI.INT], dest=right, tag=22)
comm.Recv([recvbuf, MPI.INT], source=left, tag=22)
received = comm.gather(recvbuf.tolist(), root=0)
if rank == 0:
    for r, got in enumerate(received):
        print(f"rank {r} received {got} from rank {(r - 1) % size}")
