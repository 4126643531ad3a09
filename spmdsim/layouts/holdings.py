"""Who holds what: one line per rank naming the global block of each tensor it holds.

    rank 1 (0, 1, 0): x[0:128, 32:64], w[32:64, 0:192]

Pure (numpy only) and computed from the layouts alone, so one rank can print
every rank's line without any communication: the public "who holds what"
query, like JAX's ``devices_indices_map``. Accepts DTensors (anything with
``layout`` and ``global_shape``), ``(TensorLayout, shape)`` pairs, or
``(TensorLayout, shape, note)`` triples whose note follows the block: what a
layout cannot say, such as Paddle's zero padding row of a vocab-parallel table

    rank 1 (1,): table[500:1000, 0:48] + zero padding row (local (501, 48))
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import LayoutError
from .layout import TensorLayout

__all__ = ["block_text", "bounds_text", "holdings", "holdings_lines", "rank_blocks"]


def bounds_text(bounds: Sequence[tuple[int, int]]) -> str:
    """``[0:128, 32:64]`` for per-dim [start, stop) bounds."""
    return "[" + ", ".join(f"{a}:{b}" for a, b in bounds) + "]"


def block_text(layout: TensorLayout, shape: Sequence[int], rank: int) -> str:
    """``[0:128, 32:64]`` for `rank`'s block, with `` partial over mp`` for a pending sum."""
    text = bounds_text(layout.bounds(rank, shape))
    return text + (f" partial over {', '.join(layout.partial)}" if layout.partial else "")


def holdings_lines(tensors: Mapping[str, Any], ranks: Sequence[int] | None = None) -> list[str]:
    """One line per rank (all ranks of the device matrix, or `ranks`): each tensor's block.

    Args:
        tensors: name -> DTensor, (TensorLayout, global shape) or (TensorLayout, global shape,
            note); all on one device matrix.
        ranks: the ranks to list (default every rank, in order).
    """
    pairs = _checked(tensors)
    mesh = next(iter(pairs.values()))[0].layout
    chosen = range(mesh.num_devices) if ranks is None else ranks
    return [f"rank {r} {mesh.coords(r)}: {_blocks(pairs, r)}" for r in chosen]


def rank_blocks(tensors: Mapping[str, Any], rank: int) -> str:
    """``x[0:128, 32:64], w[32:64, 0:192]``: the blocks `rank` holds, without the rank prefix."""
    return _blocks(_checked(tensors), rank)


_Held = tuple[TensorLayout, tuple[int, ...], str]


def _blocks(pairs: Mapping[str, _Held], rank: int) -> str:
    return ", ".join(f"{name}{block_text(layout, shape, rank)}" + (f" {note}" if note else "")
                     for name, (layout, shape, note) in pairs.items())


def _checked(tensors: Mapping[str, Any]) -> dict[str, _Held]:
    """name -> (layout, shape, note), all on one device matrix, shapes checked against layouts."""
    if not hasattr(tensors, "items"):  # holdings([x, w]): the names are the dict's keys
        raise LayoutError(f"holdings takes a dict name -> tensor, got {type(tensors).__name__}; e.g. "
                          "holdings({'x': x, 'w': w}), the names its lines print")
    pairs = {name: _layout_and_shape(name, t) for name, t in tensors.items()}
    if not pairs:
        raise LayoutError("holdings needs at least one tensor")
    meshes = {layout.layout for layout, _, _ in pairs.values()}
    if len(meshes) > 1:
        raise LayoutError(f"holdings lists tensors of one device matrix, got {sorted(map(str, meshes))}")
    for layout, shape, _ in pairs.values():
        layout.check_shape(shape)
    return pairs


def holdings(tensors: Mapping[str, Any], ranks: Sequence[int] | None = None) -> str:
    """`holdings_lines` joined into one printable block."""
    return "\n".join(holdings_lines(tensors, ranks))


def _layout_and_shape(name: str, tensor: Any) -> _Held:
    if isinstance(tensor, tuple) and len(tensor) in (2, 3) and isinstance(tensor[0], TensorLayout):
        note = tensor[2] if len(tensor) == 3 else ""
        if not isinstance(note, str):
            raise LayoutError(f"holdings: the note of {name!r} is {note!r}; expected a string")
        return tensor[0], tuple(tensor[1]), note
    layout, shape = getattr(tensor, "layout", None), getattr(tensor, "global_shape", None)
    if not isinstance(layout, TensorLayout) or shape is None:
        raise LayoutError(f"holdings: {name!r} is of type {type(tensor).__name__}; expected a "
                          "DTensor, a (TensorLayout, shape) pair or a (TensorLayout, shape, note) "
                          "triple")
    return layout, tuple(shape), ""
