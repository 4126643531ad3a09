"""One tensor's "case" for the teaching commands: a layout (in any dialect) and a shape.

A case comes from a JSON object (a file argument or stdin) and/or command-line
flags; flags override keys of the file. One form per dialect:

* Layout: ``{"device_matrix": [2, 2, 2], "alias_name": ["dp", "sp", "mp"],
  "tensor_map": ["mp", ["sp", "dp"]], "shape": [32, 784]}``
* strategy: ``{"strategy": [[2, 1, 2, 2, 1]], "world_size": 8, "shape": [...]}``
* SBP: ``{"sbp": ["S(0)", "B"], "placement": [2, 4], "shape": [...]}``
* PyTorch DTensor: ``{"placements": "S(0), R", "device_matrix": [2, 4], "shape": [...]}``
  (``alias_name`` names the mesh dims, default axis_0, axis_1, ...)
* JAX: ``{"partition_spec": "('x', None)", "device_matrix": [2, 4], "alias_name": ["x", "y"],
  "shape": [...]}`` (a shorter spec is padded with None)

Without ``alias_name`` the mesh axes are ``axis_0, axis_1, ...`` in every form (docs/reference/dialects.md).

Each form may add ``"partial": [axis, ...]``, and ``"cut"``: the rule that cuts a dim
("even", "chunk" or "balanced"; docs/explanation/semantics.md, "Uneven shards"). The Layout form
takes any; DTensor placements cut a dim that does not divide as DTensor does
("chunk"); a JAX PartitionSpec only with a rule named; the strategy and SBP forms
cut evenly (MindSpore's rule; OneFlow's BalancedSplitter is not read: ONEFLOW_EVEN). Pure: never
imports mpi4py.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional, Sequence, TextIO

from ...layouts.dialects._common import parse_name_list, parse_partition_spec, parse_tensor_map, split_top_level
from ...base.validate import counted, loads_json
from ...errors import ShapeError, SpmdsimError
from ...layouts.layout import Layout, TensorLayout, default_axis_names
from ...layouts.slicing import CUTS

__all__ = [
    "Case",
    "case_from_dict",
    "case_from_args",
    "add_case_arguments",
    "parse_int_list",
    "flag_ints",
    "parse_name_list",
    "parse_tensor_map",
    "parse_partition_spec",
    "check_device_count",
    "multi_axis_hint",
    "with_partial_axes",
    "default_names",
    "mesh_names",
    "world_size_mismatch",
    "MAX_DEVICES",
]

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
    """The device matrix (or placement) under `key`: positive integers, at most MAX_DEVICES devices."""
    matrix = _int_list(data, key, "positive integers", 1)
    check_device_count(math.prod(matrix), _flag_text(key, matrix))
    return matrix


def _flag_text(key: str, value: Any) -> str:
    """A case value in messages as the flag that gives it, with its key: ``--alias 'a' (case key 'alias_name')``
    (a user of the flags never typed the key, a user of a case file never typed the flag)."""
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    return f"{_FLAG_OF.get(key, key)} {value!r} (case key {key!r})"


def _axes_text(count: int) -> str:
    return "1 axis" if count == 1 else f"{count} axes"


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
        raise SpmdsimError(f"{given} gives {counted(len(names), 'name')} for the {_axes_text(axes)} of {mesh}; "
                           f"expected one name per axis, such as {example}")
    for name in names:
        if not name or name in ("None", "none", "null"):
            raise SpmdsimError(f"{given} names an axis {name!r}, which a tensor map reads as a dim not split; "
                               "expected other names")
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


def _tensor_map(data: Mapping) -> tuple:
    value = data["tensor_map"]
    if isinstance(value, str):
        return parse_tensor_map(value)
    if not isinstance(value, (list, tuple)):
        raise SpmdsimError(
            f"case key 'tensor_map' must be a list of entries (axis name, null or list "
            f"of axis names), got {value!r}"
        )
    for entry in value:
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


def case_from_dict(data: Any) -> Case:
    """Build a Case from a decoded JSON object, naming any bad key."""
    if not isinstance(data, Mapping):
        raise SpmdsimError(f"a case must be a JSON object, got {data!r}")
    unknown = sorted(set(data) - set(_KNOWN_KEYS))
    if unknown:
        raise SpmdsimError(
            f"case has unknown key {unknown[0]!r}; expected keys among {_KNOWN_KEYS!r}"
        )
    forms = [name for name, keys in _FORM_TRIGGERS.items() if any(k in data for k in keys)]
    if "layout" in forms and "tensor_map" not in data and ("dtensor" in forms or "partition_spec" in forms):
        # device_matrix/alias_name give the mesh of those two forms as well.
        forms.remove("layout")
    if not forms:
        raise SpmdsimError(
            "case gives no layout: expected 'device_matrix'/'alias_name'/'tensor_map', "
            "'strategy' (+ 'world_size'), 'sbp' + 'placement', 'placements' + 'device_matrix' "
            "(PyTorch DTensor) or 'partition_spec' + 'device_matrix' (JAX)"
        )
    if len(forms) > 1:
        raise SpmdsimError(f"case mixes the {forms[0]} and {forms[1]} forms; give only one")
    form = forms[0]
    if "operand" in data and form != "strategy":
        raise SpmdsimError(f"{_flag_text('operand', data['operand'])} picks a tensor of a MatMul --strategy "
                           f"such as \"((2,1),(1,4))\"; the {form} form gives one tensor's layout already: "
                           "leave --operand out")
    _require(data, ("shape",), form)
    shape = _int_list(data, "shape", "non-negative integers", 0)
    partial = _name_list(data, "partial") if "partial" in data else ()
    cut = _cut(data, form)
    if form == "layout":
        _require(data, ("device_matrix", "tensor_map"), "layout")
        matrix, entries = _device_count_checked(data, "device_matrix"), _tensor_map(data)
        names = (mesh_names(data, matrix) if "alias_name" in data
                 else default_names(len(matrix), entries, partial, "layout"))
        layout = Layout(matrix, names, cut or "even")
        tl = layout(*entries, partial=partial)
        world = data.get("world_size", layout.num_devices)
        if world != layout.num_devices:
            raise SpmdsimError(world_size_mismatch(world, "device_matrix", matrix))
        case = Case(tl, shape, "layout")
    else:
        from . import case_dialects

        build = {"strategy": case_dialects.strategy_case, "sbp": case_dialects.sbp_case,
                 "dtensor": case_dialects.dtensor_case, "partition_spec": case_dialects.partition_spec_case}
        case = build[form](data, shape, partial)
        if form in ("dtensor", "partition_spec") and "world_size" in data:  # the mesh's devices are the ranks
            matrix = case.tensor_layout.layout.device_matrix
            if data["world_size"] != math.prod(matrix):
                raise SpmdsimError(world_size_mismatch(data["world_size"], "device_matrix", matrix))
        if cut is not None or form == "dtensor":
            tl = case.tensor_layout
            # DTensor cuts a dim that does not divide by torch.chunk's rule; where sizes divide the rules agree.
            uneven = indivisible(tl, case.shape)
            chosen = cut or ("chunk" if uneven else "even")
            case = replace(case, tensor_layout=TensorLayout(tl.layout.with_cut(chosen), tl.tensor_map, tl.partial))
            if form == "dtensor" and uneven:
                from ...layouts.dialects.dtensor import check_uneven_shards

                check_uneven_shards(case.tensor_layout, case.shape)
    try:
        case.tensor_layout.check_shape(case.shape)
    except ShapeError as exc:
        hint = multi_axis_hint(case.tensor_layout.tensor_map, len(case.shape))
        # A cut rule helps only a size that does not divide under the even cut, not a count of dims.
        cuttable = case.tensor_layout.layout.cut == "even" and indivisible(case.tensor_layout, case.shape)
        if not hint and not cuttable:
            raise
        if not hint and form == "partition_spec":
            hint = ('; JAX requires divisible dims: name a rule with "cut": "chunk" or "balanced" '
                    "(--cut) to cut unevenly")
        elif not hint and form == "sbp":
            hint = (f"; {ONEFLOW_EVEN}: write it in the layout form (--device-matrix, --alias, --tensor-map) "
                    "with --cut balanced")
        elif not hint and form == "layout":
            hint = '; name a rule with "cut": "chunk" or "balanced" (--cut) to cut unevenly'
        if not hint:
            raise
        raise ShapeError(f"{exc}{hint}") from None
    return case


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


def _cut(data: Mapping, form: str) -> Optional[str]:
    """The case's "cut" key, checked against its form (None when not given)."""
    cut = data.get("cut")
    if cut is None:
        return None
    if cut not in CUTS:
        raise SpmdsimError(f"case key 'cut' {cut!r} must be one of {CUTS!r}")
    if cut != "even" and form in ("strategy", "sbp"):
        why = "MindSpore cuts every dim evenly" if form == "strategy" else ONEFLOW_EVEN
        raise SpmdsimError(f"cut {cut!r} cannot go with the {form} form: {why}; "
                           "use the layout, placements or partition_spec form for an uneven cut")
    return cut


