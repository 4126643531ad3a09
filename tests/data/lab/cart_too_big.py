# A 3 x 2 Cartesian grid asked of 4 ranks.
from mpi4py import MPI

grid = MPI.COMM_WORLD.Create_cart([3, 2])
print(grid.Get_coords(grid.rank))
