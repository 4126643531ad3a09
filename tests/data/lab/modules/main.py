# A program split in modules that read the rank when imported (mpi_utils.py, the package geom), and a
# dataclass sent between ranks: every MPI process imports its own.
import announce  # never used: its print runs at each rank's import all the same
from mpi_utils import *
import mpi_utils
from geom import Point, shapes
import geom.shapes
hello(); msg = hello()
p = Point(rank, 2 * rank)
q = comm.sendrecv(p, dest=(rank + 1) % size, source=(rank - 1) % size)
print(rank, msg, mpi_utils.calls, q, type(q) is Point, q.where(), shapes.made_on, geom.shapes is shapes, isinstance(q, geom.shapes.Point))