#: Why an SBP cuts only evenly here, in the refusals of an uneven SBP: OneFlow itself cuts a dim that does
#: not divide by its BalancedSplitter, level by level over the placement's axes (on a 1-D placement that is
#: the balanced rule), which spmdsim's SBP reader does not model.
ONEFLOW_EVEN = ("spmdsim reads OneFlow SBP with even cuts only (OneFlow itself cuts a dim that does not divide "
                "by its BalancedSplitter, the first pieces one longer: on a 1-D placement, a layout's cut "
                "'balanced')")


# -- command-line flags -----------------------------------------------------------
def parse_int_list(text: str, key: str = "value") -> tuple[int, ...]:
    """'2,1,2' or '(2, 1, 2)' -> (2, 1, 2); '' or '()' -> () (a scalar's shape)."""
    try:
        parts = split_top_level(text)
        values = tuple(int(p) for p in parts if p)
    except ValueError:
        raise SpmdsimError(f"{key} {text!r} must be comma-separated integers such as 2,4") from None
    if len(values) != len(parts) and parts != [""]:  # '4,,2': a size left out, not a shape of 2 dims
        raise SpmdsimError(f"{key} {text!r} has an empty entry; expected comma-separated integers such as 2,4")
    return values


def add_case_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments `slices`, `explain` and `show` share."""
    parser.add_argument(
        "case", nargs="?", default=None,
        help="JSON case file ('-' or omitted with no flags: read stdin)",
    )
    g = parser.add_argument_group("case flags (override keys of the JSON case)")
    g.add_argument("--device-matrix", metavar="N,N,..", help="e.g. 2,1,2,2,1")
    g.add_argument("--alias", metavar="NAME,..", help="axis names, e.g. a,b,c,d,e")
    g.add_argument("--tensor-map", metavar="ENTRY,..", help="e.g. b,d,e,c,a or mp,(sp,dp),None")
    g.add_argument("--shape", metavar="N,N,..", help="global shape, e.g. 1,2,1,2,2")
    g.add_argument("--partial", metavar="NAME,..", help="axes holding pending sums")
    g.add_argument("--strategy", metavar="S", help='one tensor\'s .shard strategy, e.g. "((2,1,2,2,1),)"')
    g.add_argument("--world-size", type=int, metavar="N", help="ranks for --strategy")
    g.add_argument("--operand", choices=("x", "w", "out"),
                   help='with a MatMul strategy such as "((2,1),(1,4))": which tensor to show')
    g.add_argument("--sbp", metavar="SBP", help='nD SBP, e.g. "S(0),B"')
    g.add_argument("--placement", metavar="N,N,..", help="placement shape for --sbp, e.g. 2,4")
    g.add_argument("--placements", metavar="P", help='PyTorch DTensor placements over --device-matrix, '
                   'e.g. "S(0),R" or "(Shard(0), Replicate())"')
    g.add_argument("--partition-spec", metavar="SPEC", help="JAX PartitionSpec over --device-matrix/--alias, "
                   "e.g. \"('x', None)\"")
    g.add_argument("--cut", choices=CUTS, help="how a dim that does not divide is cut: even (refused), chunk "
                   "(DTensor's torch.chunk rule) or balanced (sizes differ by at most one)")


def flag_ints(text: str, flag: str, minimum: int) -> tuple[int, ...]:
    """A flag's comma-separated integers, each at least `minimum`, refused naming the flag (not a case key)."""
    values = parse_int_list(text, flag)
    if any(v < minimum for v in values):
        what = "sizes of at least 0" if minimum == 0 else "positive sizes"
        raise SpmdsimError(f"{flag} {text!r} must be {what}, such as 2,4")
    if minimum > 0 and not values:  # a mesh (a 0-d tensor's --shape is "")
        raise SpmdsimError(f"{flag} {text!r} gives no axis; expected at least one size, such as 2,4")
    return values


