"""SimComm: mpi4py's Intracomm for simulated ranks in one process (collectives, p2p, communicators).

Each simulated rank holds its own SimComm per communicator (they share an
engine `Group`); copies made with ``MPI.Comm(comm)`` share one handle (its call
counter, name, freed state), as mpi4py's copies share one MPI handle (spmdsim.emulator.comm_identity, with
the identity queries; its end and the calls not simulated in spmdsim.emulator.comm_lifetime). The
collectives are in spmdsim.emulator.collectives and spmdsim.emulator.objects, the
point-to-point calls in spmdsim.runtime.sim.p2p, persistent requests in spmdsim.emulator.persistent, partitioned
ones in spmdsim.emulator.partitioned, Cartesian
grids in spmdsim.emulator.topology, graphs and distributed graphs in spmdsim.emulator.graphs, their neighbour
collectives in spmdsim.emulator.neighbours; windows (one-sided communication) over
a communicator in spmdsim.emulator.window, files (MPI I/O) in spmdsim.emulator.file, intercommunicators in
spmdsim.emulator.intercomm.
"""
from __future__ import annotations

from typing import Any

from ..base import context as _local
from ..runtime.sim._mpi import mpi_error, mpi_module, special
from .collectives import BufferCollectives
from .comm_identity import CommIdentity, _Handle
from .comm_lifetime import CommLifetime
from .nonblocking import _kept, landed_freed, posting
from ..runtime.sim.engine import SimulationError
from ..runtime.sim.groups import Call, Group
from ..runtime.sim import bodies
from ..runtime.sim.thread_engine import THREADS, Member, _freed
from .graphs import (DistGraphCalls, GraphCalls, create_dist_graph, create_dist_graph_adjacent, create_graph,
                     graph_map)
from .group import SimGroup, _sim as _sim_group, speak_mpi4py
from .comm_errors import end_on_fatal_errors
from .handles import CommHandles, initial_errhandler
from .neighbours import Neighbourhood
from .objects import ObjectCollectives
from .p2p import PointToPoint
from .partitioned import PartitionedCalls
from .persistent import PersistentCalls
from .real import comm_null
from .topology import CartCalls, cart_map, create_cart
from ..runtime.sim.requests import completed, noted
from ..runtime.sim.waiting import ranks_text
from ..runtime.mpi_library import SIMULATE_INSTEAD, load_mpi

__all__ = ["SimComm", "SimTopoComm", "SimCartComm", "SimGraphComm", "SimDistGraphComm", "self_comm",
           "comm_null", "world", "world_of"]


