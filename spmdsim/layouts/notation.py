"""How layouts are written: a tensor-map entry read from the forms users write, and the short printed
forms of entries, tensor maps and moves.

A tensor-map entry is an alias, None/"None" or a tuple of aliases (spmdsim.layouts.layout.TensorLayout
reads its tensor map with `normalize_entry`). Pure Python; never imports mpi4py.
"""
from __future__ import annotations

import re
from functools import partial
from typing import Any, Callable, Mapping, Sequence, Union

from ..errors import LayoutError
from ..base.validate import as_int

__all__ = ["MapEntry", "normalize_entry", "format_entry", "format_tensor_map", "move_name", "dialect_hint",
           "DIALECT_FUNCTIONS", "numbered_map_by_name"]

#: One tensor-map entry as a user writes it: alias, None/"None", or tuple of aliases.
MapEntry = Union[str, None, Sequence[str]]


def _is_none(entry: object) -> bool:
    return entry is None or entry == "None"


def normalize_entry(entry: MapEntry) -> tuple[str, ...]:
    """Turn one user tensor-map entry into a tuple of axis names (() = not split)."""
    if _is_none(entry):
        return ()
    if isinstance(entry, str):
        return (entry,)
    if isinstance(entry, (tuple, list)):
        names = tuple(entry)
        for name in names:
            if not isinstance(name, str) or name == "None":
                number = " (an axis number, MindSpore's integer tensor_map: write the axis's name)" \
                    if as_int(name) is not None else ""
                raise LayoutError(f"tensor map tuple {entry!r} must hold axis names only, got {name!r}{number}")
        # A one-element tuple is the same as the bare alias; () stays 'not split'.
        return names
    if as_int(entry) is not None:  # MindSpore's tensor_map numbers the device matrix's axes from the right
        raise LayoutError(f"tensor map entry {entry!r} is an axis number (MindSpore's integer tensor_map, counted "
                          "from the right, -1 for none), which spmdsim does not read; expected an axis name, "
                          "None/'None' or a tuple of axis names: write the name of the axis it numbers")
    raise LayoutError(f"tensor map entry {entry!r} must be an axis name, None/'None' or a tuple of axis names")


#: A JAX PartitionSpec as written: P('x', None), PartitionSpec(...), jax.sharding.PartitionSpec(...).
_SPEC = re.compile(r"^\s*(?:jax\.sharding\.)?(?:PartitionSpec|P)\s*\(")
#: A placement of DTensor's or OneFlow's, a call: S(0), Shard(0), Replicate(), Partial(), Split(0), Broadcast().
_PLACEMENT = re.compile(r"^\s*(S|Shard|Replicate|Partial|Split|Broadcast)\s*\(")
#: The words of only one of the two: DTensor writes R and Shard, OneFlow B and Split; S(0) and P are both's.
_DTENSOR_WORDS = {"R", "Shard", "Replicate", "Partial"}
_SBP_WORDS = {"B", "Split", "Broadcast"}

#: The Python functions that read each dialect (docs/reference/dialects.md), for `dialect_hint`.
DIALECT_FUNCTIONS = {"placements": "placements_to_layout", "sbp": "sbp_to_layout",
                     "partition_spec": "partition_spec_to_layout"}


def dialect_hint(entry: str, entries: Sequence[Any], takes: Mapping[str, str], verb: str) -> str:
    """For a tensor-map entry written in another dialect (``S(0)``, ``Shard(0)``, ``P('x', None)``): what it is
    and what reads it, "'S(0)' is DTensor placement syntax: give the layout with --placements"; else "".

    `entries`, the map's others, tell DTensor's placements (R) from OneFlow's SBP (B); `takes` maps
    "placements", "sbp" and "partition_spec" to what reads each (a flag, a function), `verb` says how.
    """
    if not isinstance(entry, str):
        return ""
    if _SPEC.match(entry):
        kinds, syntax = ["partition_spec"], "a JAX PartitionSpec"
    elif _PLACEMENT.match(entry):
        words = {str(e).split("(")[0].strip() for e in (entry, *entries) if isinstance(e, str)}
        dtensor, sbp = bool(words & _DTENSOR_WORDS), bool(words & _SBP_WORDS)
        if dtensor != sbp:
            kinds, syntax = (["placements"], "DTensor placement syntax") if dtensor else (["sbp"], "OneFlow SBP syntax")
        else:
            kinds, syntax = ["placements", "sbp"], "DTensor placement (or OneFlow SBP) syntax"
    else:
        return ""
    readers = [takes[kind] for kind in kinds if kind in takes]
    if not readers:
        return ""
    return f"{entry!r} is {syntax}: {verb} {' or '.join(readers)}"


def numbered_map_by_name(entries: Sequence[Any], names: Sequence[str]) -> str:
    """For a tensor map with MindSpore's axis numbers in it (its integer tensor_map: axes counted from the right,
    -1 for none): "; this map by name is ("dp", None)", the map with each number written as the name of the axis
    of `names` it numbers; "" where an entry is a tuple, a number no axis has, or the map would name an axis twice."""
    written = []
    for entry in entries:
        number = as_int(entry)
        if isinstance(entry, str) and entry not in names and re.fullmatch(r"-?\d+", entry.strip()):
            number = int(entry)
        if number is not None:
            if not -1 <= number < len(names):
                return ""
            written.append(() if number == -1 else (names[len(names) - 1 - number],))
        elif entry is None or isinstance(entry, str):
            written.append(() if entry in (None, "None", "none") else (entry,))
        else:
            return ""
    named = [axis for axes in written for axis in axes]
    if not written or len(set(named)) != len(named):  # ("mp", 0): no map names "mp" twice
        return ""
    return f"; this map by name is {format_tensor_map(tuple(written))}"


def format_entry(axes: tuple[str, ...]) -> str:
    """Short form of one entry: None, "mp" or ("sp", "dp")."""
    if not axes:
        return "None"
    if len(axes) == 1:
        return f'"{axes[0]}"'
    return "(" + ", ".join(f'"{a}"' for a in axes) + ")"


def format_tensor_map(entries: tuple) -> str:
    """Short form of a tensor map: ("mp", ("sp", "dp")), or ("x",) for one dim."""
    # One entry keeps Python's tuple comma: ("x") would read as a string.
    return "(" + ", ".join(format_entry(e) for e in entries) + ("," if len(entries) == 1 else "") + ")"


def move_name(source: Any, target: Any) -> Callable[[], str]:
    """A redistribution's node's name in autograd's graph: a function making its text (`Node.describe`), of the
    two layouts alone (here, below the runtime and autograd: the executor keeps one per move it has planned)."""
    return partial(_move_name, source, target)


def _move_name(source: Any, target: Any) -> str:
    return f"redistribute {source} -> {target}"
