#!/usr/bin/env python
"""
Parallel I/O (MPI-IO): a 2-D array of doubles split in blocks over a grid of ranks, each block written
into one shared file through a subarray file view by a collective Write_all; the file checked against
the whole array, then read back by rows (explicit offsets, Read_at_all) and a log written in rank
order (Write_ordered).

usage::

  $ mpiexec -n <nprocs> python parallel_io.py
"""

import os
import shutil
import tempfile

import numpy as np

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()
rows, cols = MPI.Compute_dims(size, 2)
n, m = 3 * rows, 4 * cols  # the global array: 3 x 4 doubles a rank
whole = np.arange(n * m, dtype="d").reshape(n, m)
folder = comm.bcast(tempfile.mkdtemp() if rank == 0 else None, root=0)
path = os.path.join(folder, "array.bin")

# each rank's block, at (i, j) of the grid, through a subarray view of the global array
i, j = divmod(rank, cols)
block = whole[3 * i:3 * i + 3, 4 * j:4 * j + 4].copy()
view = MPI.DOUBLE.Create_subarray([n, m], [3, 4], [3 * i, 4 * j]).Commit()
fh = MPI.File.Open(comm, path, MPI.MODE_CREATE | MPI.MODE_WRONLY)
fh.Set_view(0, MPI.DOUBLE, view)
fh.Write_all(block)
fh.Close()
view.Free()

if rank == 0:
    print(f"{size} ranks on a {rows} x {cols} grid wrote a {n} x {m} array of {os.path.getsize(path)} bytes")
    print("the file is the whole array:", bool(np.array_equal(np.fromfile(path, dtype="d").reshape(n, m), whole)))

# read back by rows: rank r's rows [r * n // size, (r + 1) * n // size), at explicit offsets
first, last = rank * n // size, (rank + 1) * n // size
mine = np.empty((last - first, m), dtype="d")
fh = MPI.File.Open(comm, path, MPI.MODE_RDONLY)
fh.Read_at_all(first * m * mine.itemsize, mine)
fh.Close()
good = comm.allreduce(bool(np.array_equal(mine, whole[first:last])), op=MPI.LAND)

# a log, each rank's line after the ranks before it
log = os.path.join(folder, "log.txt")
fh = MPI.File.Open(comm, log, MPI.MODE_CREATE | MPI.MODE_WRONLY)
fh.Write_ordered(np.frombuffer(f"rank {rank} held rows {first} to {last - 1}\n".encode(), dtype="b"))
fh.Close()
if rank == 0:
    print("every rank read its rows back:", good)
    with open(log) as f:
        print(f.read(), end="")
    shutil.rmtree(folder)
