"""ExchangeSpec: one rank's part of a repeated Alltoallv, counted and checked once (pure, no mpi4py).

`collectives.exchange` runs it. Built once per plan step (runtime.executor), it
spares every call the loops that validate and count a general `alltoallv`'s
dictionaries, which run on cold caches between the ranks' arrival and the MPI
call when ranks share cores.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate
from typing import Iterable

from .engines.trace import count_peers  # the trace counts an Alltoallv's peers the same way
from ..errors import RankError, ShapeError

__all__ = ["ExchangeSpec", "count_peers"]

Index = tuple[slice, ...]


@dataclass(frozen=True)
class ExchangeSpec:
    """Counts, displacements and packing slots of one rank's exchange.

    Attributes:
        size, rank: the mesh it was built for.
        local_shape: the shape of the block the boxes are cut from.
        packs: (index into the local block, start, stop, box shape) per box sent.
        recv_slots: (source, start, stop) per box received, in the order given to `build`.
        scounts, sdispls, rcounts, rdispls: Alltoallv counts and offsets (elements).
        peers: other ranks this rank sends to or receives from (`count_peers`).
    """

    size: int
    rank: int
    local_shape: tuple[int, ...]
    packs: tuple[tuple[Index, int, int, tuple[int, ...]], ...]
    recv_slots: tuple[tuple[int, int, int], ...]
    scounts: tuple[int, ...]
    sdispls: tuple[int, ...]
    rcounts: tuple[int, ...]
    rdispls: tuple[int, ...]
    peers: int

    @property
    def send_total(self) -> int:
        return self.sdispls[-1] + self.scounts[-1] if self.size else 0

    @property
    def recv_total(self) -> int:
        return self.rdispls[-1] + self.rcounts[-1] if self.size else 0

    @classmethod
    def build(cls, size: int, rank: int, local_shape: tuple[int, ...],
              sends: Iterable[tuple[int, Index, tuple[int, ...]]],
              receives: Iterable[tuple[int, int]]) -> "ExchangeSpec":
        """From (destination, index, box shape) per box sent and (source, elements) per box received.

        Boxes for one peer are packed (and arrive) in the order given; a box to or from `rank` raises.
        """
        sends, receives = list(sends), list(receives)
        scounts, rcounts = [0] * size, [0] * size
        for dst, index, shape in sends:
            _peer(dst, size, rank, "destination")
            if len(index) != len(local_shape):
                raise ShapeError(f"exchange box index {index!r} does not fit a block of shape {local_shape!r}")
            scounts[dst] += math.prod(shape)
        for src, count in receives:
            _peer(src, size, rank, "source")
            rcounts[src] += count
        sdispls = tuple(accumulate(scounts[:-1], initial=0)) if size else ()
        rdispls = tuple(accumulate(rcounts[:-1], initial=0)) if size else ()
        cursor = list(sdispls)
        packs = []
        for dst, index, shape in sends:
            lo = cursor[dst]
            cursor[dst] += math.prod(shape)
            packs.append((tuple(index), lo, cursor[dst], tuple(shape)))
        cursor = list(rdispls)
        slots = []
        for src, count in receives:
            lo = cursor[src]
            cursor[src] += count
            slots.append((src, lo, cursor[src]))
        return cls(size, rank, tuple(local_shape), tuple(packs), tuple(slots), tuple(scounts),
                   sdispls, tuple(rcounts), rdispls, count_peers(scounts, rcounts))


def _peer(r: int, size: int, rank: int, what: str) -> None:
    if not 0 <= r < size or r == rank:
        raise RankError(f"exchange {what} {r!r} must be another mesh rank (0 <= r < {size}, r != {rank})")
