# Master and spawned workers: rank 0 of a world of one spawns 3 workers (spawn_worker.py beside it), scatters
# the work through the intercommunicator, gathers the results, reduces a count, and disconnects.
import os
import sys

import numpy as np
from mpi4py import MPI

WORKERS = 3
worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spawn_worker.py")
errcodes = []
children = MPI.COMM_SELF.Spawn(sys.executable, args=[worker, "squares"], maxprocs=WORKERS, errcodes=errcodes)
print("spawned", children.Get_remote_size(), "workers; local size", children.Get_size(), "errcodes", errcodes)
print("parent world", MPI.COMM_WORLD.Get_size(), "is inter", children.Is_inter())
chunks = [list(range(w * 4, w * 4 + 4)) for w in range(WORKERS)]
children.scatter(chunks, root=MPI.ROOT)
total = np.zeros(1, dtype="i")
children.Bcast(np.array([10], dtype="i"), root=MPI.ROOT)
results = children.gather(None, root=MPI.ROOT)
for rank, (argv, size, got) in enumerate(results):
    print("worker", rank, "of", size, "argv", argv, "squares", got)
children.Reduce(None, total, op=MPI.SUM, root=MPI.ROOT)
print("sum of squares plus offsets", int(total[0]))
note = children.recv(source=0, tag=5)
print("worker 0 says", note)
merged = children.Merge(high=False)
print("merged size", merged.Get_size(), "my rank there", merged.Get_rank())
merged.Free()
children.Barrier()
children.Disconnect()
print("disconnected", children == MPI.COMM_NULL)
