from dataclasses import dataclass
from mpi4py import MPI

made_on = MPI.COMM_WORLD.rank

@dataclass
class Point:
    x: float
    y: float

    def where(self):
        return made_on
