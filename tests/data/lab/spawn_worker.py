# A worker spawn_master.py spawns: its tasks come through the intercommunicator to its parent.
import sys

import numpy as np
from mpi4py import MPI

parent = MPI.Comm.Get_parent()
world = MPI.COMM_WORLD
tasks = parent.scatter(None, root=0)
offset = np.zeros(1, dtype="i")
parent.Bcast(offset, root=0)
squares = [t * t + int(offset[0]) for t in tasks]
parent.gather((sys.argv[1:], world.Get_size(), squares), root=0)
parent.Reduce(np.array([sum(squares)], dtype="i"), None, op=MPI.SUM, root=0)
if world.Get_rank() == 0:
    parent.send(f"{world.Get_size()} workers done", dest=0, tag=5)
merged = parent.Merge(high=True)
merged.Free()
parent.Barrier()
parent.Disconnect()
assert MPI.Comm.Get_parent() == MPI.COMM_NULL
