"""General and distributed graph communicators of simulated ranks (mpi4py's Graphcomm and Distgraphcomm).

``comm.Create_graph(index, edges)`` and ``comm.Create_dist_graph_adjacent(sources,
destinations)`` / ``comm.Create_dist_graph(sources, degrees, destinations)``,
with their queries; their neighbour collectives are spmdsim.emulator.neighbours'.
A graph's neighbours are its ``Get_neighbors(rank)``, sources and destinations
alike; a distributed graph's are its sources (received from, in order) and
destinations (sent to, in order), an edge given by several ranks in
``Create_dist_graph`` ordered by the rank that gave it. Members keep their rank
order (``reorder`` is ignored: every simulated rank is on one node).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ..base.validate import counted
from ..runtime.sim._buffers import int_array
from ..runtime.sim._mpi import mpi_module, special
from .neighbours import Neighbourhood, _copyable, _detailed
from .real import comm_null

__all__ = ["GraphCalls", "DistGraphCalls", "create_graph", "create_dist_graph", "create_dist_graph_adjacent",
           "graph_map"]


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
            raise _detailed("ERR_RANK",
                            f"Get_neighbors: rank {rank!r} is outside the graph of {len(self._index)} nodes")
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
            raise _detailed("ERR_ARG", f"{call}: {what} rank {bad[0]!r} is outside a communicator of "
                                       f"{counted(size, 'rank')}")


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
