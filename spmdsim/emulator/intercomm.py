"""Intercommunicators on simulated ranks: mpi4py's ``MPI.Intercomm`` (docs/reference/emulator.md).

    inter = local.Create_intercomm(0, MPI.COMM_WORLD, remote_leader, tag)   # or Intercomm.Create_from_groups
    inter.send(obj, dest=r)          # r: a rank of the remote group
    inter.Bcast(buf, root=MPI.ROOT)  # the root's group sends, the other receives (root: the remote root's rank)
    inter.Merge(high)                # an intracommunicator of both groups, the low group first

An intercommunicator joins a local group and a remote group. It is made of private communicators of the
simulated world: messages to the remote group travel on one of the local then the remote members (the
sender is there its local rank, a destination its remote rank after the local group), messages from it on
one of the remote then the local members, so that a receive's source, a probe's and a status's are the
remote group's ranks as they are. The collectives (spmdsim.emulator.intercomm_collectives) run on a
private copy of the local group and a third communicator of both groups, the low group first (the group
of the leader of lower world rank, unless Merge's `high` says otherwise). Calls of an intracommunicator
that are not simulated here are refused in one line (NotImplementedError).
"""
from __future__ import annotations

from typing import Any

from ..base import context as _local_context
from ..runtime.sim._mpi import c_int, mpi_module, special, named_error as _error
from ..runtime.sim.waiting import ranks_text
from .comm import SimComm, world_of
from .comm_errors import end_on_fatal_errors
from .group import SimGroup, _sim as _sim_group, speak_mpi4py
from .intercomm_collectives import IntercommCollectives
from .real import comm_null
from .ports import accept, connect, join
from .spawn import spawn, spawn_multiple
from .unsupported import not_simulated

__all__ = ["SimIntercomm", "create_intercomm"]


def _private(members: tuple, kind: str, label: str) -> SimComm:
    """This rank's member of the private communicator of world ranks `members` (in that order), made by every
    member without waiting (as Create_group), `kind` keeping apart the ones of the same members; a report
    names it `label`."""
    state = _local_context.simulated()
    group = SimGroup(members, state.rank, object())
    comm = world_of(state)._create_group("Create_intercomm", group, ("intercomm", kind))
    comm._group.made = label  # (every member writes the same)
    return comm


