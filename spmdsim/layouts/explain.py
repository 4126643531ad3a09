"""The shard derivation a teacher shows: number, reorder, compute (MindSpore's Layout tutorial).

MindSpore's tutorial derives which shard each card holds in three steps:

1. number the device matrix right to left (mixed radix, last axis fastest);
2. reorder the columns by the tensor map, dropping axes it does not use;
3. with strides over the new order, shard number = sum(index * stride).

The shard number is the row-major number of the rank's block among all
blocks, so with a 0..n-1 arange tensor cut into one-element shards rank r
holds exactly its shard number. Pure: numpy only.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from .holdings import bounds_text
from .slicing import shard_sizes
from .layout import TensorLayout
from .notation import format_entry, format_tensor_map
from ..base.validate import counted

__all__ = ["RankRow", "Explanation", "explain", "format_explanation", "explanation_to_dict", "partial_text"]

#: Largest global tensor for which the arange demo values are computed.
MAX_VALUE_ELEMENTS = 1 << 16
#: Width of the values column of the text table before "...".
_TEXT_VALUE_CHARS = 20


@dataclass(frozen=True)
class RankRow:
    """One rank's line through the three steps."""

    rank: int
    coords: tuple[int, ...]  # step 1: one index per device-matrix axis
    map_coords: tuple[int, ...]  # step 2: the indices in tensor-map order
    shard_number: int  # step 3
    shard_index: tuple[int, ...]  # per tensor dim
    bounds: tuple[tuple[int, int], ...]  # per tensor dim, half-open
    values: Optional[tuple[int, ...]] = None  # the rank's arange values, flattened


@dataclass(frozen=True)
class Explanation:
    """Every table of the derivation for one tensor layout and shape."""

    tensor_layout: TensorLayout
    shape: tuple[int, ...]
    map_axes: tuple[str, ...]  # split axes in tensor-map order (first listed major)
    map_dims: tuple[int, ...]  # the tensor dim each of map_axes splits
    map_strides: tuple[int, ...]
    dropped: tuple[str, ...]  # device axes the tensor map does not use
    rows: tuple[RankRow, ...]
    strategy: Optional[tuple[int, ...]] = None
    values_requested: bool = True  # False: the caller asked for no values (--no-values)

    @property
    def axes(self) -> tuple[str, ...]:
        return self.tensor_layout.layout.alias_name

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.tensor_layout.layout.device_matrix

    @property
    def map_sizes(self) -> tuple[int, ...]:
        return tuple(self.tensor_layout.layout.axis_size(a) for a in self.map_axes)

    @property
    def shard_numbers(self) -> tuple[int, ...]:
        return tuple(row.shard_number for row in self.rows)


def partial_text(tensor_layout: TensorLayout) -> Optional[str]:
    """The sentence on pending sums that explain, show and slices share (None if not partial)."""
    tl = tensor_layout
    if not tl.partial:
        return None
    axes = ", ".join(tl.partial)
    if not tl.addend_axes:
        return f"partial over {axes}: an axis of size 1 has one addend, so each block is the whole value"
    return f"partial over {axes}: ranks differing only there hold addends, not copies; the value is their sum"


def _keeps_value(tensor_layout: TensorLayout, coords: Sequence[int]) -> bool:
    """Whether the rank at `coords` holds the demo values of a partial block (the others hold zeros).

    The global value is the sum of the addends, so only one addend may carry
    the values: the rank at coordinate 0 on every partial axis (as B -> P does).
    """
    layout = tensor_layout.layout
    return all(coords[layout.axis_index(a)] == 0 for a in tensor_layout.partial)


def _strides(sizes: Sequence[int]) -> tuple[int, ...]:
    """Row-major strides: each is the product of the sizes after it."""
    return tuple(math.prod(sizes[i + 1:]) for i in range(len(sizes)))


