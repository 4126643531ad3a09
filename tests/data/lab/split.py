from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
ncols = 2
row = comm.Split(color=rank // ncols, key=rank)
col = comm.Split(color=rank % ncols, key=rank)
rs = row.allreduce(rank)
cs = col.allreduce(rank)
print(f"world {rank}: row {rank // ncols} rank {row.rank}/{row.size} sum {rs}; col {rank % ncols} rank {col.rank}/{col.size} sum {cs}")
row.Free(); col.Free()
