"""A teaching case's record and the checks every form of it shares (spmdsim.tools.cli.cases reads the
layout form, spmdsim.tools.cli.case_dialects the dialect forms): its keys, its device counts, its mesh axis
names and the one-line refusals that name a bad key as the user gave it. Pure: never imports mpi4py.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from ...base.validate import counted
from ...layouts.dialects._common import parse_name_list, parse_tensor_map, ranks_shape, split_top_level
from ...errors import DialectError, SpmdsimError
from ...layouts.layout import TensorLayout, default_axis_names
from ...layouts.notation import dialect_hint
from .mesh_text import framework_mesh_hint

__all__ = ["Case", "MAX_DEVICES", "check_device_count", "checked_axis_names", "multi_axis_hint", "integer_map_hint",
           "default_names", "mesh_names", "world_size_mismatch", "with_partial_axes", "indivisible",
           "parse_int_list", "ranks_mesh", "mesh_sizes", "sharding_as_mesh", "dialect_flags", "led_by_flag"]

#: Most devices a layout may have here: the commands list or compare every rank,
#: and a teaching tool that answers after minutes (or never) has failed.
MAX_DEVICES = 65536

_LAYOUT_KEYS = ("device_matrix", "alias_name", "tensor_map")
_STRATEGY_KEYS = ("strategy", "world_size", "operand")
_SBP_KEYS = ("sbp", "placement")
# Free-text keys a teacher may put in a case file; ignored.
_NOTE_KEYS = ("name", "comment", "description")
_DTENSOR_KEYS = ("placements",)  # + device_matrix, optional alias_name (mesh dim names)
_SPEC_KEYS = ("partition_spec",)  # + device_matrix, optional alias_name (mesh axis names)
_KNOWN_KEYS = (_LAYOUT_KEYS + _STRATEGY_KEYS + _SBP_KEYS + _DTENSOR_KEYS + _SPEC_KEYS + ("shape", "partial", "cut")
               + _NOTE_KEYS)
# The keys that say which form a case is written in.
_FORM_TRIGGERS = {"layout": _LAYOUT_KEYS, "strategy": ("strategy",), "sbp": _SBP_KEYS,
                  "dtensor": _DTENSOR_KEYS, "partition_spec": _SPEC_KEYS}


@dataclass(frozen=True)
class Case:
    """A tensor layout, the global shape, and which dialect it was written in."""

    tensor_layout: TensorLayout
    shape: tuple[int, ...]
    source: str = "layout"  # "layout", "strategy", "sbp", "dtensor" or "partition_spec"
    strategy: Optional[tuple[int, ...]] = None
    sbp: Optional[tuple[str, ...]] = None

    def to_dict(self) -> dict[str, Any]:
        """The case in Layout form (what every dialect converts to)."""
        tl = self.tensor_layout
        out: dict[str, Any] = {
            "device_matrix": list(tl.layout.device_matrix),
            "alias_name": list(tl.layout.alias_name),
            "tensor_map": [_entry_json(axes) for axes in tl.tensor_map],
            "shape": list(self.shape),
        }
        if tl.partial:
            out["partial"] = list(tl.partial)
        if tl.layout.cut != "even":
            out["cut"] = tl.layout.cut
        return out


def _entry_json(axes: tuple[str, ...]) -> Any:
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else list(axes)


def check_device_count(devices: int, what: str, limit: int = MAX_DEVICES) -> None:
    """Raise SpmdsimError when `devices` (given by `what`) is above `limit`."""
    if devices > limit:
        raise SpmdsimError(
            f"{what} has {devices:,} devices; expected at most {limit:,} "
            "(every rank is listed or compared, which would take too long)"
        )


# -- JSON values ----------------------------------------------------------------
def _int_list(data: Mapping, key: str, what: str, minimum: int) -> tuple[int, ...]:
    value = data[key]
    if isinstance(value, str):
        value = parse_int_list(value, f"case key {key!r}")
    if not isinstance(value, (list, tuple)) or any(
        isinstance(v, bool) or not isinstance(v, int) or v < minimum for v in value
    ):
        raise SpmdsimError(f"case key {key!r} must be a list of {what}, got {value!r}")
    return tuple(value)


def _device_count_checked(data: Mapping, key: str) -> tuple[int, ...]:
    """The device matrix (or placement) under `key`: positive integers, at most MAX_DEVICES devices (a placement
    may be written as its ranks, as OneFlow writes it: `ranks_mesh`)."""
    ranks = ranks_mesh(data[key], f"case key {key!r}") if key == "placement" else None
    matrix = ranks or _int_list(data, key, "positive integers", 1)
    check_device_count(math.prod(matrix), _flag_text(key, matrix))
    return matrix


def _flag_text(key: str, value: Any) -> str:
    """A case value in messages as the flag that gives it, with its key: ``--alias 'a' (case key 'alias_name')``
    (a user of the flags never typed the key, a user of a case file never typed the flag)."""
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    return f"{_FLAG_OF.get(key, key)} {value!r} (case key {key!r})"


def mesh_names(data: Mapping, matrix: Sequence[int]) -> tuple[str, ...]:
    """The case's "alias_name" (``--alias``) for the mesh `matrix`: one distinct name per axis, each refused
    naming the flag and the key (the Layout's own message names its fields, alias_name and device_matrix)."""
    names = _name_list(data, "alias_name")
    return checked_axis_names(names, _flag_text("alias_name", names), f"--device-matrix {','.join(map(str, matrix))!r}",
                              len(matrix))


def checked_axis_names(names: tuple[str, ...], given: str, mesh: str, axes: int) -> tuple[str, ...]:
    """`names`, one distinct name per axis of a mesh of `axes` axes, or the one-line refusal naming what gave
    them (`given`: "--alias 'a'") and the mesh (`mesh`: "--device-matrix '2,2'")."""
    if len(names) != axes:
        example = ",".join(default_axis_names(axes) if axes > 26 else "abcdefghijklmnopqrstuvwxyz"[:axes])
        raise SpmdsimError(f"{given} gives {counted(len(names), 'name')} for the {counted(axes, 'axis')} of {mesh}; "
                           f"expected one name per axis, such as {example}")
    for name in names:  # (a quote, comma, bracket, space or control character: the printed layouts broke on it)
        odd = next((c for c in name if c in "\"'(),[]" or c.isspace() or not c.isprintable()), None)
        if not name or name in ("None", "none", "null") or odd is not None:
            why = "which a tensor map reads as a dim not split" if odd is None else f"with {odd!r} in it"
            raise SpmdsimError(f"{given} names an axis {name!r}, {why}; expected other names, such as dp or mp_2")
    repeated = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if repeated is not None:
        raise SpmdsimError(f"{given} names axis {repeated!r} twice; expected one distinct name per axis of {mesh}")
    return names


def _name_list(data: Mapping, key: str) -> tuple[str, ...]:
    value = data[key]
    if isinstance(value, str):
        value = parse_name_list(value, f"case key {key!r}")
    if not isinstance(value, (list, tuple)) or any(not isinstance(v, str) for v in value):
        raise SpmdsimError(f"case key {key!r} must be a list of axis names, got {value!r}")
    return tuple(value)


def dialect_flags(prefix: str = "") -> dict[str, str]:
    """The flags that take a layout in the other dialects ("placements" -> "--placements"; `prefix` "from-":
    plan's --from-placements), which the refusal of a tensor map written in one names."""
    return {"placements": f"--{prefix}placements", "sbp": f"--{prefix}sbp",
            "partition_spec": f"--{prefix}partition-spec"}


#: A case file's keys for the other dialects, with their flags: what a tensor map written in one names.
_CASE_DIALECTS = {kind: f"{flag} (case key {kind!r})" for kind, flag in dialect_flags().items()}


def _tensor_map(data: Mapping) -> tuple:
    value = data["tensor_map"]
    if isinstance(value, str):
        return parse_tensor_map(value, takes=_CASE_DIALECTS)
    if not isinstance(value, (list, tuple)):
        raise SpmdsimError(
            f"case key 'tensor_map' must be a list of entries (axis name, null or list "
            f"of axis names), got {value!r}"
        )
    for entry in value:
        hint = dialect_hint(entry, value, _CASE_DIALECTS, "give the layout with")
        if hint:
            raise SpmdsimError(f"case key 'tensor_map' entry {entry!r} is not an axis name; {hint}")
        ok = entry is None or isinstance(entry, str) or (
            isinstance(entry, (list, tuple)) and all(isinstance(a, str) for a in entry)
        )
        if not ok:
            matrix, names = data.get("device_matrix"), data.get("alias_name")
            if not (isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names)):
                names = default_axis_names(len(matrix)) if isinstance(matrix, (list, tuple)) else ()
            raise SpmdsimError(
                f"case key 'tensor_map' entry {entry!r} must be an axis name, null or a "
                f"list of axis names{integer_map_hint(value, names, json_form=True)}"
            )
    return tuple(tuple(e) if isinstance(e, list) else e for e in value)


