"""Topology communicators of simulated ranks: Cartesian grids, general graphs and distributed graphs.

``comm.Create_cart(dims, periods)`` (a first MPI lab's grids: a 2-D heat
equation, a ring with ``Shift``), ``comm.Create_graph(index, edges)`` and
``comm.Create_dist_graph_adjacent(sources, destinations)`` /
``comm.Create_dist_graph(sources, degrees, destinations)``, with their queries
and neighbour collectives (Neighbor_allgather(v), Neighbor_alltoall(v/w), their
nonblocking and persistent forms and the pickled neighbor_allgather / neighbor_alltoall).
Members keep their rank order (``reorder`` is ignored: every simulated rank is
on one node). A Cartesian grid is row-major (the last dimension varies fastest,
MPI's order); its 2 x ndim neighbours are, per dimension, the one back
(``Shift(d, 1)[0]``) then the one forward, and the block received from the one
back is what it sent forward, and the other way round (so a periodic dimension
of 1 or 2 ranks, where both are the same rank, is well defined); a missing
neighbour (MPI.PROC_NULL, past a non-periodic edge) is sent nothing and its
receive block is left as it was. A graph's neighbours are its
``Get_neighbors(rank)``, sources and destinations alike; a distributed graph's
are its sources (received from, in order) and destinations (sent to, in order),
an edge given by several ranks in ``Create_dist_graph`` ordered by the rank that
gave it. Between two ranks joined by several edges, the k-th time a rank lists
a source receives what that source sent the k-th time it lists the rank as a
destination (the MPI standard's rule for multigraphs); a graph where a source
does not list the rank as often is refused when the collective runs.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from ..runtime.sim._buffers import c_int, copy_into, dtype_name, int_array, mpi_error, mpi_module, special
from .typemap import message, vector
from .real import comm_null
from .derived import wmessage
from .persistent import _persistent
from .._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["Neighbourhood", "CartCalls", "GraphCalls", "DistGraphCalls", "create_cart", "create_graph",
           "create_dist_graph", "create_dist_graph_adjacent", "cart_map", "graph_map"]


def _error(code: str, text: str) -> BaseException:
    """MPI.Exception(MPI.<code>) as MPICH raises it, or a ValueError without mpi4py."""
    mpi = mpi_module()
    return mpi.Exception(getattr(mpi, code)) if mpi is not None else ValueError(text)


def _detailed(code: str, text: str) -> BaseException:
    """MPI.Exception(MPI.<code>) whose text goes on with `text`, or a ValueError without mpi4py."""
    mpi = mpi_module()
    return mpi_error(mpi, getattr(mpi, code), text) if mpi is not None else ValueError(text)


def create_cart(comm: Any, cls: type, dims: Sequence[int], periods: Optional[Sequence[Any]] = None,
                reorder: bool = False) -> Any:
    """MPI_Cart_create: the first prod(dims) members form a grid (a `cls`); the others get MPI.COMM_NULL."""
    dims, periods = _grid(dims, periods)
    if any(d <= 0 for d in dims) or math.prod(dims) > comm.size:
        raise _error("ERR_ARG", f"Create_cart: dims {list(dims)!r} (periods {list(periods)!r}) do not fit "
                                f"a communicator of {comm.size} ranks")
    inside = comm.rank < math.prod(dims)
    sub = comm._split(0 if inside else special("UNDEFINED"), comm.rank, "Create_cart")
    if not inside:
        return comm_null()
    return cls(sub, dims, periods)


def _grid(dims: Sequence[int], periods: Any) -> tuple:
    """(dims, periods) as tuples of ints, each read as mpi4py reads an array (operator.index: a float is its
    TypeError); `periods` None (none), one bool for every dimension, or one each (mpi4py's ValueError for
    another count)."""
    dims = tuple(int_array(dims))
    if periods is None or isinstance(periods, bool):
        return dims, (int(bool(periods)),) * len(dims)
    return dims, tuple(int_array(periods, len(dims)))


def cart_map(comm: Any, dims: Sequence[int], periods: Any = None) -> int:
    """MPI_Cart_map: this rank's place in the grid Create_cart would make (ranks keep their order), or
    MPI.UNDEFINED for a rank left out."""
    dims, _ = _grid(dims, periods)
    if any(d <= 0 for d in dims) or math.prod(dims) > comm.size:
        raise _error("ERR_ARG", f"Cart_map: dims {list(dims)!r} do not fit a communicator of {comm.size} ranks")
    return comm.rank if comm.rank < math.prod(dims) else special("UNDEFINED")


class Neighbourhood:
    """The neighbour collectives of a topology communicator (mpi4py's Topocomm, spmdsim.emulator.comm's
    SimTopoComm: this mixin over SimComm): over `_inout()`, the
    sources this rank receives from and the destinations it sends to, in order (group ranks, or
    MPI.PROC_NULL), and `_sent_index`, which of a source's destination blocks is this rank's."""

    is_topo = True

    def __new__(cls, comm: Any = None, *args: Any, **kwargs: Any) -> Any:
        """``MPI.Topocomm(comm)``: a copy of the topology communicator `comm` of its own kind (a Cartcomm's
        copy knows its grid); a communicator without a topology is mpi4py's TypeError."""
        if cls.TOPOLOGY == "UNDEFINED" and comm is not None:  # MPI.Topocomm(comm), not a kind's own class
            _copyable(comm, Neighbourhood, "a topology")
            return object.__new__(type(comm))
        return object.__new__(cls)

    def _inout(self) -> tuple[list, list]:  # pragma: no cover - each topology defines its own
        raise NotImplementedError

    def _sent_index(self, i: int, source: int, sources: list, theirs: list) -> int:
        """The position among `source`'s destinations `theirs` of the block this rank receives at its
        position `i` among `sources`: the k-th time this rank lists `source` matches the k-th time
        `source` lists this rank (the module docstring)."""
        k = sources[:i].count(source)
        me = self.rank
        for j, d in enumerate(theirs):
            if d == me:
                if k == 0:
                    return j
                k -= 1
        raise _detailed("ERR_TOPOLOGY", f"group rank {me} receives from group rank {source} "
                                        f"{sources.count(source)} time(s), but group rank {source} sends to it "
                                        f"{theirs.count(me)} time(s): the graph's edges do not match")

    @property
    def degrees(self) -> tuple[int, int]:
        sources, destinations = self._inout()
        return len(sources), len(destinations)

    indegree = property(lambda self: self.degrees[0])
    outdegree = property(lambda self: self.degrees[1])
    inedges = property(lambda self: list(self._inout()[0]))
    outedges = property(lambda self: list(self._inout()[1]))
    inoutedges = property(lambda self: tuple(list(side) for side in self._inout()))

    def _exchange(self, op: str, src: np.ndarray, blocks: Any, dst: np.ndarray, rblocks: list) -> None:
        """Deposit `src` (`blocks(src, j)`: the slice of it for destination j; `src` passed in, so that a
        nonblocking form's kept copy of it is the one read: spmdsim.emulator.nonblocking._kept), then fill each receive block
        rblocks[i] = (start, count) of `dst` from source i's block for this rank: the members meet once,
        the last to arrive filling every member's blocks (Group.enter_all), as the other collectives do."""
        null = special("PROC_NULL")
        sources, destinations = self._inout()
        me = self.rank

        def fill(slot: Any) -> None:  # writes only this member's receive blocks
            for i, nb in enumerate(sources):
                if nb == null:
                    continue
                data, theirs, pick = slot.calls[nb].data
                sent = pick(data, self._sent_index(i, nb, sources, theirs))
                start, count = rblocks[i]
                part = dst[start:start + count]
                if sent.nbytes != part.nbytes:
                    raise _detailed("ERR_TRUNCATE" if sent.nbytes > part.nbytes else "ERR_OTHER",
                                    f"{op}: group rank {nb} sends {sent.size} x {sent.dtype.name} where group "
                                    f"rank {me} receives {part.size} x {part.dtype.name}")
                copy_into(part, sent)

        self._enter_all(op, (op, dtype_name(src.dtype)), (src, destinations, blocks), (fill,))

    def Neighbor_allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        self._via_bytes(self._neighbor_allgather, sendbuf, recvbuf, False, False, self.degrees[::-1])

    def _neighbor_allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        k = self.indegree
        src, n, _ = message(sendbuf, "Neighbor_allgather sendbuf")
        src = src[:n]
        dst, c, _ = message(recvbuf, "Neighbor_allgather recvbuf", blocks=k, readonly=False)
        self._exchange("neighbor_allgather", src, lambda s, j: s, dst, [(i * c, c) for i in range(k)])

    def Neighbor_allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        self._via_bytes(self._neighbor_allgatherv, sendbuf, recvbuf, True, False, self.degrees[::-1])

    def _neighbor_allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        k = self.indegree
        src, n, _ = message(sendbuf, "Neighbor_allgatherv sendbuf")
        src = src[:n]
        dst, counts, displs, _ = vector(recvbuf, "Neighbor_allgatherv recvbuf", k, readonly=False)
        self._exchange("neighbor_allgatherv", src, lambda s, j: s, dst, list(zip(displs, counts)))

    def Neighbor_alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        self._via_bytes(self._neighbor_alltoall, sendbuf, recvbuf, False, True, self.degrees[::-1])

    def _neighbor_alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        kin, kout = self.degrees
        src, n, _ = message(sendbuf, "Neighbor_alltoall sendbuf", blocks=kout)
        dst, c, _ = message(recvbuf, "Neighbor_alltoall recvbuf", blocks=kin, readonly=False)
        self._exchange("neighbor_alltoall", src, lambda s, j: s[j * n:(j + 1) * n], dst,
                       [(i * c, c) for i in range(kin)])

    def Neighbor_alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:
        self._via_bytes(self._neighbor_alltoallv, sendbuf, recvbuf, True, True, self.degrees[::-1])

    def _neighbor_alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:
        kin, kout = self.degrees
        src, scounts, sdispls, _ = vector(sendbuf, "Neighbor_alltoallv sendbuf", kout)
        dst, counts, displs, _ = vector(recvbuf, "Neighbor_alltoallv recvbuf", kin, readonly=False)
        self._exchange("neighbor_alltoallv", src, lambda s, j: s[sdispls[j]:sdispls[j] + scounts[j]], dst,
                       list(zip(displs, counts)))

    def Neighbor_alltoallw(self, sendbuf: Any, recvbuf: Any) -> None:
        """Neighbor_alltoallv with a datatype per block and displacements in bytes: the blocks' bytes move."""
        kin, kout = self.degrees
        dst, rsizes, rdispls, unpack = wmessage(recvbuf, "Neighbor_alltoallw recvbuf", kin, writable=True)
        src, ssizes, sdispls = wmessage(sendbuf, "Neighbor_alltoallw sendbuf", kout, writable=False)[:3]
        self._exchange("neighbor_alltoallw", src, lambda s, j: s[sdispls[j]:sdispls[j] + ssizes[j]], dst,
                       list(zip(rdispls, rsizes)))
        if unpack is not None:
            self._then(unpack)

    def neighbor_allgather(self, sendobj: Any) -> list:
        """Each source's object (None from MPI.PROC_NULL), as mpi4py's pickled neighbour allgather."""
        return self._exchange_objects("neighbor_allgather(obj)", sendobj, lambda j: sendobj)

    def neighbor_alltoall(self, sendobj: Any) -> list:
        """sendobj[j] to destination j; the object each source sent this rank (None from PROC_NULL)."""
        if len(sendobj) != self.outdegree:
            raise ValueError(f"neighbor_alltoall: {len(sendobj)} objects for {self.outdegree} destinations")
        return self._exchange_objects("neighbor_alltoall(obj)", sendobj, lambda j: sendobj[j])

    def _exchange_objects(self, op: str, sendobj: Any, pick: Any) -> list:
        import pickle

        null = special("PROC_NULL")
        sources, destinations = self._inout()
        received: list = []

        def unpickle(slot: Any) -> None:  # each receiver unpickles its own copy, as MPI moves bytes
            for i, nb in enumerate(sources):
                if nb == null:
                    received.append(None)
                    continue
                theirs, chosen = slot.calls[nb].data
                received.append(pickle.loads(pickle.dumps(chosen(self._sent_index(i, nb, sources, theirs)))))

        self._enter_all(op, (op,), (destinations, pick), (unpickle,))
        return received

    # Nonblocking: posted without waiting, run at completion, as the other nonblocking collectives (_posted).
    def Ineighbor_allgather(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Neighbor_allgather, sendbuf, recvbuf)

    def Ineighbor_allgatherv(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Neighbor_allgatherv, sendbuf, recvbuf)

    def Ineighbor_alltoall(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Neighbor_alltoall, sendbuf, recvbuf)

    def Ineighbor_alltoallv(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Neighbor_alltoallv, sendbuf, recvbuf)

    def Ineighbor_alltoallw(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Neighbor_alltoallw, sendbuf, recvbuf)

    # Persistent: each Start runs the nonblocking call (spmdsim.emulator.persistent).
    Neighbor_allgather_init = _persistent("Ineighbor_allgather")
    Neighbor_allgatherv_init = _persistent("Ineighbor_allgatherv")
    Neighbor_alltoall_init = _persistent("Ineighbor_alltoall")
    Neighbor_alltoallv_init = _persistent("Ineighbor_alltoallv")
    Neighbor_alltoallw_init = _persistent("Ineighbor_alltoallw")


