"""Parameters whole from every rank's blocks: where each block lies, worked out once per model.

The trainers (spmdsim.gpt.train) check each step against the reference step in one numpy process,
which starts from every parameter whole: one Allgather gives each rank every rank's blocks, a flat
table with a row per rank. `regions(params, size)` says where each rank's block lies in its parameter
(Layout.slices, asked once per model rather than once per rank, parameter and step); `assemble` places
the blocks. A region several ranks hold (a parameter replicated over dp) is placed once, from the last
of them, and the regions are placed in the order of their last holders, so each element comes from the
last rank that holds it: the same bits as placing every rank's block in rank order.

The trainers call `assemble` inside the work spmdsim.runtime.shared_once does for all the ranks:
simulated ranks build the wholes once between them, and under MPI rank 0 alone builds them.
Pure numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

__all__ = ["Regions", "regions", "assemble", "peaks"]


@dataclass(frozen=True)
class Regions:
    """Where each rank's block of each parameter lies: per parameter (in the table's order) its name, global
    shape, block shape, and the (rank, region) pairs to place, in order; `size` ranks, a table row each."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    blocks: tuple[tuple[int, ...], ...]
    writes: tuple[tuple[tuple[int, tuple[slice, ...]], ...], ...]
    size: int


def regions(params: dict, size: int) -> Regions:
    """The Regions of `params` (name -> DTensor, each rank's block shaped as this rank's) over `size` ranks."""
    names, shapes, blocks, writes = [], [], [], []
    for name, t in params.items():
        last: dict = {}  # region -> (its last holder, the region), ordered by last holder
        for rank in range(size):
            region = t.layout.slices(rank, t.global_shape)
            key = tuple((s.start, s.stop, s.step) for s in region)
            last.pop(key, None)
            last[key] = (rank, region)
        names.append(name)
        shapes.append(tuple(t.global_shape))
        blocks.append(tuple(t.local.shape))
        writes.append(tuple(last.values()))
    return Regions(tuple(names), tuple(shapes), tuple(blocks), tuple(writes), size)


def assemble(where: Regions, table: np.ndarray, count: int = 1) -> list[dict]:
    """`count` tables of parameters whole (name -> float64 array) from `table`, a row per rank holding that
    rank's blocks of every parameter, table after table (spmdsim.gpt.train's Allgather)."""
    rows = np.asarray(table).reshape(where.size, -1)
    outs, at = [], 0
    for _ in range(count):
        out = {}
        for name, shape, block, writes in zip(where.names, where.shapes, where.blocks, where.writes):
            whole, n = np.empty(shape), prod(block)
            for rank, region in writes:
                whole[region] = rows[rank, at:at + n].reshape(block)
            out[name], at = whole, at + n
        outs.append(out)
    return outs


def peaks(arrays: dict) -> dict:
    """Each array's largest magnitude (0.0 when empty): the scale of a check relative to the largest entry."""
    return {name: float(np.max(np.abs(a), initial=0.0)) for name, a in arrays.items()}