def multi_axis_hint(entries: Sequence[Any], ndim: int) -> str:
    """For a map of plain axis names too long for a 1-D tensor: how to write them as one entry.

    "(b,a)" parses like a Python tuple, as two entries b and a; the user may
    have meant one dim split over b then a. Returns "" when that reading does
    not fit (the map is short enough, or holds None or a tuple).
    """
    names = []
    for entry in entries:
        if isinstance(entry, (tuple, list)) and len(entry) == 1:
            entry = entry[0]
        if not isinstance(entry, str) or entry in ("None", "none", "null"):
            return ""
        names.append(entry)
    if ndim != 1 or len(names) <= 1:
        return ""
    flag = ",".join(names)
    return (
        f'; for one dim split over {" then ".join(names)}, write "(({flag}))" '
        f"(JSON: {json.dumps([names])})"
    )


# The flag that gives each case key, for messages: a user of the flags never typed the key.
_FLAG_OF = {"device_matrix": "--device-matrix", "alias_name": "--alias", "tensor_map": "--tensor-map",
            "shape": "--shape", "placement": "--placement", "placements": "--placements",
            "partition_spec": "--partition-spec", "sbp": "--sbp", "strategy": "--strategy",
            "world_size": "--world-size", "operand": "--operand", "partial": "--partial", "cut": "--cut"}


