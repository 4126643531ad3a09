"""The picture model of a layout: blocks, labels, colours and hatches as plain data.

Both renderers (ASCII and matplotlib) draw a LayoutPicture and decide nothing
themselves, so tests check a picture's content here: which ranks label each
block, which colour (one per shard) it gets, whether it is hatched (partial).

Folding: the two last *split* tensor dims (or the last dims when fewer are
split) form the rows and columns of a 2-D panel; any further split dims form
a grid of panels. The device matrix folds the same way over its axes of size
above one. Pure: no numpy of its own (the layout values bring it).
"""
from __future__ import annotations

import math
import reprlib
from dataclasses import dataclass
from itertools import product
from typing import Iterator, Optional, Sequence

from ...errors import SpmdsimError
from ...layouts.explain import partial_text
from ...layouts.layout import Layout, TensorLayout
from ...layouts.notation import format_entry
from ...layouts.slicing import all_bounds
from ...base.ranks import compact_ranks

__all__ = ["Block", "Panel", "DeviceCell", "DevicePanel", "LayoutPicture", "layout_picture", "compact_ranks"]


@dataclass(frozen=True)
class Block:
    """One shard's block of the global tensor and every rank that holds it."""

    shard_number: int  # row-major number among all blocks; also the colour index
    shard_index: tuple[int, ...]  # per tensor dim
    bounds: tuple[tuple[int, int], ...]  # per tensor dim, half-open
    ranks: tuple[int, ...]  # all holders, sorted
    terms: tuple[tuple[int, ...], ...]  # holders grouped per partial term (one group if none)
    label: str  # "r0", "r0,1" (replicas), "r0+1" (partial terms to add)
    partial: bool  # drawn hatched: the block is a pending sum


@dataclass(frozen=True)
class Panel:
    """A 2-D cut of the tensor: blocks over `row_dim` x `col_dim` for one slab of the rest."""

    title: str
    grid_pos: tuple[int, int]
    row_dim: Optional[int]  # None for a 1-D tensor (one row)
    col_dim: int  # -1 for a 0-d tensor (one block)
    row_edges: tuple[int, ...]  # block boundaries along row_dim ((0, 1) when row_dim is None)
    col_edges: tuple[int, ...]
    blocks: tuple[tuple[Block, ...], ...]  # [row][col]


@dataclass(frozen=True)
class DeviceCell:
    """One rank in the device-matrix view, coloured by the shard it holds."""

    rank: int
    coords: tuple[int, ...]
    shard_number: int
    label: str  # "r5"
    partial: bool


@dataclass(frozen=True)
class DevicePanel:
    title: str  # e.g. "a=1" for the leading axes ("" when there is one panel)
    grid_pos: tuple[int, int]
    row_axis: Optional[str]
    col_axis: Optional[str]
    row_labels: tuple[str, ...]  # "c=0", "c=1"
    col_labels: tuple[str, ...]
    cells: tuple[tuple[DeviceCell, ...], ...]  # [row][col]


@dataclass(frozen=True)
class LayoutPicture:
    """Everything drawn for one tensor layout: tensor panels, device panels, notes."""

    name: str
    shape: tuple[int, ...]
    tensor_layout: TensorLayout
    panel_grid: tuple[int, int]
    panels: tuple[Panel, ...]
    device_grid: tuple[int, int]
    device_panels: tuple[DevicePanel, ...]
    num_shards: int
    notes: tuple[str, ...]

    @property
    def blocks(self) -> tuple[Block, ...]:
        """Every block once, in shard-number order."""
        seen = {b.shard_number: b for p in self.panels for row in p.blocks for b in row}
        return tuple(seen[k] for k in sorted(seen))

    @property
    def title(self) -> str:
        entries = ", ".join(format_entry(e) for e in self.tensor_layout.tensor_map)
        return f"{self.name}: shape {self.shape!r}, tensor map ({entries})"


def _label(terms: tuple[tuple[int, ...], ...]) -> str:
    if len(terms) == 1:
        return "r" + compact_ranks(terms[0])
    shown = [compact_ranks(t) if len(t) == 1 else f"({compact_ranks(t)})" for t in terms]
    return "r" + "+".join(shown)


