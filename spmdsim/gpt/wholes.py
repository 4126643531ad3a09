"""Parameters whole from every rank's blocks: where each block lies, worked out once per model.

The trainers (spmdsim.gpt.train) check each step against the reference step in one numpy process,
which starts from every parameter whole: one Allgather gives each rank every rank's blocks, a flat
table with a row per rank. `regions(params, size)` says where each rank's block lies in its parameter
(Layout.slices, asked once per layout and shape rather than once per rank, parameter and step);
`assemble` places the blocks. A region several ranks hold (a parameter replicated over dp) is placed
once, from the last of them, and the regions are placed in the order of their last holders, so each
element comes from the last rank that holds it: the same bits as placing every rank's block in rank
order. Only the last holders' rows of the table are read (`Regions.used`): with dp replicas, the last
dp's ranks.

The trainers call `assemble` inside the work spmdsim.runtime.shared_once does for all the ranks:
simulated ranks build the wholes once between them, and under MPI rank 0 alone builds them.
Pure numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod
from typing import Any

import numpy as np

__all__ = ["Regions", "regions", "assemble", "peaks"]


@dataclass(frozen=True)
class Regions:
    """Where each rank's block of each parameter lies: per parameter (in the table's order) its name, global
    shape, block shape, and the (row, region) pairs to place, in order; `rows`, the ranks whose rows of the
    table are read (the last holders), a row each in that order; `size` ranks, a table row each."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    blocks: tuple[tuple[int, ...], ...]
    writes: tuple[tuple[tuple[int, tuple[slice, ...]], ...], ...]
    rows: tuple[int, ...]
    size: int

    def used(self, table: np.ndarray) -> np.ndarray:
        """The rows of `table` (a row per rank) that `assemble` reads: a view when they are consecutive ranks
        (a dp replica's rows, the first of two writes of the same region, are left out)."""
        rows = np.asarray(table).reshape(self.size, -1)
        lo, hi = self.rows[0], self.rows[-1] + 1
        return rows[lo:hi] if hi - lo == len(self.rows) else rows[list(self.rows)]


def regions(params: dict, size: int) -> Regions:
    """The Regions of `params` (name -> DTensor, each rank's block shaped as this rank's) over `size` ranks."""
    names, shapes, blocks, writes = [], [], [], []
    for name, t in params.items():
        names.append(name)
        shapes.append(tuple(t.global_shape))
        blocks.append(tuple(t.local.shape))
        writes.append(_last_holders(t.layout, shapes[-1], size))
    rows = tuple(sorted({rank for w in writes for rank, _ in w}))
    at = {rank: i for i, rank in enumerate(rows)}
    writes = [tuple((at[rank], region) for rank, region in w) for w in writes]
    return Regions(tuple(names), tuple(shapes), tuple(blocks), tuple(writes), rows, size)


@lru_cache(maxsize=1024)
def _last_holders(layout: Any, shape: tuple, size: int) -> tuple:
    """(rank, region) for each distinct region of a tensor of `shape` laid out as `layout` over `size` ranks:
    its last holder, in the order of the last holders."""
    last: dict = {}
    for rank in range(size):
        region = layout.slices(rank, shape)
        key = tuple((s.start, s.stop, s.step) for s in region)
        last.pop(key, None)
        last[key] = (rank, region)
    return tuple(last.values())


def assemble(where: Regions, rows: np.ndarray, count: int = 1) -> list[dict]:
    """`count` tables of parameters whole (name -> float64 array) from `rows` (`Regions.used` of the table, a
    row per rank holding that rank's blocks of every parameter, table after table: spmdsim.gpt.train's
    Allgather)."""
    outs, at = [], 0
    for _ in range(count):
        out = {}
        for name, shape, block, writes in zip(where.names, where.shapes, where.blocks, where.writes):
            whole, n = np.empty(shape), prod(block)
            for row, region in writes:
                whole[region] = rows[row, at:at + n].reshape(block)
            out[name], at = whole, at + n
        outs.append(out)
    return outs


def peaks(arrays: dict) -> dict:
    """Each array's largest magnitude (0.0 when empty): the scale of a check relative to the largest entry."""
    return {name: float(np.max(np.abs(a), initial=0.0)) for name, a in arrays.items()}