def _copyable(comm: Any, cls: type, what: str) -> None:
    """mpi4py's TypeError for ``MPI.Cartcomm(comm)`` (Graphcomm, Distgraphcomm) of a communicator of
    another kind: "expecting a topology communicator" for one without a topology, else naming the kind."""
    if comm is None or isinstance(comm, cls):
        return
    raise TypeError("expecting a topology communicator" if not isinstance(comm, Neighbourhood) else
                    f"expecting {what} communicator")


class CartCalls(Neighbourhood):
    """One simulated rank's view of a Cartesian communicator (mpi4py's Cartcomm; spmdsim.emulator.comm's
    SimCartComm: this mixin over SimTopoComm).

    ``MPI.Cartcomm(comm)`` (no dims): a copy of a Cartesian communicator, sharing its handle; another
    communicator is refused with mpi4py's TypeError."""

    def __init__(self, comm: Any = None, dims: Optional[Sequence[int]] = None,
                 periods: Sequence[bool] = ()) -> None:
        if dims is None:
            _copyable(comm, CartCalls, "a Cartesian")
            dims, periods = (comm._dims, comm._periods) if comm is not None else ((), ())
        super().__init__(comm)
        self._dims, self._periods = tuple(dims), tuple(periods)

    # -- the grid -------------------------------------------------------------------------

    TOPOLOGY, TOPOLOGY_STATE = "CART", ("_dims", "_periods")  # SimComm.Get_topology and Dup read them

    def Get_dim(self) -> int:
        return len(self._dims)

    dim = ndim = property(Get_dim)

    def Get_topo(self) -> tuple[list, list, list]:
        """(dims, periods as given (1 for True), this rank's coordinates), as mpi4py returns them from MPICH."""
        return list(self._dims), list(self._periods), self.Get_coords(self.rank)

    topo = property(Get_topo)
    dims = property(lambda self: list(self._dims))
    periods = property(lambda self: list(self._periods))
    coords = property(lambda self: self.Get_coords(self.rank))

    def Get_coords(self, rank: int) -> list:
        rank = c_int(rank, "rank")
        if not 0 <= rank < self.size:
            raise _error("ERR_RANK", f"Get_coords: rank {rank!r} is outside the grid of {self.size} ranks")
        coords = []
        for d in reversed(self._dims):
            rank, c = divmod(rank, d)
            coords.append(c)
        return coords[::-1]

    def Get_cart_rank(self, coords: Sequence[int]) -> int:
        coords = int_array(coords, len(self._dims))
        rank = 0
        for c, d, periodic in zip(coords, self._dims, self._periods):
            if not 0 <= c < d:
                if not periodic:
                    raise _error("ERR_ARG", f"Get_cart_rank: coordinate {c!r} is outside a non-periodic "
                                            f"dimension of {d}")
                c %= d
            rank = rank * d + c
        return rank

    def Shift(self, direction: int, disp: int) -> tuple[int, int]:
        """(source, dest): the ranks `disp` steps back and forward along `direction`
        (MPI.PROC_NULL past a non-periodic edge); each a C int as mpi4py takes it (a float truncated)."""
        direction, disp = c_int(direction, "direction"), c_int(disp, "disp")
        if not 0 <= direction < len(self._dims):
            raise _error("ERR_ARG", f"Shift: direction {direction!r} of a grid of {len(self._dims)} dimensions")
        here = self.Get_coords(self.rank)
        return self._neighbour(here, direction, -disp), self._neighbour(here, direction, disp)

    def _neighbour(self, here: list, direction: int, step: int) -> int:
        there = list(here)
        there[direction] += step
        d = self._dims[direction]
        if not 0 <= there[direction] < d and not self._periods[direction]:
            return special("PROC_NULL")
        there[direction] %= d
        return self.Get_cart_rank(there)

    # -- its neighbours (as mpi4py's Topocomm gives them: per dimension back, then forward) ---------

    def _neighbours(self) -> list:
        """The 2 x ndim neighbours (group ranks, or MPI.PROC_NULL): per dimension back, then forward."""
        return [r for d in range(len(self._dims)) for r in self.Shift(d, 1)]

    def _inout(self) -> tuple[list, list]:
        neighbours = self._neighbours()
        return neighbours, neighbours

    @property
    def degrees(self) -> tuple[int, int]:
        return 2 * len(self._dims), 2 * len(self._dims)

    def _sent_index(self, i: int, source: int, sources: list, theirs: list) -> int:
        return i ^ 1  # what the one back sent forward, and the other way round (the module docstring)

    def Sub(self, remain_dims: Sequence[Any]) -> Any:
        """The grids of the dimensions kept (members that differ only there), as MPI_Cart_sub."""
        keep = [bool(k) for k in int_array(remain_dims, len(self._dims))]
        here = self.Get_coords(self.rank)
        color = 0
        for c, d, k in zip(here, self._dims, keep):
            if not k:
                color = color * d + c
        sub = self._split(color, self.rank, "Sub")
        return type(self)(sub, [d for d, k in zip(self._dims, keep) if k],
                          [p for p, k in zip(self._periods, keep) if k])

    def __repr__(self) -> str:
        return f"<simulated Cartcomm rank {self.rank} of {self.size}, dims {list(self._dims)}>"


