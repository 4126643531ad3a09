# Imported by main.py and never used: each MPI process prints this line at its import statement.
from mpi4py import MPI

print(f"announce imported on rank {MPI.COMM_WORLD.Get_rank()}", flush=True)