def case_from_args(args: argparse.Namespace, stdin: Optional[TextIO] = None) -> Case:
    """Build the case from a JSON file/stdin and the flags (flags win)."""
    flags: dict[str, Any] = {}
    if args.device_matrix is not None:
        flags["device_matrix"] = flag_ints(args.device_matrix, "--device-matrix", 1)
    if args.alias is not None:
        flags["alias_name"] = parse_name_list(args.alias, "--alias")
    if args.tensor_map is not None:
        flags["tensor_map"] = parse_tensor_map(args.tensor_map)
    if args.shape is not None:
        flags["shape"] = flag_ints(args.shape, "--shape", 0)
    if args.partial is not None:
        flags["partial"] = parse_name_list(args.partial, "--partial")
    if args.strategy is not None:
        flags["strategy"] = args.strategy
    if args.world_size is not None:
        if args.world_size < 1:  # was "case key 'world_size' must be ...", a JSON key the user never wrote
            raise SpmdsimError(f"--world-size {args.world_size} must be a positive number of ranks, such as 8")
        flags["world_size"] = args.world_size
    if args.operand is not None:
        flags["operand"] = args.operand
    if args.sbp is not None:
        flags["sbp"] = args.sbp
    if args.placement is not None:
        flags["placement"] = flag_ints(args.placement, "--placement", 1)
    if args.placements is not None:
        flags["placements"] = args.placements
    if args.partition_spec is not None:
        flags["partition_spec"] = args.partition_spec
    if getattr(args, "cut", None) is not None:
        flags["cut"] = args.cut
    data: dict[str, Any] = {}
    if args.case is not None or not flags:
        data = _read_case_source(args.case, stdin)
    # A flag of another form replaces the file's form instead of mixing with it;
    # --device-matrix/--alias also give the mesh of the DTensor and JAX forms.
    mesh_keys = _LAYOUT_KEYS[:2]
    own = {"layout": _LAYOUT_KEYS, "strategy": _STRATEGY_KEYS, "sbp": _SBP_KEYS,
           "dtensor": _DTENSOR_KEYS + mesh_keys, "partition_spec": _SPEC_KEYS + mesh_keys}
    for form, keys in _FORM_TRIGGERS.items():
        if form == "layout" and any(k in data for k in _DTENSOR_KEYS + _SPEC_KEYS) \
                and not flags.get("tensor_map"):
            continue  # a new mesh for the file's DTensor/JAX case, not a new form
        if any(k in flags for k in keys):
            for other, other_keys in own.items():
                if other != form:
                    for k in other_keys:
                        if k not in own[form]:
                            data.pop(k, None)
    data.update(flags)
    return case_from_dict(data)


def _read_case_source(path: Optional[str], stdin: Optional[TextIO]) -> dict:
    if path in (None, "-"):
        stream = stdin if stdin is not None else sys.stdin
        if path is None and stream.isatty():
            raise SpmdsimError(
                "no case given: pass a JSON case file, pipe one on stdin, or use "
                "--device-matrix/--alias/--tensor-map/--shape"
            )
        where = "stdin"
        try:
            text = stream.read()
        except UnicodeDecodeError as exc:
            raise SpmdsimError(f"{where} is not UTF-8 text (a JSON case expected): {exc.reason} "
                               f"at byte {exc.start}") from None
    else:
        where = f"case file {path!r}"
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise SpmdsimError(f"cannot read case file {path!r}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise SpmdsimError(f"{where} is not UTF-8 text (a JSON case expected): {exc.reason} "
                               f"at byte {exc.start}") from None
    data = loads_json(text, where, "a JSON case")
    if not isinstance(data, dict):
        raise SpmdsimError(f"{where} must hold a JSON object, got {data!r}")
    return data