# -- general graphs (MPI_Graph_create) --------------------------------------------------------

def _graph(index: Any, edges: Any, size: int, call: str) -> tuple[list, list]:
    """(index, edges) as MPI_Graph_create takes them, with mpi4py's extension: an index that starts at 0
    and ends at the number of edges (the 'standard' adjacency array) loses its leading 0; MPI.ERR_ARG for a
    graph it refuses on `size` ranks (in `call`)."""
    index, edges = int_array(index), int_array(edges)
    if index and index[0] == 0 and index[-1] == len(edges):
        index = index[1:]
    problem = None
    if len(index) > size:
        problem = f"{len(index)} nodes do not fit a communicator of {size} ranks"
    elif any(b < a for a, b in zip([0] + index, index)) or (index and index[-1] != len(edges)):
        problem = f"index {index!r} must rise from 0 to the number of edges, {len(edges)}"
    else:
        bad = [e for e in edges if not 0 <= e < len(index)]
        if bad:
            problem = f"edge to node {bad[0]!r} is outside the graph's {len(index)} nodes"
    if problem:
        raise _detailed("ERR_ARG", f"{call}: {problem}")
    return index, edges


def create_graph(comm: Any, cls: type, index: Any, edges: Any, reorder: bool = False) -> Any:
    """MPI_Graph_create: the first len(index) members form the graph (a `cls`); the others get MPI.COMM_NULL."""
    index, edges = _graph(index, edges, comm.size, "Create_graph")
    inside = comm.rank < len(index)
    sub = comm._split(0 if inside else special("UNDEFINED"), comm.rank, "Create_graph")
    if not inside:
        return comm_null()
    return cls(sub, index, edges)


