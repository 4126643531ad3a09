#!/usr/bin/env python
"""
Parallel matrix-vector product y = A x with a row-distributed matrix and vector
(the mpi4py tutorial's Allgather recipe), checked against the serial product.

usage::

  $ mpiexec -n <nprocs> python matvec.py
"""

import numpy as np

from mpi4py import MPI


def matvec(comm, A, x):
    """y = A x for the local rows of A and the local piece of x."""
    m = A.shape[0]  # local rows
    p = comm.Get_size()
    xg = np.zeros(m * p, dtype="d")
    comm.Allgather([x, MPI.DOUBLE], [xg, MPI.DOUBLE])
    return np.dot(A, xg)


comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()
m = 3  # rows per rank
n = m * size
A_full = np.arange(n * n, dtype="d").reshape(n, n) % 7 - 3
x_full = np.arange(n, dtype="d") / 2
A = A_full[rank * m:(rank + 1) * m].copy()
x = x_full[rank * m:(rank + 1) * m].copy()

y = matvec(comm, A, x)
y_full = np.empty(n, dtype="d") if rank == 0 else None
comm.Gather(y, y_full, root=0)
if rank == 0:
    print("y =", y_full.tolist())
    print("matches the serial product:", bool(np.array_equal(y_full, A_full @ x_full)))