class SimIntercomm(IntercommCollectives, SimComm):
    """One simulated rank's view of one intercommunicator. ``SimIntercomm()`` is null (== MPI.COMM_NULL)."""

    def __init__(self, comm: Any = None) -> None:
        if isinstance(comm, SimIntercomm):  # MPI.Intercomm(inter): a copy, one handle
            self.__dict__.update(comm.__dict__)
            return
        if comm is not None:
            mpi = mpi_module()
            if mpi is None or not isinstance(comm, mpi.__dict__["Comm"]) or isinstance(comm, SimComm) \
                    or comm != mpi.COMM_NULL:
                raise TypeError("expecting an intercommunicator")  # mpi4py's words
        SimComm.__init__(self)
        self._local = self._out = self._in = self._union = None
        self._remote, self._low = (), True

    @classmethod
    def _made(cls, parts: tuple, remote: tuple, low: bool) -> "SimIntercomm":
        """The intercommunicator of the private communicators `parts` (local group, messages out, messages
        in, both groups) with the remote group's world ranks `remote`."""
        new = cls()
        new._local, new._out, new._in, new._union = parts
        SimComm.__init__(new, new._local._group, new._local._me)
        new._remote, new._low = tuple(remote), low
        return new

    @classmethod
    def _spawn(cls, comm: SimComm, multiple: bool, *args: Any) -> "SimIntercomm":
        """Intracomm.Spawn (or Spawn_multiple) of `comm`: the intercommunicator to the children
        (spmdsim.emulator.spawn)."""
        return (spawn_multiple if multiple else spawn)(cls, comm, *args)

    @classmethod
    def _accept(cls, comm: SimComm, *args: Any) -> "SimIntercomm":
        """Intracomm.Accept of `comm` (spmdsim.emulator.ports)."""
        return accept(cls, comm, *args)

    @classmethod
    def _connect(cls, comm: SimComm, *args: Any) -> "SimIntercomm":
        """Intracomm.Connect of `comm` (spmdsim.emulator.ports)."""
        return connect(cls, comm, *args)

    @classmethod
    def _join(cls, fd: int) -> "SimIntercomm":
        """MPI.Comm.Join (spmdsim.emulator.ports)."""
        return join(cls, fd)

    def Is_inter(self) -> bool:
        return True

    def Is_intra(self) -> bool:
        return False

    is_inter = property(Is_inter)
    is_intra = property(Is_intra)

    def Get_remote_size(self) -> int:
        self._live_handle()
        return len(self._remote)

    remote_size = property(Get_remote_size)

    def Get_remote_group(self) -> SimGroup:
        self._live_handle()
        return SimGroup(self._remote, self.world_rank)

    remote_group = property(Get_remote_group)

    def __repr__(self) -> str:
        if self._group is None:
            return "<simulated Intercomm null>"
        return (f"<simulated Intercomm rank {self._me} of {self._group.size}, remote group of "
                f"{len(self._remote)}>")

    # -- point to point: destinations are the remote group's ranks --------------------------------

    def _to(self, dest: Any) -> tuple:
        """A message to the remote group's rank `dest`: on the communicator of the local then the remote
        members."""
        if self._h is None:
            self._live_handle()  # MPI.Exception (ERR_COMM): a null or freed one
        out = self._out
        if type(dest) is not int:
            dest = c_int(dest, "dest")  # as mpi4py converts it (a numpy integer, a float truncated)
        if 0 <= dest < len(self._remote):
            return out._group, out._me, dest + self._group.size
        if dest == special("PROC_NULL"):
            return out._group, out._me, dest
        raise _error("ERR_RANK", f"destination rank {dest!r} is outside the remote group of {len(self._remote)} "
                                 f"ranks (0 to {len(self._remote) - 1}, or MPI.PROC_NULL)")

    def _from(self, source: Any) -> tuple:
        """A receive from the remote group's rank `source`: on the communicator of the remote then the local
        members, where the remote ranks are their own."""
        if self._h is None:
            self._live_handle()
        if type(source) is not int:
            source = c_int(source, "source")
        if source in (special("ANY_SOURCE"), special("PROC_NULL")) or 0 <= source < len(self._remote):
            return self._in._group, self._in._me, source
        raise _error("ERR_RANK", f"source rank {source!r} is outside the remote group of {len(self._remote)} "
                                 f"ranks (0 to {len(self._remote) - 1}, MPI.ANY_SOURCE or MPI.PROC_NULL)")

    # -- communicators -------------------------------------------------------------------------

    def Dup(self, info: Any = None) -> "SimIntercomm":
        self._live_handle()
        local = self._local.Dup()
        first, second = (self._out, self._in) if self._low else (self._in, self._out)
        first, second = first.Dup(), second.Dup()
        out, inn = (first, second) if self._low else (second, first)
        new = type(self)._made((local, out, inn, self._union.Dup()), self._remote, self._low)
        self._inherits(new)
        if self._h.attrs:
            self._copy_attrs(new)
        return new

    Clone = Dup
    Dup_with_info = Dup

    def Merge(self, high: bool = False) -> SimComm:
        """An intracommunicator of both groups: the group that passed `high` False first (a tie: the low group,
        that of the leader of lower world rank)."""
        self._live_handle()
        return self._inherits(self._union._split(0, int(bool(high)), "Merge"))

    def Split(self, color: int = 0, key: int = 0) -> Any:
        """MPI_Comm_split of an intercommunicator: each group splits by `color`, and a part meets the remote
        group's part of the same color (MPI.COMM_NULL where either is empty)."""
        self._live_handle()
        color, key = int(color), int(key)
        mine = (self._low, color, key, self._me, self.world_rank)
        every = self._union.allgather(mine)
        if color == special("UNDEFINED"):
            return comm_null()
        local = tuple(e[4] for e in sorted((e for e in every if e[0] == self._low and e[1] == color),
                                           key=lambda e: (e[2], e[3])))
        remote = tuple(e[4] for e in sorted((e for e in every if e[0] != self._low and e[1] == color),
                                            key=lambda e: (e[2], e[3])))
        if not remote:
            return comm_null()
        return self._inherits(_from_groups(local, remote, self._low, type(self)))

    def Split_type(self, split_type: int, key: int = 0, info: Any = None) -> Any:
        """Every simulated rank shares one node: MPI.COMM_TYPE_SHARED keeps the whole intercommunicator
        (a Split of one color), MPI.UNDEFINED gives MPI.COMM_NULL."""
        shared = int(split_type) == special("COMM_TYPE_SHARED")
        return self.Split(0 if shared else special("UNDEFINED"), key)

    def Compare(self, other: Any) -> int:
        if not isinstance(other, SimIntercomm):
            return SimComm.Compare(self, other) if not isinstance(other, SimComm) else special("UNEQUAL")
        if self._h is other._h:
            return special("IDENT")
        if (self._group.members, self._remote) == (other._group.members, other._remote):
            return special("CONGRUENT")
        if {*self._group.members} == {*other._group.members} and {*self._remote} == {*other._remote}:
            return special("SIMILAR")
        return special("UNEQUAL")

    def Free(self) -> None:
        parts = (self._local, self._out, self._in, self._union)
        SimComm.Free(self)
        for part in parts:
            if part is not None and part._h is not None and not part._h.freed:
                part.Free()

    Disconnect = Free

    @classmethod
    def Create_from_groups(cls, local_group: Any, local_leader: int, remote_group: Any, remote_leader: int,
                           stringtag: str = "org.mpi4py", info: Any = None, errhandler: Any = None) -> Any:
        """MPI 4.0's MPI_Intercomm_create_from_groups: the groups' members make it without a parent."""
        local = tuple(_sim_group(local_group)._live()._members)
        remote = tuple(_sim_group(remote_group)._live()._members)
        _disjoint(local, remote)
        low = local[int(local_leader)] < remote[int(remote_leader)]
        new = _from_groups(local, remote, low, cls)
        if errhandler is not None:
            new.Set_errhandler(errhandler)
        return new