def graph_map(comm: Any, index: Any, edges: Any) -> int:
    """MPI_Graph_map: this rank's rank in the graph Create_graph would make (ranks keep their order), or
    MPI.UNDEFINED for a rank left out."""
    index, _ = _graph(index, edges, comm.size, "Graph_map")
    return comm.rank if comm.rank < len(index) else special("UNDEFINED")


class GraphCalls(Neighbourhood):
    """One simulated rank's view of a general graph communicator (mpi4py's Graphcomm; comm's SimGraphComm):
    node r's
    neighbours are edges[index[r - 1]:index[r]] (index[-1] read as 0)."""

    def __init__(self, comm: Any = None, index: Optional[Sequence[int]] = None, edges: Sequence[int] = ()) -> None:
        if index is None:  # MPI.Graphcomm(comm): a copy of a graph communicator
            _copyable(comm, GraphCalls, "a general graph")
            index, edges = (comm._index, comm._edges) if comm is not None else ((), ())
        super().__init__(comm)
        self._index, self._edges = tuple(index), tuple(edges)

    TOPOLOGY, TOPOLOGY_STATE = "GRAPH", ("_index", "_edges")  # SimComm.Get_topology and Dup read them

    def Get_dims(self) -> tuple[int, int]:
        """(nodes, edges)."""
        return len(self._index), len(self._edges)

    dims = property(Get_dims)
    nnodes = property(lambda self: len(self._index))
    nedges = property(lambda self: len(self._edges))

    def Get_topo(self) -> tuple[list, list]:
        """(index, edges), as mpi4py returns them (the index without a leading 0)."""
        return list(self._index), list(self._edges)

    topo = property(Get_topo)
    index = property(lambda self: list(self._index))
    edges = property(lambda self: list(self._edges))

    def Get_neighbors(self, rank: int) -> list:
        if not 0 <= rank < len(self._index):
            raise _error("ERR_RANK", f"Get_neighbors: rank {rank!r} is outside the graph of {len(self._index)} nodes")
        return list(self._edges[self._index[rank - 1] if rank else 0:self._index[rank]])

    def Get_neighbors_count(self, rank: int) -> int:
        return len(self.Get_neighbors(rank))

    neighbors = property(lambda self: self.Get_neighbors(self.rank))
    nneighbors = property(lambda self: self.Get_neighbors_count(self.rank))

    def _inout(self) -> tuple[list, list]:
        neighbours = self.Get_neighbors(self.rank)
        return neighbours, neighbours

    def __repr__(self) -> str:
        return f"<simulated Graphcomm rank {self.rank} of {self.size}, neighbours {self.neighbors}>"


