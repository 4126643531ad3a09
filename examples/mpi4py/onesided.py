#!/usr/bin/env python
"""
One-sided communication: a histogram every rank adds into rank 0's window
(Accumulate between two Fences), then a task counter on rank 0 that every rank
takes tasks from with Fetch_and_op under a lock until none are left (dynamic
load balancing), then each rank's neighbours' values read with Get.

usage::

  $ mpiexec -n <nprocs> python onesided.py
"""

import numpy as np

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()

# A histogram of 8 bins on rank 0: each rank counts its own samples, then adds its counts into rank 0's.
bins = 8
counts = np.zeros(bins, dtype="i") if rank == 0 else None
win = MPI.Win.Create(counts, counts.itemsize if rank == 0 else 1, MPI.INFO_NULL, comm)
samples = np.random.default_rng(rank).integers(0, bins, 1000)
mine = np.bincount(samples, minlength=bins).astype("i")
win.Fence()
win.Accumulate(mine, 0, op=MPI.SUM)
win.Fence()
if rank == 0:
    print(f"histogram of {1000 * size} samples: {counts.tolist()} (total {counts.sum()})")
win.Free()

# A task counter on rank 0: Fetch_and_op hands out task numbers one at a time, atomically.
tasks = 20
win = MPI.Win.Allocate(8 if rank == 0 else 0, 8, MPI.INFO_NULL, comm)
if rank == 0:
    np.frombuffer(win.tomemory(), "q")[:] = 0
comm.Barrier()
done = []
one, task = np.ones(1, "q"), np.zeros(1, "q")
while True:
    win.Lock(0)
    win.Fetch_and_op(one, task, 0, 0, MPI.SUM)
    win.Unlock(0)
    if task[0] >= tasks:
        break
    done.append(int(task[0]) ** 2)  # the task: its number squared
finished = comm.gather(done, root=0)
if rank == 0:
    squares = sorted(sum(finished, []))
    print(f"{tasks} tasks taken once each: {squares == [t * t for t in range(tasks)]}; "
          f"sum of squares {sum(squares)}")
win.Free()

# Each rank exposes one number; every rank reads both neighbours' with Get in one fence epoch.
value = np.array([10.0 * rank + 0.5])
win = MPI.Win.Create(value, value.itemsize, MPI.INFO_NULL, comm)
got = np.zeros(2)
win.Fence()
win.Get(got[0:1], (rank - 1) % size)
win.Get(got[1:2], (rank + 1) % size)
win.Fence()
lines = comm.gather(f"rank {rank}: left neighbour has {got[0]}, right neighbour has {got[1]}", root=0)
if rank == 0:
    print("\n".join(lines))
win.Free()