def _axis_number(entry: Any) -> Optional[int]:
    """`entry` as an axis number (1, -1, "1", "-1"), or None where it is none."""
    if isinstance(entry, int) and not isinstance(entry, bool):
        return entry
    if isinstance(entry, str) and entry.lstrip("-").isdigit() and entry.count("-") <= 1:
        return int(entry)
    return None


def integer_map_hint(entries: Sequence[Any], names: Sequence[str], json_form: bool = False) -> str:
    """For a tensor map holding axis numbers (MindSpore's integer tensor_map: axes counted from the right,
    -1 for none), which spmdsim does not read: the hint (layout.py's words), with the map written by the
    names of `names` (the mesh axes) where every entry is such a number for them."""
    numbers = [_axis_number(e) for e in entries]
    if not any(n is not None for n in numbers):
        return ""
    hint = " (an axis number? MindSpore's integer tensor_map is not read: write the axis's name"
    if names and all(n is not None and -1 <= n < len(names) for n in numbers):
        written = [None if n == -1 else names[len(names) - 1 - n] for n in numbers]
        hint += (f"; this map by name is {json.dumps(written)}" if json_form else
                 f"; this map by name is --tensor-map {','.join(str(w) for w in written)}")
    return hint + ")"


def default_names(count: int, entries: Sequence[Any], partial: Sequence[str], form: str) -> tuple[str, ...]:
    """The mesh axis names of a case without "alias_name": ``axis_0, axis_1, ...``, as everywhere
    (docs/reference/dialects.md). A case that names other axes in its map (or `partial`) lacks its --alias."""
    names = default_axis_names(count)
    used = [a for e in entries for a in ((e,) if isinstance(e, str) else e if isinstance(e, (list, tuple)) else ())]
    unknown = [a for a in [*used, *partial] if isinstance(a, str) and a not in names + ("None", "none", "null")]
    if unknown:
        hint = integer_map_hint(entries, names) if form == "layout" and _axis_number(unknown[0]) is not None else ""
        raise SpmdsimError(f"--alias is missing (case key 'alias_name'), needed by the {form} form: axis "
                           f"{unknown[0]!r} is none of the default names {', '.join(names)}{hint}")
    return names


