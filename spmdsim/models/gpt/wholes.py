"""Parameters whole from every rank's blocks: where each block lies, worked out once per model.

The trainers (spmdsim.models.gpt.train) check each step against the reference step in one numpy process,
which starts from every parameter whole: one Allgather gives each rank every rank's blocks, a flat
table with a row per rank (simulated ranks share one such table: spmdsim.models.gpt.train.all_rows).
`regions(params, size)` says where each rank's block lies in its parameter (Layout.slices, asked
once per layout and shape rather than once per rank, parameter and step); `assemble` places the
blocks. A region several ranks hold (a parameter replicated over dp) is placed
once, from the last of them, and the regions are placed in the order of their last holders, so each
element comes from the last rank that holds it: the same bits as placing every rank's block in rank
order. Only the last holders' rows of the table are read (`Regions.used`): with dp replicas, the last
dp's ranks.

The trainers call `assemble` inside the work spmdsim.runtime.shared_reference.shared_once does for all the ranks:
simulated ranks build the wholes once between them, and under MPI rank 0 alone builds them.
Pure numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from math import prod
from typing import Any

import numpy as np

__all__ = ["Regions", "regions", "stage_regions", "row", "assemble", "peaks"]


@dataclass(frozen=True)
class Regions:
    """Where each rank's block of each parameter lies: per parameter (in the table's order) its name, global
    shape, and the (row, column, region, block shape) of each block to place, in order (its row of `rows`, where
    it starts in a table's part of that row); `rows`, the ranks whose rows of the table are read (the last
    holders), a row each in that order; `size` ranks, a table row each; `width`, the columns of one table in a
    row (tables after tables)."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    writes: tuple[tuple[tuple[int, int, tuple[slice, ...], tuple[int, ...]], ...], ...]
    rows: tuple[int, ...]
    size: int
    width: int

    def used(self, table: np.ndarray) -> np.ndarray:
        """The rows of `table` (a row per rank) that `assemble` reads: a view when they are consecutive ranks
        (a dp replica's rows, the first of two writes of the same region, are left out)."""
        rows = np.asarray(table).reshape(self.size, -1)
        lo, hi = self.rows[0], self.rows[-1] + 1
        return rows[lo:hi] if hi - lo == len(self.rows) else rows[list(self.rows)]


def regions(params: dict, size: int) -> Regions:
    """The Regions of `params` (name -> DTensor) over `size` ranks, every rank's row holding its blocks of all of
    them, in that order; under an uneven cut a rank's blocks are its own sizes (Layout.local_shape) and `width`
    the longest row (a shorter row is padded at its end)."""
    holders, at = {}, [0] * size
    for name, t in params.items():
        shape = tuple(t.global_shape)
        holders[name] = (shape, [(rank, at[rank], region) for rank, region in _last_holders(t.layout, shape, size)])
        for rank, n in enumerate(_block_sizes(t.layout, shape, size)):
            at[rank] += n
    return _regions(holders, size, max(at, default=0))


@lru_cache(maxsize=1024)
def _block_sizes(layout: Any, shape: tuple, size: int) -> tuple:
    """The elements of each rank's block of a tensor of `shape` laid out as `layout` over `size` ranks."""
    return tuple(prod(layout.local_shape(shape, rank)) for rank in range(size))


def stage_regions(stages: list, layouts: dict, shapes: dict, per_stage: int) -> Regions:
    """The Regions of a pipeline's parameters: stage s's ranks (s * per_stage + place, place on its own mesh) each
    hold, one after the other in its row, its blocks of the parameters `stages[s]` names (laid out as `layouts`
    says, whole shapes `shapes`); rows padded to the largest stage's. A parameter two stages hold (the tied
    table) is placed from the later stage's, as placing every rank's block in rank order would."""
    holders: dict = {}
    width = 0
    for stage, names in enumerate(stages):
        at = [0] * per_stage  # where each place's next block starts (under an uneven cut, ZeRO-3's, they differ)
        for name in names:
            shape = tuple(shapes[name])
            mine = holders.setdefault(name, (shape, []))[1]
            mine.extend((stage * per_stage + place, at[place], region)
                        for place, region in _last_holders(layouts[name], shape, per_stage))
            for place, n in enumerate(_block_sizes(layouts[name], shape, per_stage)):
                at[place] += n
        width = max([width] + at)
    ordered = {name: holders[name] for name in shapes if name in holders}
    return _regions(ordered, len(stages) * per_stage, width)


def _regions(holders: dict, size: int, width: int) -> Regions:
    """Regions from name -> (global shape, the (rank, column, region) of each of its blocks, in rank order): each
    distinct region placed once, from its last holder, in the order of the last holders."""
    names, shapes, writes = [], [], []
    for name, (shape, blocks) in holders.items():
        names.append(name)
        shapes.append(shape)
        writes.append(_last_of_each_region(blocks))
    rows = tuple(sorted({rank for w in writes for rank, _, _ in w}))
    row = {rank: i for i, rank in enumerate(rows)}
    writes = [tuple((row[rank], at, region, tuple(s.stop - s.start for s in region)) for rank, at, region in w)
              for w in writes]
    return Regions(tuple(names), tuple(shapes), tuple(writes), rows, size, width)


@lru_cache(maxsize=1024)
def _last_holders(layout: Any, shape: tuple, size: int) -> tuple:
    """(rank, region) for each distinct region of a tensor of `shape` laid out as `layout` over `size` ranks:
    its last holder, in the order of the last holders."""
    return _last_of_each_region((rank, layout.slices(rank, shape)) for rank in range(size))


def _last_of_each_region(blocks: Any) -> tuple:
    """Of `blocks` (tuples ending in a region, in rank order), the last of each distinct region, in the order of
    those last ones."""
    last: dict = {}
    for block in blocks:
        key = tuple((s.start, s.stop, s.step) for s in block[-1])
        last.pop(key, None)
        last[key] = block
    return tuple(last.values())


def row(tables: list, names: Any, width: int) -> np.ndarray:
    """This rank's row of the table `assemble` reads: each of `tables` (name -> this rank's block) its blocks of
    `names` end to end as float64, in `width` items (Regions.width; a rank whose blocks are shorter, a pipeline
    stage's or an uneven cut's, leaves zeros after them)."""
    flat = np.zeros(width * len(tables))
    for k, table in enumerate(tables):
        at = k * width
        for name in names:
            block = np.asarray(table[name], np.float64).reshape(-1)
            flat[at:at + block.size] = block
            at += block.size
    return flat


def assemble(where: Regions, rows: np.ndarray, count: int = 1) -> list[dict]:
    """`count` tables of parameters whole (name -> float64 array) from `rows` (`Regions.used` of the table, a
    row per rank holding that rank's blocks of every parameter it holds, table after table: spmdsim.models.gpt.train's
    Allgather)."""
    outs = []
    for table in range(count):
        base, out = table * where.width, {}
        for name, shape, writes in zip(where.names, where.shapes, where.writes):
            whole = np.empty(shape)
            for row, at, region, block in writes:
                whole[region] = rows[row, base + at:base + at + prod(block)].reshape(block)
            out[name] = whole
        outs.append(out)
    return outs


def peaks(arrays: dict) -> dict:
    """Each array's largest magnitude (0.0 when empty): the scale of a check relative to the largest entry."""
    return {name: float(np.max(np.abs(a), initial=0.0)) for name, a in arrays.items()}
