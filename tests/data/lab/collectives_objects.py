from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
cfg = {"alpha": 0.5, "steps": 10} if rank == 0 else None
cfg = comm.bcast(cfg, root=0)
chunks = [list(range(i, i + 3)) for i in range(size)] if rank == 0 else None
mine = comm.scatter(chunks, root=0)
partial = sum(mine)
allp = comm.gather(partial, root=0)
tot = comm.reduce(partial, op=MPI.SUM, root=0)
everyone = comm.allreduce(partial, op=MPI.SUM)
print(f"rank {rank}: cfg={cfg} mine={mine} gathered={allp} reduce={tot} allreduce={everyone}")