def _refused(name: str) -> Any:
    def call(self: SimIntercomm, *args: Any, **kwargs: Any) -> Any:
        self._live_handle()  # MPI.Exception (ERR_COMM) on a null one
        raise not_simulated(f"Intercomm.{name}")
    call.__name__ = name
    return call


#: An intracommunicator's calls that a simulated intercommunicator refuses (not simulated, or not MPI's).
_REFUSED = ("Reduce_scatter", "Reduce_scatter_block",
            "Scan", "Exscan", "scan", "exscan", "Iallreduce", "Ireduce", "Iscan", "Iexscan", "Ireduce_scatter_block",
            "Ireduce_scatter", "Iallgather", "Iallgatherv", "Igather", "Igatherv", "Iscatter", "Iscatterv",
            "Ialltoall", "Ialltoallv", "Ialltoallw", "Ibcast", "Idup",
            "Idup_with_info", "Create", "Create_group", "Create_cart", "Create_graph", "Create_dist_graph",
            "Create_dist_graph_adjacent", "Cart_map", "Graph_map", "Create_intercomm", "Barrier_init", "Bcast_init",
            "Allreduce_init", "Allgather_init", "Alltoall_init", "Gather_init", "Scatter_init", "Reduce_init",
            "Psend_init", "Precv_init", "Spawn", "Spawn_multiple", "Accept", "Connect")
for _name in _REFUSED:
    if hasattr(SimComm, _name):
        setattr(SimIntercomm, _name, _refused(_name))
del _name

speak_mpi4py(SimIntercomm, "Intercomm")
end_on_fatal_errors(SimIntercomm)


def _disjoint(local: tuple, remote: tuple) -> None:
    both = sorted(set(local) & set(remote))
    if both:
        raise _error("ERR_GROUP", f"Create_intercomm: world {ranks_text(both)} {'is' if len(both) == 1 else 'are'} "
                                  f"in both the local group (world {ranks_text(local)}) and the remote group (world "
                                  f"{ranks_text(remote)}): an intercommunicator's groups are disjoint")


def _from_groups(local: tuple, remote: tuple, low: bool, cls: type = SimIntercomm) -> SimIntercomm:
    """The intercommunicator of local group `local` and remote group `remote` (world ranks), every member making
    the same private communicators in the same order (the low group's members first in both groups')."""
    first, second = (local, remote) if low else (remote, local)
    text = f"the intercommunicator of {ranks_text(first)} and {ranks_text(second)}"
    parts = (_private(local, "local", f"{text} (its group of {ranks_text(local)})"),
             _private(first + second, "messages", f"{text} (its messages from {ranks_text(first)})"),
             _private(second + first, "messages", f"{text} (its messages from {ranks_text(second)})"))
    out, inn = parts[1:] if low else parts[:0:-1]
    return cls._made((parts[0], out, inn, _private(first + second, "collectives", text)), remote, low)


def create_intercomm(comm: SimComm, local_leader: int, peer_comm: Any, remote_leader: int, tag: int = 0) -> Any:
    """Intracomm.Create_intercomm: the local leader swaps its group's world ranks with the remote leader over
    `peer_comm` (with `tag`), then broadcasts them over `comm`, as MPI's leaders do."""
    comm._live_handle()
    local_leader = comm._root(local_leader, "Create_intercomm local_leader")
    local = tuple(comm._group.members)
    got = None
    if comm._me == local_leader:
        got = peer_comm.sendrecv((local, local_leader), remote_leader, tag, None, remote_leader, tag)
    remote, their_leader = comm.bcast(got, local_leader)
    _disjoint(local, remote)
    return comm._inherits(_from_groups(local, tuple(remote), local[local_leader] < remote[their_leader]))


SimIntercomm._create = staticmethod(create_intercomm)  # what Intracomm.Create_intercomm calls (comm_lifetime)
