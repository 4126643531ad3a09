"""What a simulated communicator says about itself: its shared handle, rank, size, name, info, group.

`_Handle` is what copies of one communicator (``MPI.Comm(comm)``) share, as
mpi4py's copies share one MPI handle; `CommIdentity` is SimComm's mixin of
mpi4py's queries of it (Get_rank, Get_size, Get_name, Get_info, Get_group,
Get_topology, Is_inter, ...), first among SimComm's bases.
"""
from __future__ import annotations

from typing import Any

from ..runtime.sim._mpi import mpi_module, special
from ..runtime.sim.thread_engine import Count
from .group import SimGroup

__all__ = ["CommIdentity"]


class _Handle:
    """What copies of one communicator share: the thread engine's call counter (`count`, shared with
    the runtime's view of the same communicator), name, info, state."""

    __slots__ = ("count", "name", "info", "buffer", "creates", "group", "predefined", "errhandler", "attrs",
                 "private")

    # The rendezvous number and the freed flag are the shared counter's.
    seq = property(lambda h: h.count.seq, lambda h, v: setattr(h.count, "seq", v))
    freed = property(lambda h: h.count.freed, lambda h, v: setattr(h.count, "freed", v))

    def __init__(self, name: str = "", count: Any = None) -> None:
        self.count = Count() if count is None else count
        self.name = name
        self.info: Any = None
        self.buffer: Any = None
        self.creates: dict = {}  # (members, tag) -> Create_group calls made
        self.group: Any = None  # the handle of its group: Get_group gives the same one each time, as MPICH
        self.predefined = False  # MPI.COMM_WORLD's and MPI.COMM_SELF's: never freed
        self.errhandler: Any = None  # None: MPI.ERRORS_RETURN (spmdsim.emulator.handles)
        self.attrs: dict = {}  # keyval -> value (Set_attr)
        self.private: dict = {}  # mpi4py's hidden per-communicator state (spmdsim.emulator.pkl5)


class CommIdentity:
    """A communicator's identity queries (a mixin of SimComm, ahead of the thread engine's Member)."""

    # -- identity -------------------------------------------------------------------------

    def Get_rank(self) -> int:
        return self._me

    def Get_size(self) -> int:
        return self._group.size

    rank = property(Get_rank)
    size = property(Get_size)

    @property
    def world_rank(self) -> int:
        """This rank's number in the simulated world."""
        return self._group.members[self._me]

    def Is_inter(self) -> bool:
        return False

    def Is_intra(self) -> bool:
        return True

    #: MPI.<TOPOLOGY> of this kind of communicator, and the attributes that hold its topology: a Dup copies
    #: them, and ``MPI.Comm.Get_topology(cart)`` reads them, as mpi4py's base classes query the handle.
    TOPOLOGY, TOPOLOGY_STATE = "UNDEFINED", ()

    def Get_topology(self) -> int:
        return special(self.TOPOLOGY)

    topology = property(Get_topology)
    is_inter = property(Is_inter)
    is_intra = property(Is_intra)

    def Get_name(self) -> str:
        return "MPI_COMM_NULL" if self._h is None else self._h.name

    def Set_name(self, name: str) -> None:
        self._h.name = str(name)

    name = property(Get_name, Set_name)

    def Get_info(self) -> Any:
        return self._h.info.Dup() if self._h.info is not None else mpi_module().Info.Create()

    def Set_info(self, info: Any) -> None:
        self._h.info = info.Dup() if info is not None and info != mpi_module().INFO_NULL else None

    info = property(Get_info, Set_info)

    def Get_group(self) -> SimGroup:
        h = self._h
        if h.group is None:
            h.group = object()
        return SimGroup(self._group.members, self.world_rank, h.group)

    group = property(Get_group)