# -- distributed graphs (MPI_Dist_graph_create_adjacent, MPI_Dist_graph_create) -------------------

def _weights(weights: Any, count: int) -> Optional[list]:
    """A side's weights as mpi4py reads them (asarray_weights): None for none or MPI.UNWEIGHTED, [] for
    MPI.WEIGHTS_EMPTY (refused beside edges), else `count` ints."""
    mpi = mpi_module()
    if weights is None or (mpi is not None and weights is mpi.UNWEIGHTED):
        return None
    if mpi is not None and weights is mpi.WEIGHTS_EMPTY:
        if count > 0:
            raise ValueError("empty weights but nonzero degree")
        return []
    return int_array(weights, count)


def _check_ranks(sources: list, destinations: list, size: int, call: str) -> None:
    """MPI.ERR_ARG (in `call`) for a source or destination outside a communicator of `size` ranks."""
    for what, ranks in (("source", sources), ("destination", destinations)):
        bad = [r for r in ranks if not 0 <= r < size]
        if bad:
            raise _detailed("ERR_ARG", f"{call}: {what} rank {bad[0]!r} is outside a communicator of {size} ranks")


def create_dist_graph_adjacent(comm: Any, cls: type, sources: Any, destinations: Any, sourceweights: Any = None,
                               destweights: Any = None, info: Any = None, reorder: bool = False) -> Any:
    """MPI_Dist_graph_create_adjacent: every member, with the sources and destinations it gives (a `cls`)."""
    sources = [] if sources is None else int_array(sources)
    sw = _weights(sourceweights, len(sources))
    destinations = [] if destinations is None else int_array(destinations)
    dw = _weights(destweights, len(destinations))
    _check_ranks(sources, destinations, comm.size, "Create_dist_graph_adjacent")
    weights = None if sw is None and dw is None else \
        (sw if sw is not None else [1] * len(sources), dw if dw is not None else [1] * len(destinations))
    return cls(comm._split(0, comm.rank, "Create_dist_graph_adjacent"), sources, destinations, weights)