class SimComm(CommIdentity, CommLifetime, Member, PointToPoint, BufferCollectives, ObjectCollectives, CommHandles,
              PersistentCalls, PartitionedCalls):
    """One simulated rank's view of one communicator (made by spmdsim.simulate, Split, Dup, Create).

    ``SimComm()`` is a null communicator (equal to MPI.COMM_NULL); ``SimComm(comm)`` a copy.
    """

    spmdsim_engine = THREADS  # what a Mesh over it runs on (spmdsim.runtime.engines.engine_of)

    def __new__(cls, *args: Any, **kwargs: Any) -> "SimComm":
        return object.__new__(cls)  # MPI.Comm.__new__(cls, comm), as mpi4py.util.pkl5's Comm calls it

    def __init__(self, group: Any = None, me: int = 0, name: str = "") -> None:
        if isinstance(group, SimComm):
            if group.Is_inter() and not self.Is_inter():
                raise TypeError("expecting an intracommunicator")  # mpi4py's words
            self._group, self._me, self._h = group._group, group._me, group._h
            return
        if group is not None and not isinstance(group, Group):
            mpi = mpi_module()
            if mpi is None or not isinstance(group, mpi.__dict__["Comm"]) or group != mpi.COMM_NULL:
                raise TypeError(f"expected a communicator, got {type(group).__name__}")
            group = None
        self._group = group
        self._me = me
        self._h = _Handle(name) if group is not None else None

    @classmethod
    def of(cls, member: Member, name: str) -> "SimComm":
        """The emulator's view of the thread engine's `member`: one communicator, one call counter."""
        comm = cls(member._group, member._me, name)
        comm._h = _Handle(name, member._h)
        return comm

    @property
    def _seq(self) -> int:
        return self._h.seq

    def _enter_all(self, op: str, signature: tuple, data: Any, finish: tuple, complete: Any = None) -> Any:
        req = posting()
        if req is None:
            return Member._enter_all(self, op, signature, data, finish, complete)
        return self._post(req, signature, data, finish)

    def _enter(self, op: str, signature: tuple, data: Any = None, complete: Any = None) -> Any:
        req = posting() if op == "barrier" else None  # Ibarrier (an object collective inside a post waits)
        if req is None:
            return Member._enter(self, op, signature, data, complete)
        return self._post(req, signature, data, ())

    def _post(self, req: Any, signature: tuple, data: Any, finish: tuple) -> Any:
        """Deposit this member's call of the nonblocking collective `req` is the request of, without waiting
        (engine.Group.post): named as the program called it (Iallreduce), which a blocking call does not match."""
        h = self._h
        if h is None or h.freed:
            raise _freed(self, req.kind)
        h.seq += 1
        call = Call(req.kind, (req.kind, *signature[1:]), _kept(data), None, finish)
        call.request, req.deposited, req.number = req, call, h.seq
        req.slot = slot = self._group.post(self._me, h.seq, call)
        if req.done:  # posted last: requests freed meanwhile complete now
            landed_freed(slot)
        return slot

    def __bool__(self) -> bool:  # a copy of a communicator freed through another handle stays true, as MPICH's
        return self._h is not None

    def __reduce__(self) -> Any:
        if not self:
            return (SimComm, ())
        state = _local.simulated()
        for kind in ("world", "self"):
            canonical = None if state is None else (world_of(state) if kind == "world" else self_comm(state))
            if canonical is not None and self._h is canonical._h:
                return (_predefined, (kind, self is canonical))
        raise ValueError(f"cannot serialize {self!r}")

    def __repr__(self) -> str:
        if self._group is None:
            return "<simulated Intracomm null>"
        return f"<simulated Intracomm rank {self._me} of {self._group.size} ({self._group.label()})>"

    # -- communicators --------------------------------------------------------------------

    def Barrier(self) -> None:
        bodies.barrier(self)

    def Split(self, color: int = 0, key: int = 0) -> "SimComm":
        """Members with equal `color` form a new communicator, ordered by (key, rank here)."""
        return self._split(color, key, "Split")

    def _split(self, color: int, key: int, call: str) -> "SimComm":
        """`Split` for `call` (Split, Create, Create_cart, ...): a new communicator of every rank of the world in
        its order is named for the call ('a Split of the world', as a Dup is 'a Dup of the world'), not as the
        world, which it is not (messages on one do not match messages on the other)."""
        self._live_handle()
        new = bodies.split(self, color, key, special("UNDEFINED"))
        if new is None:
            return comm_null()
        if new.made is None and new.members == tuple(range(new.world.size)):  # else its ranks name it
            new.made = f"a {call} of {self._group.label()}"
        return self._inherits(SimComm(new, new.members.index(self.world_rank)))

    def _inherits(self, new: "SimComm") -> "SimComm":
        """`new` with the error handler mpi4py gives a new communicator (spmdsim.emulator.handles)."""
        new._h.errhandler = initial_errhandler(self._h)
        return new

    def Split_type(self, split_type: int, key: int = 0, info: Any = None) -> Any:
        """All simulated ranks share one node and one process: MPI.COMM_TYPE_SHARED, and the guided
        types asking for "mpi_shared_memory", give one communicator of all members; the other guided
        requests, MPI.COMM_TYPE_HW_UNGUIDED (no smaller hardware domain is modelled) and
        MPI.UNDEFINED give MPI.COMM_NULL."""
        split_type = int(split_type)
        undefined = special("UNDEFINED")
        mpi = mpi_module()
        color = undefined
        if split_type == special("COMM_TYPE_SHARED"):
            color = 0
        elif mpi is not None and split_type in (getattr(mpi, "COMM_TYPE_HW_GUIDED", None),
                                                getattr(mpi, "COMM_TYPE_RESOURCE_GUIDED", None)):
            asked = None if info is None or info == mpi.INFO_NULL else info.Get("mpi_hw_resource_type")
            color = 0 if asked == "mpi_shared_memory" else undefined
        elif split_type != undefined and (mpi is None or split_type != getattr(mpi, "COMM_TYPE_HW_UNGUIDED", None)):
            if mpi is not None:
                raise mpi.Exception(mpi.ERR_ARG)
            raise ValueError(f"Split_type: split type {split_type!r} is not an MPI.COMM_TYPE_*")
        return self._split(color, key, "Split_type")

    def Dup(self, info: Any = None) -> "SimComm":
        group = self._group

        def made(slot: Any) -> None:  # named so in a report ('an Isend ... on a Dup of the world')
            slot.shared = Group(group.world, group.members, f"a Dup of {group.label()}")

        slot = self._enter("dup", ("dup",), None, made)
        new = object.__new__(type(self))  # mpi4py's Dup gives the caller's class (pkl5.Intracomm, ...)
        SimComm.__init__(new, slot.shared, self._me)
        for name in self.TOPOLOGY_STATE:  # a Cartcomm's Dup, Dup_with_info, Idup: a Cartcomm of the same grid
            setattr(new, name, getattr(self, name))
        self._inherits(new)
        if info is not None and mpi_module() is not None and info != mpi_module().INFO_NULL:
            new.Set_info(info)
        if self._h.attrs:
            self._copy_attrs(new)
        return new

    Clone = Dup
    Dup_with_info = Dup

    def Idup(self, info: Any = None) -> tuple:
        return self.Dup(info), noted(completed(), "Idup", self._group, self._me)  # a warning if never completed

    Idup_with_info = Idup

    def Create(self, group: SimGroup) -> "SimComm":
        """Members of `group` (a subset of this communicator's) form a new one, in the group's order. As in MPI
        since 2.2, ranks may pass disjoint groups: each group is a communicator of its own (one Split, colored
        by the group's first world rank); a rank outside the group it passes gets MPI.COMM_NULL."""
        self._live_handle()
        members = tuple(_sim_group(group)._live()._members)
        self._subset("Create", members)
        mine = self.world_rank
        new = self._split(min(members) if mine in members else special("UNDEFINED"),
                          members.index(mine) if mine in members else 0, "Create")
        if isinstance(new, SimComm) and new._group.members != members:
            text = (f"Create: rank {mine} passed the group of world ranks {list(members)}, which overlaps a group "
                    f"another rank passed and differs from it (together they make {list(new._group.members)}): "
                    f"MPI_Comm_create takes the same group on every member, or disjoint groups")
            mpi = mpi_module()
            raise mpi_error(mpi, mpi.ERR_GROUP, text) if mpi is not None else SimulationError(text)
        return new

    def _subset(self, call: str, members: tuple) -> None:
        """MPI's error (MPI.ERR_GROUP) for a group with ranks outside this communicator."""
        outside = sorted(set(members) - set(self._group.members))
        if outside:
            are = "is" if len(outside) == 1 else "are"
            text = (f"{call}: the group holds world {ranks_text(outside)}, which {are} "
                    f"not in this communicator ({self._group.label()}): a new communicator's group is a subset of "
                    "its parent's")
            mpi = mpi_module()
            raise mpi_error(mpi, mpi.ERR_GROUP, text) if mpi is not None else SimulationError(text)

    def Create_group(self, group: SimGroup, tag: int = 0) -> "SimComm":
        """Like Create, but called by the members of `group` only (MPI_Comm_create_group)."""
        return self._create_group("Create_group", group, int(tag))

    @classmethod
    def Create_from_group(cls, group: SimGroup, stringtag: str = "org.mpi4py", info: Any = None,
                          errhandler: Any = None) -> "SimComm":
        """MPI 4.0's MPI_Comm_create_from_group: the members of `group` (world ranks) make a communicator,
        called by them alone, as Create_group on the world; `stringtag` keeps concurrent calls apart."""
        state = _local.simulated()
        if state is None:
            raise SimulationError("Intracomm.Create_from_group: not on a simulated rank")
        new = world_of(state)._create_group("Create_from_group", group, ("stringtag", str(stringtag)))
        if new and errhandler is not None:
            new.Set_errhandler(errhandler)
        if new and info is not None:
            new.Set_info(info)
        return new

    def _create_group(self, call: str, group: SimGroup, tag: Any) -> "SimComm":
        """Create_group's body (`call`: the program's call; `tag`: what keeps concurrent calls apart)."""
        self._live_handle()
        members = tuple(_sim_group(group)._live()._members)
        self._subset(call, members)
        mine = self.world_rank
        if mine not in members:
            return comm_null()
        world = self._group.world
        key = (members, tag)
        n = self._h.creates.get(key, 0)
        self._h.creates[key] = n + 1
        with world.lock:  # the first member to come makes the shared group; the last forgets it
            table = world.__dict__.setdefault("subgroups", {})
            entry = table.get((id(self._group), key, n))
            if entry is None:  # every rank of the world in its order: named for the call, as Split's (`_split`)
                made = f"a {call} of {self._group.label()}" if members == tuple(range(world.size)) else None
                entry = table[(id(self._group), key, n)] = [Group(world, members, made), 0]
            entry[1] += 1
            if entry[1] == len(members):
                del table[(id(self._group), key, n)]
        return self._inherits(SimComm(entry[0], members.index(mine)))

    def Create_cart(self, dims: Any, periods: Any = None, reorder: bool = False) -> Any:
        """A Cartesian grid of the first prod(dims) members (spmdsim.emulator.topology)."""
        return create_cart(self, SimCartComm, dims, periods, reorder)

    def Cart_map(self, dims: Any, periods: Any = None) -> int:
        """This rank's rank in the grid Create_cart(dims, periods) would make (MPI.UNDEFINED if none)."""
        return cart_map(self, dims, periods)

    def Create_graph(self, index: Any, edges: Any, reorder: bool = False) -> Any:
        """A general graph of the first len(index) members (spmdsim.emulator.graphs)."""
        return create_graph(self, SimGraphComm, index, edges, reorder)

    def Graph_map(self, index: Any, edges: Any) -> int:
        """This rank's rank in the graph Create_graph(index, edges) would make (MPI.UNDEFINED if none)."""
        return graph_map(self, index, edges)

    def Create_dist_graph_adjacent(self, sources: Any, destinations: Any, sourceweights: Any = None,
                                   destweights: Any = None, info: Any = None, reorder: bool = False) -> Any:
        """A distributed graph of every member's sources and destinations (spmdsim.emulator.graphs)."""
        return create_dist_graph_adjacent(self, SimDistGraphComm, sources, destinations, sourceweights, destweights,
                                          info, reorder)

    def Create_dist_graph(self, sources: Any, degrees: Any, destinations: Any, weights: Any = None,
                          info: Any = None, reorder: bool = False) -> Any:
        """A distributed graph of the edges every member gives (spmdsim.emulator.graphs)."""
        return create_dist_graph(self, SimDistGraphComm, sources, degrees, destinations, weights, info, reorder)

    is_topo = False

    def Compare(self, other: "SimComm") -> int:
        """MPI.IDENT (the same communicator), CONGRUENT (same ranks, same order), SIMILAR or UNEQUAL."""
        self, other = _resolve(self), _resolve(other)  # MPI.Comm.Compare(MPI.COMM_NULL, ...) too
        if not self or not other:
            self._live_handle(), other._live_handle()  # MPI.Exception (ERR_COMM) for the null one
        if self._h is other._h:
            return special("IDENT")
        if self._group.members == other._group.members:
            return special("CONGRUENT")
        if set(self._group.members) == set(other._group.members):
            return special("SIMILAR")
        return special("UNEQUAL")


