from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
right, left = (rank + 1) % size, (rank - 1) % size
# every rank sends first (small message: works thanks to eager buffering)
comm.send({"from": rank, "data": [rank] * 3}, dest=right, tag=11)
msg = comm.recv(source=left, tag=11)
print(f"rank {rank} got {msg}")