def create_dist_graph(comm: Any, cls: type, sources: Any, degrees: Any, destinations: Any, weights: Any = None,
                      info: Any = None, reorder: bool = False) -> Any:
    """MPI_Dist_graph_create: each member gives some edges (source -> its `degrees` destinations); every
    member's sources and destinations are the edges that end and start there, ordered by the member that
    gave them, then as it gave them (one Allgather of the edges on the new communicator)."""
    sources = int_array(sources)
    degrees = int_array(degrees, len(sources))
    destinations = int_array(destinations, sum(degrees))  # mpi4py's check, before MPI's of the degrees
    given = _weights(weights, len(destinations))
    if any(d < 0 for d in degrees):
        raise _detailed("ERR_ARG", f"Create_dist_graph: degrees {degrees!r} must not be negative")
    _check_ranks(sources, destinations, comm.size, "Create_dist_graph")
    sub = comm._split(0, comm.rank, "Create_dist_graph")
    everyone = sub.allgather((sources, degrees, destinations, given))
    me = sub.rank
    ins, outs, in_weights, out_weights = [], [], [], []
    for srcs, degs, dsts, ws in everyone:
        at = 0
        for s, d in zip(srcs, degs):
            for _ in range(d):
                w = ws[at] if ws else 1
                if dsts[at] == me:
                    ins.append(s)
                    in_weights.append(w)
                if s == me:
                    outs.append(dsts[at])
                    out_weights.append(w)
                at += 1
    weighted = any(ws is not None for _, _, _, ws in everyone)
    return cls(sub, ins, outs, (in_weights, out_weights) if weighted else None)


