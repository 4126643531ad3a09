"""The engine interface, and MPI's engine.

An engine is what a mesh runs on. It answers how a group of the mesh is made
(`group`: a communicator that speaks mpi4py's buffer collectives, its size and
this rank's place in it), how one collective runs on it (`collective`: the
buffer call, waited for as the mesh asks) and how local work is done (`local`,
`matmul`; the dry engine also makes the zeros that stand in for a generated
block, `blank`). The runtime's collectives (spmdsim.runtime.collectives) lay
out buffers once for every engine and hand the call to the mesh's engine; the
engines differ in what the group's communicator is. The debug hooks and
emulated algorithms are layers around `collective` (spmdsim.runtime.layers).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..context import PROCESS
from ..errors import SpmdsimError
from .wait import polite_wait

__all__ = ["Engine", "MpiEngine", "MPI", "engine_of", "SimulationError"]


class SimulationError(SpmdsimError):
    """A failure of the simulation itself (a rank called Abort, a bad use of simulate)."""


class Engine:
    """What a mesh runs on. Subclasses: MpiEngine; spmdsim.sim's ThreadEngine and DryEngine."""

    name = "engine"
    simulated = False  # ranks are threads of this process, not MPI processes
    dry = False  # shapes only: no values are computed or moved

    def group(self, mesh: Any, axes: tuple[str, ...]) -> tuple[Any, int, int]:
        """(communicator, size, this rank's index) of `mesh`'s group over `axes`: a collective Split."""
        color, key = mesh.layout.split_color_key(mesh.rank, axes)
        sub = mesh.comm.Split(color, key)
        return sub, sub.Get_size(), sub.Get_rank()

    def collective(self, calls: Any, blocking: str, nonblocking: str, args: tuple, polite: bool) -> None:
        """Run one collective: `calls`'s buffer call named `blocking` (mpi4py's, "Allreduce", on the
        group's communicator) with `args`; `polite` (ranks outnumber cores): its nonblocking twin
        (`nonblocking`, "Iallreduce") waited for without holding a core (engines/wait.py)."""
        if polite:
            polite_wait(getattr(calls, nonblocking)(*args))
        else:
            getattr(calls, blocking)(*args)

    def local(self, fn: Callable[..., Any], like: Any, *args: Any) -> Any:
        """``fn(*args)``: a local kernel whose result is shaped and typed like `like`."""
        return fn(*args)

    def matmul(self, a: Any, b: Any) -> Any:
        return np.matmul(a, b)

    def ran(self, step: Any) -> None:
        """A step whose bytes differ by rank (an Exchange) ran here: the dry engine counts each rank's."""

    def __repr__(self) -> str:
        return f"<spmdsim engine {self.name!r}>"


class MpiEngine(Engine):
    """Ranks are MPI processes; a group is an mpi4py sub-communicator."""

    name = "mpi"


MPI = MpiEngine()
PROCESS.engine = MPI


def engine_of(comm: Any) -> Engine:
    """The engine a communicator belongs to: its ``spmdsim_engine``, else (an mpi4py one) MPI."""
    return getattr(comm, "spmdsim_engine", MPI)
