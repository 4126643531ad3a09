"""Cartesian communicators of simulated ranks: ``comm.Create_cart(dims, periods)`` and its queries.

A first MPI lab's grids (a 2-D heat equation, a ring with ``Shift``): SimCartComm
is a SimComm whose members also have coordinates, row-major (the last dimension
varies fastest, MPI's order), kept in rank order (``reorder`` is ignored: every
simulated rank is on one node). Its neighbour collectives (Neighbor_allgather,
Neighbor_allgatherv, Neighbor_alltoall, Neighbor_alltoallv) exchange one block
with each of the 2 x ndim neighbours, as the MPI standard orders them: per
dimension, the one back (``Shift(d, 1)[0]``), then the one forward. The block
received from the one back is what it sent forward, and the other way round
(so a periodic dimension of 1 or 2 ranks, where both are the same rank, is
well defined); a missing neighbour (MPI.PROC_NULL, past a non-periodic edge)
is sent nothing and its receive block is left as it was. Graph topologies and
``Cart_map`` are not simulated.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from ..sim._buffers import copy_into, dtype_name, message, mpi_error, mpi_module, special, vector
from .comm import SimComm, comm_null
from .group import speak_mpi4py
from .handles import end_on_fatal_errors
from .._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["SimCartComm", "create_cart"]


def _error(code: str, text: str) -> BaseException:
    """MPI.Exception(MPI.<code>) as MPICH raises it, or a ValueError without mpi4py."""
    mpi = mpi_module()
    return mpi.Exception(getattr(mpi, code)) if mpi is not None else ValueError(text)


def _detailed(code: str, text: str) -> BaseException:
    """MPI.Exception(MPI.<code>) whose text goes on with `text`, or a ValueError without mpi4py."""
    mpi = mpi_module()
    return mpi_error(mpi, getattr(mpi, code), text) if mpi is not None else ValueError(text)


def create_cart(comm: SimComm, dims: Sequence[int], periods: Optional[Sequence[Any]] = None,
                reorder: bool = False) -> Any:
    """MPI_Cart_create: the first prod(dims) members form a grid; the others get MPI.COMM_NULL."""
    dims, periods = _grid(dims, periods)
    if any(d <= 0 for d in dims) or math.prod(dims) > comm.size:
        raise _error("ERR_ARG", f"Create_cart: dims {list(dims)!r} (periods {list(periods)!r}) do not fit "
                                f"a communicator of {comm.size} ranks")
    inside = comm.rank < math.prod(dims)
    sub = comm.Split(0 if inside else special("UNDEFINED"), comm.rank)
    if not inside:
        return comm_null()
    return SimCartComm(sub, dims, periods)


def _grid(dims: Sequence[int], periods: Any) -> tuple:
    """(dims, periods) as tuples; `periods` None (none), one flag for every dimension, or one each
    (mpi4py's ValueError for another count)."""
    dims = tuple(int(d) for d in dims)
    if periods is None or isinstance(periods, (bool, int)):
        return dims, (bool(periods),) * len(dims)
    periods = tuple(bool(p) for p in periods)
    if len(periods) != len(dims):
        raise ValueError(f"expecting {len(dims)} items, got {len(periods)}")
    return dims, periods


def cart_map(comm: SimComm, dims: Sequence[int], periods: Any = None) -> int:
    """MPI_Cart_map: this rank's place in the grid Create_cart would make (ranks keep their order), or
    MPI.UNDEFINED for a rank left out."""
    dims, _ = _grid(dims, periods)
    if any(d <= 0 for d in dims) or math.prod(dims) > comm.size:
        raise _error("ERR_ARG", f"Cart_map: dims {list(dims)!r} do not fit a communicator of {comm.size} ranks")
    return comm.rank if comm.rank < math.prod(dims) else special("UNDEFINED")


class SimCartComm(SimComm):
    """One simulated rank's view of a Cartesian communicator (mpi4py's Cartcomm)."""

    def __init__(self, comm: Any = None, dims: Sequence[int] = (), periods: Sequence[bool] = ()) -> None:
        super().__init__(comm)
        if isinstance(comm, SimCartComm) and not dims:
            dims, periods = comm._dims, comm._periods
        self._dims, self._periods = tuple(dims), tuple(periods)

    # -- the grid -------------------------------------------------------------------------

    def Get_topology(self) -> int:
        return special("CART")

    topology = property(Get_topology)

    def Get_dim(self) -> int:
        return len(self._dims)

    dim = ndim = property(Get_dim)

    def Get_topo(self) -> tuple[list, list, list]:
        """(dims, periods as 0/1, this rank's coordinates), as mpi4py returns them."""
        return list(self._dims), [int(p) for p in self._periods], self.Get_coords(self.rank)

    topo = property(Get_topo)
    is_topo = True
    dims = property(lambda self: list(self._dims))
    periods = property(lambda self: [int(p) for p in self._periods])
    coords = property(lambda self: self.Get_coords(self.rank))

    def Get_coords(self, rank: int) -> list:
        if not 0 <= rank < self.size:
            raise _error("ERR_RANK", f"Get_coords: rank {rank!r} is outside the grid of {self.size} ranks")
        coords = []
        for d in reversed(self._dims):
            rank, c = divmod(rank, d)
            coords.append(c)
        return coords[::-1]

    def Get_cart_rank(self, coords: Sequence[int]) -> int:
        if len(coords) != len(self._dims):
            raise _error("ERR_ARG", f"Get_cart_rank: {len(coords)} coordinates for a grid of {len(self._dims)}")
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
        (MPI.PROC_NULL past a non-periodic edge)."""
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

    indegree = outdegree = property(lambda self: 2 * len(self._dims))
    inedges = outedges = property(lambda self: self._neighbours())
    inoutedges = property(lambda self: (self._neighbours(), self._neighbours()))

    # -- neighbour collectives (the module docstring) -----------------------------------------

    def _neighbours(self) -> list:
        """The 2 x ndim neighbours (group ranks, or MPI.PROC_NULL): per dimension back, then forward."""
        return [r for d in range(len(self._dims)) for r in self.Shift(d, 1)]

    def _exchange(self, op: str, src: np.ndarray, blocks: Any, dst: np.ndarray, rblocks: list) -> None:
        """Deposit `src` (`blocks(i)`: the slice of it for neighbour i), then fill each receive block
        rblocks[i] = (start, count) of `dst` from neighbour i's block for this rank: the members meet once,
        the last to arrive filling every member's blocks (Group.enter_all), as the other collectives do."""
        null = special("PROC_NULL")
        neighbours, me = self._neighbours(), self.rank

        def fill(slot: Any) -> None:  # writes only this member's receive blocks
            for i, nb in enumerate(neighbours):
                if nb == null:
                    continue
                sent = slot.calls[nb].data[1](i ^ 1)  # what it sent forward, I receive from back (and vice versa)
                start, count = rblocks[i]
                part = dst[start:start + count]
                if sent.nbytes != part.nbytes:
                    raise _detailed("ERR_TRUNCATE" if sent.nbytes > part.nbytes else "ERR_OTHER",
                                    f"{op}: group rank {nb} sends {sent.size} x {sent.dtype.name} where group "
                                    f"rank {me} receives {part.size} x {part.dtype.name}")
                copy_into(part, sent)

        self._enter_all(op, (op, dtype_name(src.dtype)), (src, blocks), (fill,))

    def Neighbor_allgather(self, sendbuf: Any, recvbuf: Any) -> None:
        k = 2 * len(self._dims)
        src, n, _ = message(sendbuf, "Neighbor_allgather sendbuf")
        src = src[:n]
        dst, c, _ = message(recvbuf, "Neighbor_allgather recvbuf", blocks=k, readonly=False)
        self._exchange("neighbor_allgather", src, lambda i: src, dst, [(i * c, c) for i in range(k)])

    def Neighbor_allgatherv(self, sendbuf: Any, recvbuf: Any) -> None:
        k = 2 * len(self._dims)
        src, n, _ = message(sendbuf, "Neighbor_allgatherv sendbuf")
        src = src[:n]
        dst, counts, displs, _ = vector(recvbuf, "Neighbor_allgatherv recvbuf", k, readonly=False)
        self._exchange("neighbor_allgatherv", src, lambda i: src, dst, list(zip(displs, counts)))

    def Neighbor_alltoall(self, sendbuf: Any, recvbuf: Any) -> None:
        k = 2 * len(self._dims)
        src, n, _ = message(sendbuf, "Neighbor_alltoall sendbuf", blocks=k)
        dst, c, _ = message(recvbuf, "Neighbor_alltoall recvbuf", blocks=k, readonly=False)
        self._exchange("neighbor_alltoall", src, lambda i: src[i * n:(i + 1) * n], dst,
                       [(i * c, c) for i in range(k)])

    def Neighbor_alltoallv(self, sendbuf: Any, recvbuf: Any) -> None:
        k = 2 * len(self._dims)
        src, scounts, sdispls, _ = vector(sendbuf, "Neighbor_alltoallv sendbuf", k)
        dst, counts, displs, _ = vector(recvbuf, "Neighbor_alltoallv recvbuf", k, readonly=False)
        self._exchange("neighbor_alltoallv", src, lambda i: src[sdispls[i]:sdispls[i] + scounts[i]], dst,
                       list(zip(displs, counts)))

    def neighbor_allgather(self, sendobj: Any) -> list:
        """Each neighbour's object (None from MPI.PROC_NULL), as mpi4py's pickled neighbour allgather."""
        return self._exchange_objects("neighbor_allgather(obj)", sendobj, lambda i: sendobj)

    def neighbor_alltoall(self, sendobj: Any) -> list:
        """sendobj[i] to neighbour i; the object each neighbour sent this rank (None from PROC_NULL)."""
        if len(sendobj) != 2 * len(self._dims):
            raise ValueError(f"neighbor_alltoall: {len(sendobj)} objects for {2 * len(self._dims)} neighbours")
        return self._exchange_objects("neighbor_alltoall(obj)", sendobj, lambda i: sendobj[i])

    def _exchange_objects(self, op: str, sendobj: Any, pick: Any) -> list:
        import pickle

        null = special("PROC_NULL")
        neighbours, received = self._neighbours(), []

        def unpickle(slot: Any) -> None:  # each receiver unpickles its own copy, as MPI moves bytes
            received.extend(None if nb == null else pickle.loads(pickle.dumps(slot.calls[nb].data(i ^ 1)))
                            for i, nb in enumerate(neighbours))

        self._enter_all(op, (op,), pick, (unpickle,))
        return received

    # Nonblocking: posted and completed at once, as the other nonblocking collectives (_posted).
    def Ineighbor_allgather(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Neighbor_allgather, sendbuf, recvbuf)

    def Ineighbor_allgatherv(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Neighbor_allgatherv, sendbuf, recvbuf)

    def Ineighbor_alltoall(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Neighbor_alltoall, sendbuf, recvbuf)

    def Ineighbor_alltoallv(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Neighbor_alltoallv, sendbuf, recvbuf)

    def Sub(self, remain_dims: Sequence[Any]) -> "SimCartComm":
        """The grids of the dimensions kept (members that differ only there), as MPI_Cart_sub."""
        keep = [bool(k) for k in remain_dims]
        if len(keep) != len(self._dims):
            raise _error("ERR_ARG", f"Sub: {len(keep)} flags for a grid of {len(self._dims)} dimensions")
        here = self.Get_coords(self.rank)
        color = 0
        for c, d, k in zip(here, self._dims, keep):
            if not k:
                color = color * d + c
        sub = self.Split(color, self.rank)
        return SimCartComm(sub, [d for d, k in zip(self._dims, keep) if k],
                           [p for p, k in zip(self._periods, keep) if k])

    def Dup(self, info: Any = None) -> "SimCartComm":
        return SimCartComm(SimComm.Dup(self, info), self._dims, self._periods)

    Clone = Dup

    def __repr__(self) -> str:
        return f"<simulated Cartcomm rank {self.rank} of {self.size}, dims {list(self._dims)}>"


speak_mpi4py(SimCartComm, "Cartcomm")
end_on_fatal_errors(SimCartComm)