speak_mpi4py(SimComm, "Intracomm")
end_on_fatal_errors(SimComm)


class SimTopoComm(Neighbourhood, SimComm):
    """mpi4py's Topocomm for simulated ranks: a communicator with the neighbour collectives
    (spmdsim.emulator.neighbours.Neighbourhood)."""


class SimCartComm(CartCalls, SimTopoComm):
    """mpi4py's Cartcomm for simulated ranks (spmdsim.emulator.topology.CartCalls)."""


class SimGraphComm(GraphCalls, SimTopoComm):
    """mpi4py's Graphcomm for simulated ranks (spmdsim.emulator.graphs.GraphCalls)."""


class SimDistGraphComm(DistGraphCalls, SimTopoComm):
    """mpi4py's Distgraphcomm for simulated ranks (spmdsim.emulator.graphs.DistGraphCalls)."""


speak_mpi4py(SimTopoComm, "Topocomm")
for _cls, _name in ((SimCartComm, "Cartcomm"), (SimGraphComm, "Graphcomm"), (SimDistGraphComm, "Distgraphcomm")):
    speak_mpi4py(_cls, _name)
    end_on_fatal_errors(_cls)
del _cls, _name


def _resolve(comm: Any) -> SimComm:
    if isinstance(comm, SimComm):
        return comm
    mpi = mpi_module()
    if mpi is not None and isinstance(comm, mpi.__dict__["Comm"]) and comm == mpi.COMM_NULL:
        return SimComm()
    raise TypeError(f"expected a simulated communicator, got {comm!r}")


