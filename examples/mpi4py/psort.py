#!/usr/bin/env python
"""
Parallel sample sort: every rank sorts its own numbers, the ranks agree on
splitters (gather + bcast), exchange buckets with Alltoall/Alltoallv, sort
what they received and rank 0 gathers the result with Gatherv.

usage::

  $ mpiexec -n <nprocs> python psort.py
"""

import numpy as np

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()

rng = np.random.default_rng(1234 + rank)
local = np.sort(rng.integers(0, 1000, 10 + 3 * rank).astype("i"))

# Splitters: every rank proposes size - 1 samples; rank 0 picks from the sorted pool.
samples = comm.gather(local[np.linspace(0, len(local) - 1, size + 1).astype(int)[1:-1]].tolist(), root=0)
splitters = None
if rank == 0:
    pool = sorted(v for s in samples for v in s)
    splitters = pool[size - 1::size - 1][:size - 1] if size > 1 else []
splitters = comm.bcast(splitters, root=0)

# Buckets: how many of mine go to each rank, then the numbers themselves.
cuts = np.searchsorted(local, splitters, side="right")
sendcounts = np.diff(np.concatenate(([0], cuts, [len(local)]))).astype("i")
recvcounts = np.empty(size, dtype="i")
comm.Alltoall(sendcounts, recvcounts)
mine = np.empty(recvcounts.sum(), dtype="i")
comm.Alltoallv([local, sendcounts], [mine, recvcounts])
mine.sort()

counts = comm.gather(len(mine), root=0)
result = np.empty(sum(counts), dtype="i") if rank == 0 else None
comm.Gatherv(mine, [result, counts] if rank == 0 else None, root=0)
if rank == 0:
    print("counts per rank:", counts)
    print("first 10:", result[:10].tolist(), "last 10:", result[-10:].tolist())
    print("sorted:", bool(np.all(np.diff(result) >= 0)), "total:", len(result))
