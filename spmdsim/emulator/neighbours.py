"""The neighbour collectives of simulated topology communicators (mpi4py's Topocomm): `Neighbourhood`.

Neighbor_allgather(v), Neighbor_alltoall(v/w), their nonblocking and persistent
forms and the pickled neighbor_allgather / neighbor_alltoall, over the sources
a rank receives from and the destinations it sends to, in order, as each kind
of topology (spmdsim.emulator.topology's Cartesian grids,
spmdsim.emulator.graphs' general and distributed graphs) gives them. A missing
neighbour (MPI.PROC_NULL) is sent nothing and its receive block is left as it
was. Between two ranks joined by several edges, the k-th time a rank lists
a source receives what that source sent the k-th time it lists the rank as a
destination (the MPI standard's rule for multigraphs); a graph where a source
does not list the rank as often is refused when the collective runs. Also the
topologies' shared errors (`_error`, `_detailed`) and copy check (`_copyable`).
"""
from __future__ import annotations

import pickle
from typing import Any

from ..base.validate import dtype_name
from ..runtime.sim._datatypes import copy_into
from ..runtime.sim._mpi import mpi_error, mpi_module, special
from .typemap import message, vector
from .derived import wmessage
from .persistent import _persistent
from .._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["Neighbourhood"]


def _detailed(code: str, text: str) -> BaseException:
    """MPI.Exception(MPI.<code>) whose text goes on with `text`, or a ValueError without mpi4py."""
    mpi = mpi_module()
    return mpi_error(mpi, getattr(mpi, code), text) if mpi is not None else ValueError(text)


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
        nonblocking form's kept copy of it is the one read: spmdsim.emulator.nonblocking._kept), then fill each receive
        block rblocks[i] = (start, count) of `dst` from source i's block for this rank: the members meet once,
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
