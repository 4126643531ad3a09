"""Cartesian topology communicators of simulated ranks (mpi4py's Cartcomm): create_cart, cart_map, CartCalls.

``comm.Create_cart(dims, periods)`` (a first MPI lab's grids: a 2-D heat
equation, a ring with ``Shift``), with its queries; its neighbour collectives
are spmdsim.emulator.neighbours' `Neighbourhood` (general and distributed
graphs: spmdsim.emulator.graphs). Members keep their rank order (``reorder`` is
ignored: every simulated rank is on one node). A Cartesian grid is row-major
(the last dimension varies fastest, MPI's order); its 2 x ndim neighbours are,
per dimension, the one back (``Shift(d, 1)[0]``) then the one forward, and the
block received from the one back is what it sent forward, and the other way
round (so a periodic dimension of 1 or 2 ranks, where both are the same rank,
is well defined); a missing neighbour (MPI.PROC_NULL, past a non-periodic edge)
is sent nothing and its receive block is left as it was.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from ..runtime.sim._buffers import int_array
from ..runtime.sim._mpi import c_int, special
from .neighbours import Neighbourhood, _copyable, _detailed
from .real import comm_null

__all__ = ["CartCalls", "create_cart", "cart_map"]


def create_cart(comm: Any, cls: type, dims: Sequence[int], periods: Optional[Sequence[Any]] = None,
                reorder: bool = False) -> Any:
    """MPI_Cart_create: the first prod(dims) members form a grid (a `cls`); the others get MPI.COMM_NULL."""
    dims, periods = _grid(dims, periods)
    if any(d <= 0 for d in dims) or math.prod(dims) > comm.size:
        raise _detailed("ERR_ARG", f"Create_cart: dims {list(dims)!r} " + (
            f"make a grid of {math.prod(dims)} ranks, more than the communicator's {comm.size}"
            if all(d > 0 for d in dims) else "must be positive (MPI.Compute_dims chooses sizes for 0s)"))
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
        raise _detailed("ERR_ARG", f"Cart_map: dims {list(dims)!r} do not fit a communicator of {comm.size} ranks")
    return comm.rank if comm.rank < math.prod(dims) else special("UNDEFINED")


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
            raise _detailed("ERR_RANK", f"Get_coords: rank {rank!r} is outside the grid of {self.size} ranks")
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
                    raise _detailed("ERR_ARG", f"Get_cart_rank: coordinate {c!r} is outside a non-periodic "
                                            f"dimension of {d}")
                c %= d
            rank = rank * d + c
        return rank

    def Shift(self, direction: int, disp: int) -> tuple[int, int]:
        """(source, dest): the ranks `disp` steps back and forward along `direction`
        (MPI.PROC_NULL past a non-periodic edge); each a C int as mpi4py takes it (a float truncated)."""
        direction, disp = c_int(direction, "direction"), c_int(disp, "disp")
        if not 0 <= direction < len(self._dims):
            raise _detailed("ERR_ARG", f"Shift: direction {direction!r} of a grid of {len(self._dims)} dimensions")
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
