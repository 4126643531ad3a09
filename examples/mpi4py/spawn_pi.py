#!/usr/bin/env python
"""
Dynamic processes: the ranks started by mpiexec spawn 4 workers (this same
file, run again), send them the number of intervals, and get back the sum of
their parts of pi by the midpoint rule, over the intercommunicator a Spawn
gives. A worker knows it is one because MPI.Comm.Get_parent() is not
MPI.COMM_NULL.

usage::

  $ mpiexec -n <nprocs> python spawn_pi.py
"""

import os
import sys

import numpy as np

from mpi4py import MPI

WORKERS = 4
INTERVALS = 100_000


def parent(comm):
    """The ranks mpiexec started: one Spawn over all of them, rank 0 the root that sends and receives."""
    rank = comm.Get_rank()
    workers = comm.Spawn(sys.executable, args=[os.path.abspath(__file__)], maxprocs=WORKERS, root=0)
    root = MPI.ROOT if rank == 0 else MPI.PROC_NULL  # who sends to the other side, and who takes its sum
    workers.Bcast(np.array([INTERVALS], dtype="i"), root=root)
    pi = np.zeros(1)
    workers.Reduce(None, pi, op=MPI.SUM, root=root)
    sizes = workers.gather(None, root=root)
    workers.Disconnect()
    if rank == 0:
        ranks = comm.Get_size()
        print(f"{ranks} rank{'s' if ranks > 1 else ''} spawned {len(sizes)} workers, each in a world of {sizes[0]}")
        print(f"pi is about {pi[0]:.10f}, error {abs(pi[0] - np.pi):.1e}")


def worker(parents):
    """A spawned rank: its share of the intervals, summed onto the parents' root."""
    world = MPI.COMM_WORLD
    n = np.zeros(1, dtype="i")
    parents.Bcast(n, root=0)
    h = 1.0 / n[0]
    x = h * (np.arange(world.Get_rank(), n[0], world.Get_size()) + 0.5)
    part = np.array([h * np.sum(4.0 / (1.0 + x * x))])
    parents.Reduce(part, None, op=MPI.SUM, root=0)
    parents.gather(world.Get_size(), root=0)
    parents.Disconnect()


if __name__ == "__main__":
    found = MPI.Comm.Get_parent()
    if found == MPI.COMM_NULL:
        parent(MPI.COMM_WORLD)
    else:
        worker(found)