def _fold(
    sizes: Sequence[int], preferred: Sequence[int], pad: bool = True
) -> tuple[list[int], list[int], Optional[int], Optional[int]]:
    """Pick (grid row dims, grid col dims, cell row dim, cell col dim) among dims.

    `preferred` dims are always shown; with `pad`, other dims (larger first,
    from the right) are added until two are shown, so a 2-D tensor stays 2-D.
    """
    n = len(sizes)
    chosen = list(preferred)
    want = min(2, n) if pad else 0
    for pool in ([d for d in range(n - 1, -1, -1) if sizes[d] > 1], list(range(n - 1, -1, -1))):
        for d in pool:
            if len(chosen) >= want:
                break
            if d not in chosen:
                chosen.append(d)
    chosen.sort()
    if not chosen:
        return [], [], None, None
    if len(chosen) == 1:
        return [], [], None, chosen[0]
    grid = chosen[:-2]
    return grid[: len(grid) // 2], grid[len(grid) // 2 :], chosen[-2], chosen[-1]


def _slabs(
    sizes: Sequence[int], grid_rows: Sequence[int], grid_cols: Sequence[int],
    row: Optional[int], col: Optional[int],
) -> Iterator[tuple[tuple[int, int], dict[int, int], list[list[tuple[int, ...]]]]]:
    """Per panel of a `_fold`: its grid position, the {dim: index} it fixes, its [row][col] index tuples."""
    rows = range(sizes[row] if row is not None else 1)
    cols = range(sizes[col] if col is not None else 1)
    for gi, gr in enumerate(product(*(range(sizes[d]) for d in grid_rows))):
        for gj, gc in enumerate(product(*(range(sizes[d]) for d in grid_cols))):
            fixed = dict(zip(grid_rows, gr)) | dict(zip(grid_cols, gc))
            indices = []
            for i in rows:
                cells = [fixed | {row: i, col: j} for j in cols]  # a None row or col is never read
                indices.append([tuple(at.get(d, 0) for d in range(len(sizes))) for at in cells])
            yield (gi, gj), fixed, indices


def _edges(size: int, shards: int | tuple, cut: str = "even") -> tuple[int, ...]:
    """Where the shards of a dim start, and its size: the layout's own cut (spmdsim.layouts.slicing; `shards` a count
    or the dim's counts per mesh axis)."""
    return tuple(a for a, _ in all_bounds(size, shards, cut)) + (size,)


class PictureArgumentError(SpmdsimError, TypeError):
    """A picture's argument of the wrong kind (a TypeError, as it was): one line, no traceback in a notebook."""


def as_picture(picture: object, shape: Optional[Sequence[int]], name: str, call: str) -> "LayoutPicture":
    """`picture` as a renderer draws it (`call`: how it is called, for the errors): a LayoutPicture as it is, a
    TensorLayout with `shape`. A device matrix alone (`Layout`, its tensor map forgotten) is refused here, with
    the tensor layout to give, rather than failing inside the renderer."""
    if isinstance(picture, LayoutPicture):
        return picture
    if isinstance(picture, TensorLayout):
        if shape is None:
            raise PictureArgumentError(f"{call} needs a shape with a tensor layout: the tensor's, e.g. (8, 8)")
        return layout_picture(picture, shape, name)
    matrix = isinstance(picture, Layout)
    hint = ("; it is a device matrix: expected a tensor's layout over it, e.g. "
            f"layout({', '.join(map(repr, picture.alias_name))})" if matrix else "")
    raise PictureArgumentError(f"{call}: picture {repr(picture) if matrix else reprlib.repr(picture)} is neither a "
                               f"TensorLayout (with a shape) nor a LayoutPicture{hint}")


def layout_picture(tensor_layout: TensorLayout, shape: Sequence[int], name: str = "x") -> LayoutPicture:
    """Build the picture model of `tensor_layout` applied to a tensor of `shape`."""
    tl = tensor_layout
    shape = tl.check_shape(shape)
    shards = tl.shards_per_dim
    blocks = _blocks(tl, shape)

    # -- tensor panels ------------------------------------------------------------
    split = [d for d in range(tl.ndim) if shards[d] > 1]
    grid_rows, grid_cols, row_dim, col_dim = _fold(shape, split)
    panels = []
    if col_dim is None:  # a 0-d tensor: one block
        only = blocks[()]
        panels.append(Panel(f"{name}[]", (0, 0), None, -1, (0, 1), (0, 1), ((only,),)))
        grid = (1, 1)
    else:
        grid = (math.prod(shards[d] for d in grid_rows), math.prod(shards[d] for d in grid_cols))
        for pos, fixed, indices in _slabs(shards, grid_rows, grid_cols, row_dim, col_dim):
            rows = tuple(tuple(blocks[index] for index in row) for row in indices)
            first = rows[0][0]
            ranges = [
                f"{first.bounds[d][0]}:{first.bounds[d][1]}" if d in fixed else ":"
                for d in range(tl.ndim)
            ]
            panels.append(
                Panel(
                    title=f"{name}[{', '.join(ranges)}]",
                    grid_pos=pos,
                    row_dim=row_dim,
                    col_dim=col_dim,
                    row_edges=_edges(shape[row_dim], tl.counts_per_dim[row_dim], tl.layout.cut)
                    if row_dim is not None else (0, 1),
                    col_edges=_edges(shape[col_dim], tl.counts_per_dim[col_dim], tl.layout.cut),
                    blocks=rows,
                )
            )

    # -- device panels ------------------------------------------------------------
    device_panels, device_grid = _device_panels(tl, blocks)
    return LayoutPicture(
        name=name,
        shape=shape,
        tensor_layout=tl,
        panel_grid=grid,
        panels=tuple(panels),
        device_grid=device_grid,
        device_panels=device_panels,
        num_shards=len(blocks),
        notes=_notes(tl),
    )


def _blocks(tl: TensorLayout, shape: tuple[int, ...]) -> dict[tuple[int, ...], Block]:
    layout = tl.layout
    holders: dict[tuple[int, ...], list[int]] = {}
    for rank in range(layout.num_devices):
        holders.setdefault(tl.shard_index(rank), []).append(rank)
    out = {}
    for number, index in enumerate(product(*map(range, tl.shards_per_dim))):
        ranks = tuple(sorted(holders[index]))
        terms: dict[int, list[int]] = {}
        for rank in ranks:
            terms.setdefault(layout.group_index(rank, tl.partial), []).append(rank)
        grouped = tuple(tuple(terms[k]) for k in sorted(terms))
        out[index] = Block(
            shard_number=number,
            shard_index=index,
            bounds=tl.bounds(ranks[0], shape),
            ranks=ranks,
            terms=grouped,
            label=_label(grouped),
            partial=bool(tl.partial),
        )
    return out


def _device_panels(
    tl: TensorLayout, blocks: dict[tuple[int, ...], Block]
) -> tuple[tuple[DevicePanel, ...], tuple[int, int]]:
    layout = tl.layout
    sizes = layout.device_matrix
    names = layout.alias_name
    big = [i for i, n in enumerate(sizes) if n > 1]
    grid_rows, grid_cols, row_ax, col_ax = _fold(sizes, big, pad=False)
    panels = []
    for pos, fixed, coords in _slabs(sizes, grid_rows, grid_cols, row_ax, col_ax):
        rows = []
        for row in coords:
            cells = []
            for c in row:
                rank = layout.rank_of(c)
                block = blocks[tl.shard_index(rank)]
                cells.append(DeviceCell(rank, c, block.shard_number, f"r{rank}", block.partial))
            rows.append(tuple(cells))
        panels.append(
            DevicePanel(
                title=", ".join(f"{names[a]}={v}" for a, v in sorted(fixed.items())),
                grid_pos=pos,
                row_axis=names[row_ax] if row_ax is not None else None,
                col_axis=names[col_ax] if col_ax is not None else None,
                row_labels=_axis_labels(names, sizes, row_ax),
                col_labels=_axis_labels(names, sizes, col_ax),
                cells=tuple(rows),
            )
        )
    grid = (math.prod(sizes[a] for a in grid_rows), math.prod(sizes[a] for a in grid_cols))
    return tuple(panels), grid


def _axis_labels(names: Sequence[str], sizes: Sequence[int], axis: Optional[int]) -> tuple[str, ...]:
    """"c=0", "c=1", ... along a device panel's row or column axis ("" when it has none)."""
    if axis is None:
        return ("",)
    return tuple(f"{names[axis]}={i}" for i in range(sizes[axis]))


def _notes(tl: TensorLayout) -> tuple[str, ...]:
    notes = []
    for d, axes in enumerate(tl.tensor_map):
        if tl.num_shards(d) > 1:
            notes.append(
                f"dim {d} split over {format_entry(axes)} into {tl.num_shards(d)} shards"
            )
    copies = tl.copy_axes  # a size-1 axis makes no copies: nothing to say about it
    if copies:
        notes.append(f"replicated over {', '.join(copies)}: ranks listed together hold copies")
    if tl.partial:
        notes.append(partial_text(tl))
        if tl.addend_axes:
            notes.append("'+' joins the ranks holding the addends of a block (hatched in PNG pictures)")
        else:
            notes.append("partial blocks are hatched in PNG pictures")
    return tuple(notes)