def world_size_mismatch(world: Any, key: str, matrix: Sequence[int]) -> str:
    """Why ``--world-size`` (case key "world_size") does not go with the mesh under `key`: the flags and keys."""
    devices = math.prod(matrix)
    return (f"{_flag_text('world_size', world)} does not match {_flag_text(key, matrix)}, which has "
            f"{counted(devices, 'device')}; expected {devices} (or leave --world-size out)")


def _require(data: Mapping, keys: Sequence[str], form: str) -> None:
    for key in keys:
        if key not in data:
            raise SpmdsimError(f"{_FLAG_OF.get(key, key)} is missing (case key {key!r}), "
                               f"needed by the {form} form")


def with_partial_axes(tl: TensorLayout, partial: Sequence[str], given: str,
                      named: Callable[[str], str]) -> TensorLayout:
    """`tl` with the `partial` axes added to those it holds pending already (an SBP's P, DTensor's Partial).

    `given` names the dialect value `tl` was read from as the user wrote it (``--placements 'S(0),R'``) and
    `named(axis)` the flag that gave an axis: an axis that cannot be pending is refused in those terms, not
    in those of the tensor map the value became (``("axis_0", None)``), which the user never wrote.
    """
    if not partial:
        return tl
    names = tl.layout.alias_name
    for axis in partial:
        if axis not in names:
            raise SpmdsimError(f"{named(axis)} is no mesh axis of {given}; expected one of {', '.join(names)}")
        split = [d for d, axes in enumerate(tl.tensor_map) if axis in axes]
        if split:
            free = [a for a in names if a not in tl.split_axes]
            way = (f"expected an axis the tensor is not split over: {', '.join(free)}" if free else
                   "every mesh axis splits the tensor, none is left to hold pending sums")
            raise SpmdsimError(f"{named(axis)}: {given} splits tensor dim {split[0]} over mesh axis {axis!r}, "
                               f"which cannot also hold pending sums; {way}")
    return tl.with_partial(tuple(tl.partial) + tuple(p for p in partial if p not in tl.partial))


def indivisible(tl: TensorLayout, shape: Sequence[int]) -> bool:
    """Whether a dim of `shape` does not divide by its shard count under `tl` (a shape of tl's rank)."""
    return len(shape) == tl.ndim and any(n % k for n, k in zip(shape, tl.shards_per_dim))


def parse_int_list(text: str, key: str = "value") -> tuple[int, ...]:
    """'2,1,2' or '(2, 1, 2)' -> (2, 1, 2); '' or '()' -> () (a scalar's shape)."""
    try:
        parts = split_top_level(text)
        values = tuple(int(p) for p in parts if p)
    except ValueError:
        raise SpmdsimError(framework_mesh_hint(text, key) or f"{key} {text!r} must be comma-separated integers such "
                           f"as 2,4{_names_not_sizes(text, key)}") from None
    if len(values) != len(parts) and parts != [""]:  # '4,,2': a size left out, not a shape of 2 dims
        raise SpmdsimError(f"{key} {text!r} has an empty entry; expected comma-separated integers such as 2,4")
    return values


def _names_not_sizes(text: str, key: str) -> str:
    """What a mesh's sizes given as names add ('dp,mp', a JAX spec's "('x',None)"): where names and splits go."""
    words = [w.strip().strip("'\"") for w in str(text).strip().strip("()[]").split(",")]
    if "device" not in key.replace("_", "-") or not all(w.isidentifier() for w in words if w):
        return ""
    return " (the mesh's sizes; its axes' names go in --alias, a tensor's split over them in --tensor-map)"