def explain(tensor_layout: TensorLayout, shape: Sequence[int], *, strategy: Optional[Sequence[int]] = None,
            values: bool = True) -> Explanation:
    """Derive, for every rank, its coordinates, shard number, slice and arange values.

    Args:
        tensor_layout: the layout to explain.
        shape: the global shape (every split dim must divide evenly).
        strategy: the `.shard` strategy the layout came from, if any (changes the wording).
        values: attach each rank's values of ``arange(prod(shape)).reshape(shape)``
            (skipped for tensors over MAX_VALUE_ELEMENTS elements). With partial
            axes one addend of each block holds them and the others zeros.
    """
    shape = tensor_layout.check_shape(shape)
    layout = tensor_layout.layout
    map_axes = tensor_layout.split_axes
    map_dims = tuple(d for d, axes in enumerate(tensor_layout.tensor_map) for _ in axes)
    map_strides = _strides([layout.axis_size(a) for a in map_axes])
    positions = [layout.axis_index(a) for a in map_axes]
    dropped = tuple(a for a in layout.alias_name if a not in map_axes)
    arange = None
    if values and math.prod(shape) <= MAX_VALUE_ELEMENTS:
        arange = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    rows = []
    for rank in range(layout.num_devices):
        coords = layout.coords(rank)
        map_coords = tuple(coords[p] for p in positions)
        bounds = tensor_layout.bounds(rank, shape)
        local = None
        if arange is not None:
            block = arange[tuple(slice(a, b) for a, b in bounds)]
            if not _keeps_value(tensor_layout, coords):
                block = np.zeros_like(block)
            local = tuple(int(v) for v in block.ravel())
        shard_number = sum(c * s for c, s in zip(map_coords, map_strides))
        rows.append(RankRow(rank, coords, map_coords, shard_number, tensor_layout.shard_index(rank), bounds, local))
    return Explanation(tensor_layout, shape, map_axes, map_dims, map_strides, dropped, tuple(rows),
                       tuple(strategy) if strategy is not None else None, values)