class DistGraphCalls(Neighbourhood):
    """One simulated rank's view of a distributed graph communicator (mpi4py's Distgraphcomm; comm's
    SimDistGraphComm): the
    sources it receives from and the destinations it sends to, with their weights if it has any."""

    def __init__(self, comm: Any = None, sources: Optional[Sequence[int]] = None, destinations: Sequence[int] = (),
                 weights: Optional[tuple] = None) -> None:
        if sources is None:  # MPI.Distgraphcomm(comm): a copy of a distributed graph communicator
            _copyable(comm, DistGraphCalls, "a distributed graph")
            sources, destinations, weights = (comm._sources, comm._destinations, comm._weights) \
                if comm is not None else ((), (), None)
        super().__init__(comm)
        self._sources, self._destinations = tuple(sources), tuple(destinations)
        self._weights = None if weights is None else (tuple(weights[0]), tuple(weights[1]))

    TOPOLOGY, TOPOLOGY_STATE = "DIST_GRAPH", ("_sources", "_destinations", "_weights")  # read by SimComm

    def Get_dist_neighbors_count(self) -> tuple[int, int, bool]:
        """(indegree, outdegree, weighted)."""
        return len(self._sources), len(self._destinations), self._weights is not None

    def Get_dist_neighbors(self) -> tuple[list, list, Optional[tuple]]:
        """(sources, destinations, (source weights, destination weights) or None when unweighted)."""
        weights = None if self._weights is None else (list(self._weights[0]), list(self._weights[1]))
        return list(self._sources), list(self._destinations), weights

    def _inout(self) -> tuple[list, list]:
        return list(self._sources), list(self._destinations)

    def __repr__(self) -> str:
        return (f"<simulated Distgraphcomm rank {self.rank} of {self.size}, sources {list(self._sources)}, "
                f"destinations {list(self._destinations)}>")
