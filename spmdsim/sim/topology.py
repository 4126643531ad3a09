"""Cartesian communicators of simulated ranks: ``comm.Create_cart(dims, periods)`` and its queries.

A first MPI lab's grids (a 2-D heat equation, a ring with ``Shift``): SimCartComm
is a SimComm whose members also have coordinates, row-major (the last dimension
varies fastest, MPI's order), kept in rank order (``reorder`` is ignored: every
simulated rank is on one node). Neighbour collectives, graph topologies and
``Cart_map`` are not simulated.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from ._buffers import mpi_module, special
from .comm import SimComm, comm_null
from .group import speak_mpi4py

__all__ = ["SimCartComm", "create_cart"]


def _error(code: str, text: str) -> BaseException:
    """MPI.Exception(MPI.<code>) as MPICH raises it, or a ValueError without mpi4py."""
    mpi = mpi_module()
    return mpi.Exception(getattr(mpi, code)) if mpi is not None else ValueError(text)


def create_cart(comm: SimComm, dims: Sequence[int], periods: Optional[Sequence[Any]] = None,
                reorder: bool = False) -> Any:
    """MPI_Cart_create: the first prod(dims) members form a grid; the others get MPI.COMM_NULL."""
    dims = tuple(int(d) for d in dims)
    periods = tuple(bool(p) for p in periods) if periods is not None else (False,) * len(dims)
    if len(periods) != len(dims) or any(d <= 0 for d in dims) or math.prod(dims) > comm.size:
        raise _error("ERR_ARG", f"Create_cart: dims {list(dims)!r} (periods {list(periods)!r}) do not fit "
                                f"a communicator of {comm.size} ranks")
    inside = comm.rank < math.prod(dims)
    sub = comm.Split(0 if inside else special("UNDEFINED"), comm.rank)
    if not inside:
        return comm_null()
    return SimCartComm(sub, dims, periods)


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