# -- text ----------------------------------------------------------------------------
def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], left: Sequence[int] = ()) -> list[str]:
    """Columns separated by two spaces, right-aligned except the `left` ones."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for row in cells:
        parts = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        out.append(("  " + "  ".join(parts)).rstrip())
    return out


def _values_text(values: Optional[Sequence[int]]) -> str:
    if values is None:
        return "-"
    shown: list[str] = []
    for v in values:
        if len(" ".join(shown + [str(v)])) > _TEXT_VALUE_CHARS:
            return " ".join(shown) + f" ... ({len(values)} values)"
        shown.append(str(v))
    return " ".join(shown)


def _headline(ex: Explanation) -> list[str]:
    tl = ex.tensor_layout
    layout = tl.layout
    names = ", ".join(f'"{a}"' for a in layout.alias_name) + ("," if len(layout.alias_name) == 1 else "")
    lines = []
    if ex.strategy is not None:
        lines += _wrap(f"strategy {ex.strategy!r} on {counted(layout.num_devices, 'rank')}: the device matrix is "
                       "the strategy and the tensor map takes the dims in order (MindSpore's tensor_map "
                       f"{tuple(range(len(ex.strategy) - 1, -1, -1))!r}), so step 2 keeps the axis order.")
        if layout.num_devices > math.prod(ex.strategy):
            lines += _wrap(f"The strategy uses {math.prod(ex.strategy)} of {counted(layout.num_devices, 'rank')}: "
                           "the extra axis on the right repeats the calculation.")
    cut = "" if layout.cut == "even" else f", cut={layout.cut!r}"
    table = _table(["layout", f"Layout({layout.device_matrix!r}, ({names}){cut})"],
                   [["tensor map", format_tensor_map(tl.tensor_map)], ["shape", str(ex.shape)]]
                   + ([["partial", ", ".join(tl.partial)]] if tl.partial else []), left=(0, 1))
    return lines + [line[2:] for line in table]


def _cut_lines(ex: Explanation) -> list[str]:
    """How the uneven cut gives each shard number its range, for the dims whose pieces differ."""
    tl = ex.tensor_layout
    lines = []
    for d in tl.uneven_dims(ex.shape):
        size, n, counts = ex.shape[d], tl.shards_per_dim[d], tl.counts_per_dim[d]
        split = tuple(k for k in counts if k > 1)
        if tl.layout.cut == "chunk" and len(split) > 1:  # DTensor's nested Shard: axis by axis
            rule = (f"pieces of ceil({size}/{split[0]}) = {-(-size // split[0])}, the last ones short or empty, "
                    f"each cut again the same way into {' then '.join(map(str, split[1:]))}")
        elif tl.layout.cut == "chunk":
            rule = f"pieces of ceil({size}/{n}) = {-(-size // n)}, the last ones short or empty"
        else:
            rule = f"{counted(size % n, 'piece')} of {size // n + 1}, then pieces of {size // n}"
        sizes = " ".join(str(k) for k in shard_sizes(size, counts, tl.layout.cut))
        lines += _wrap(f"Dim {d} of size {size} does not divide into {n} shards: cut {tl.layout.cut!r} "
                       f"gives {rule} (sizes by shard: {sizes}).")
    return lines


def _wrap(text: str) -> list[str]:
    return textwrap.wrap(text, width=78)


def format_explanation(ex: Explanation) -> str:
    """The derivation as plain-text tables (what `spmdsim explain` prints)."""
    lines = _headline(ex) + ["",
                             "Step 1. Number the device matrix right to left: the last axis varies",
                             "        fastest and each axis counts in base its size (mixed radix).", ""]
    lines += _table(["axis"] + list(ex.axes), [["size"] + list(ex.sizes)], left=(0,)) + [""]
    lines += _table(["rank"] + list(ex.axes), [[r.rank] + list(r.coords) for r in ex.rows]) + [""]
    lines += ["Step 2. Reorder the columns by the tensor map; drop the axes it does not use.", ""]
    if ex.map_axes and ex.map_axes == tuple(a for a in ex.axes if a in ex.map_axes):
        lines.append("  (the tensor map already lists its axes in device-matrix order)")
    if ex.dropped:
        lines += [f"  dropped (not in the tensor map): {', '.join(ex.dropped)}", ""]
    if ex.map_axes:
        lines += _table(["axis"] + list(ex.map_axes), [["tensor dim"] + list(ex.map_dims)], left=(0,)) + [""]
        lines += _table(["rank"] + list(ex.map_axes), [[r.rank] + list(r.map_coords) for r in ex.rows])
    else:
        lines.append("  the tensor map splits nothing: every rank holds the whole tensor")
    lines += ["", "Step 3. Stride of each axis = product of the sizes to its right (new order);",
              "        shard number = sum of index * stride.", ""]
    if ex.map_axes:
        lines += _table(["axis"] + list(ex.map_axes),
                        [["size"] + list(ex.map_sizes), ["stride"] + list(ex.map_strides)], left=(0,)) + [""]
    sums = []
    for r in ex.rows:
        terms = " + ".join(f"{c}*{s}" for c, s in zip(r.map_coords, ex.map_strides)) or "0"
        sums.append([r.rank, f"{terms} = {r.shard_number}"])
    lines += _table(["rank", "shard number"], sums, left=(1,))
    lines += ["", "Result. Each rank's block, and its values of arange(n).reshape(shape).", ""]
    cut = _cut_lines(ex)
    lines += cut + ([""] if cut else [])
    lines += _table(["rank", "shard", "index per dim", "slice", "values"],
                    [[r.rank, r.shard_number, str(r.shard_index), bounds_text(r.bounds), _values_text(r.values)]
                     for r in ex.rows], left=(2, 3, 4))
    lines += _notes(ex)
    return "\n".join(lines) + "\n"


def _major_formula(tensor_layout: TensorLayout, axes: Sequence[str]) -> str:
    """'i_c*|a|*|b| + i_a*|b| + i_b = i_c*4 + i_a*2 + i_b' for axes (c, a, b): mixed radix, first major."""
    sizes = [tensor_layout.layout.axis_size(a) for a in axes]
    symbolic, numeric = [], []
    for k, (axis, stride) in enumerate(zip(axes, _strides(sizes))):
        later = "".join(f"*|{a}|" for a in axes[k + 1:])
        symbolic.append(f"i_{axis}{later}")
        numeric.append(f"i_{axis}*{stride}" if k < len(axes) - 1 else f"i_{axis}")
    return " + ".join(symbolic) + " = " + " + ".join(numeric)


def _replica_note(tensor_layout: TensorLayout) -> Optional[str]:
    axes = tensor_layout.copy_axes
    if not axes:
        return None  # size-1 axes alone make no copies
    groups = tensor_layout.layout.axis_groups(axes)
    shown = ", ".join(str(g) for g in groups[:4]) + (", ..." if len(groups) > 4 else "")
    which = f"axis {axes[0]} is" if len(axes) == 1 else f"axes {', '.join(axes)} are"
    return f"{which} not in the tensor map: ranks that differ only there hold the same shard (replicas): {shown}."


def _partial_note(ex: Explanation) -> Optional[str]:
    tl = ex.tensor_layout
    text = partial_text(tl)
    if text is None:
        return None
    if not tl.addend_axes or ex.rows[0].values is None:
        return text + "."
    zero = ", ".join(f"{a}=0" for a in tl.partial)
    return (f"{text}. In the arange demo the rank with {zero} holds the values and the other "
            "addends hold zeros (one addend keeps the value, as B -> P does), so the sum is arange.")


def _values_note(ex: Explanation) -> Optional[str]:
    if not ex.rows or any(r.values is not None for r in ex.rows):
        return None
    if not ex.values_requested:
        return "values omitted because --no-values was given."
    return f"values omitted: the arange demo is for tensors up to {MAX_VALUE_ELEMENTS} elements."


def _notes(ex: Explanation) -> list[str]:
    tl = ex.tensor_layout
    notes = []
    for d, axes in enumerate(tl.tensor_map):
        if len(axes) > 1:
            notes.append(f"tensor dim {d} is split over {format_entry(axes)}: the first listed axis "
                         f"is major (mixed radix: shard = {_major_formula(tl, axes)}).")
    notes += [n for n in (_replica_note(tl), _partial_note(ex), _values_note(ex)) if n]
    out = [""] if notes else []
    for note in notes:
        out += _wrap("Note: " + note)
    return out


# -- JSON -----------------------------------------------------------------------------
def _entry_json(axes: tuple[str, ...]) -> Any:
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else list(axes)


def explanation_to_dict(ex: Explanation) -> dict[str, Any]:
    """The derivation as plain JSON-ready data (what `spmdsim explain --json` prints)."""
    tl = ex.tensor_layout
    return {
        "device_matrix": list(ex.sizes),
        "alias_name": list(ex.axes),
        "tensor_map": [_entry_json(axes) for axes in tl.tensor_map],
        "partial": list(tl.partial),
        "shape": list(ex.shape),
        "strategy": list(ex.strategy) if ex.strategy is not None else None,
        "step1": {"axes": list(ex.axes), "sizes": list(ex.sizes)},
        "step2": {"axes": list(ex.map_axes), "tensor_dims": list(ex.map_dims), "dropped": list(ex.dropped)},
        "step3": {"axes": list(ex.map_axes), "sizes": list(ex.map_sizes), "strides": list(ex.map_strides)},
        "ranks": [{"rank": r.rank, "coords": list(r.coords), "map_coords": list(r.map_coords),
                   "shard_number": r.shard_number, "shard_index": list(r.shard_index),
                   "slice": [list(b) for b in r.bounds],
                   "values": list(r.values) if r.values is not None else None} for r in ex.rows],
        "replica_groups": [list(g) for g in tl.replica_groups()],
    }