def world_of(state: Any) -> SimComm:
    """The simulated rank's MPI.COMM_WORLD: its world group (`state.comm`, what the runtime's meshes
    split) with mpi4py's methods, made on first use."""
    comm = state.world_comm
    if comm is None:
        comm = state.world_comm = SimComm.of(state.comm, "MPI_COMM_WORLD")
        comm._h.predefined = True
        comm._h.errhandler = initial_errhandler()
    return comm


def world() -> Any:
    """The running rank's world communicator, with mpi4py's methods: a simulated rank's (spmdsim.simulate),
    a dry run's `DryComm`, else mpi4py's ``MPI.COMM_WORLD``."""
    state = _local.simulated()
    if state is None:
        return load_mpi(SIMULATE_INSTEAD).COMM_WORLD
    if state.engine is not THREADS:  # a dry run's world
        return state.comm
    return world_of(state)


def self_comm(state: Any) -> SimComm:
    """The simulated rank's MPI.COMM_SELF (made on first use)."""
    comm = state.self_comm
    if comm is None:
        world = state.comm._group.world
        comm = state.self_comm = SimComm(Group(world, (state.rank,)), 0, "MPI_COMM_SELF")
        comm._h.predefined = True
        comm._h.errhandler = initial_errhandler()
    return comm


def _predefined(kind: str, same: bool) -> SimComm:
    state = _local.simulated()
    canonical = world_of(state) if kind == "world" else self_comm(state)
    return canonical if same else SimComm(canonical)