def ranks_mesh(value: object, flag: str) -> Optional[tuple[int, ...]]:
    """The shape of a mesh written as its ranks, as OneFlow's ``flow.placement("cpu", ranks=[[0, 1], [2, 3]])``
    writes it, read as the Python API reads it (`ranks_shape`): text (``[[0,1],[2,3]]`` is 2,2; ``0,1,2,3`` is 4)
    or a JSON list; None for anything else (a shape, text that is no list), which the caller reads as before.
    Ranks in another order than spmdsim's row-major one are one line naming `flag` and the value."""
    ranks = _rank_items(value) if isinstance(value, str) else value
    if isinstance(value, str) and ranks is None and any(c in "([" for c in value.strip()[1:]):
        raise SpmdsimError(framework_mesh_hint(value, flag) or f"{flag} {value!r} is not a mesh; expected sizes "
                           "such as 2,4, or its ranks such as [[0,1],[2,3]] (rectangular, integers)")
    if not isinstance(ranks, (list, tuple)) or not ranks:
        return None
    try:  # (a flat list other than 0..n-1 is no ranks array: None)
        return ranks_shape(ranks, flag)
    except DialectError as exc:  # named as the user wrote it
        raise SpmdsimError(str(exc).replace(f"{flag} {ranks!r}", f"{flag} {value!r}", 1)) from None


def mesh_sizes(text: str, flag: str, takes: Optional[Mapping[str, str]] = None) -> tuple[int, ...]:
    """A mesh flag's sizes: '2,2', or the mesh's ranks as OneFlow's placement writes them, '[[0,1],[2,3]]'.
    A sharding written there ('S(0),R' for --placement, the mesh, where --placements was meant) is refused
    naming the flag of `takes` (dialect_flags) that reads it."""
    try:
        return ranks_mesh(text, flag) or parse_int_list(text, flag)
    except SpmdsimError:
        hint = sharding_as_mesh(text, flag, takes or {})
        if hint:
            raise SpmdsimError(hint) from None
        raise


def sharding_as_mesh(text: object, flag: str, takes: Mapping[str, str]) -> str:
    """"--placement 'S(0),R' is a sharding, not a mesh: 'S(0)' is DTensor placement syntax: give the layout
    with --placements; expected the mesh's sizes, such as --placement 2,4" for a mesh flag given a layout in
    another dialect's syntax, else ""."""
    try:
        parts = [part.strip() for part in split_top_level(text)] if isinstance(text, str) else []
    except ValueError:
        return ""
    said = next(filter(None, (dialect_hint(part, parts, takes, "give the layout with") for part in parts)), "")
    return f"{flag} {text!r} is a sharding, not a mesh: {said}; expected the mesh's sizes, such as {flag} 2,4" \
        if said else ""


def _rank_items(text: str) -> Optional[list]:
    """'[[0,1],[2,3]]' -> [[0, 1], [2, 3]]; None for text that is not brackets of integers."""
    try:
        return [_rank_item(part) for part in split_top_level(text)]
    except (ValueError, RecursionError):
        return None


def _rank_item(part: str) -> Any:
    """One entry of `_rank_items`: an integer, or a bracketed list of entries (ValueError for anything else)."""
    part = part.strip()
    if part[:1] in "([":
        inner = split_top_level(part)
        if inner == [part]:  # '(0)(1)': no one pair encloses it
            raise ValueError(part)
        return [_rank_item(p) for p in inner]
    return int(part)


def led_by_flag(lead: str, text: str, read: Callable[[], Any], renamed: Optional[Mapping[str, str]] = None) -> Any:
    """``read()``, its refusal led by `lead`, the flag that gave `text` with its value (``--w-sbp 'B,S(3)'``): a
    command that takes several layouts says whose, where "sbp 'Q' in 'S(0),Q' is not valid" did not. The value
    quoted again (" in 'S(0),Q'", "strategy '(2,Q)' is") is dropped, the exception type kept; a refusal that
    leads with a flag already stays as it is. `renamed`: texts of the refusal to write otherwise (a flag that
    this command spells another way)."""
    try:
        return read()
    except SpmdsimError as exc:
        message = str(exc)
        if message.startswith("--"):
            raise
        quoted = message.find(f" {text!r}") if text else -1
        if f" in {text!r}" in message:
            message = message.replace(f" in {text!r}", "", 1)
        elif 0 <= quoted and message[:quoted].count(" ") < 2:  # "tensor map 'a,zz' has ...": the lead quotes it
            message = message[:quoted] + message[quoted + len(repr(text)) + 1:]
        for said, meant in (renamed or {}).items():
            message = message.replace(said, meant)
        raise type(exc)(f"{lead}: {message}") from None
