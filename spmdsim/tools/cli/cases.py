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
import math
import sys
from dataclasses import replace
from typing import Any, Mapping, Optional, TextIO

from ...layouts.dialects._common import parse_name_list, parse_partition_spec, parse_tensor_map
from ...layouts.dialects.dtensor import check_uneven_shards
from ...base.once_parser import note_no_ranks
from ...base.suggest import did_you_mean
from ...base.validate import describe, loads_json, read_bounded
from ...errors import ShapeError, SpmdsimError
from ...layouts.layout import Layout, TensorLayout
from ...layouts.slicing import CUTS
from . import case_dialects
from .case_checks import (_DTENSOR_KEYS, _FLAG_OF, _FORM_TRIGGERS, _KNOWN_KEYS, _LAYOUT_KEYS, _SBP_KEYS,
                          _SPEC_KEYS, _STRATEGY_KEYS, Case, _device_count_checked, _flag_text, _int_list, _name_list,
                          _require, _tensor_map, default_names, dialect_flags, indivisible, led_by_flag,
                          mesh_names, multi_axis_hint, parse_int_list, ranks_mesh, sharding_as_mesh,
                          world_size_mismatch)

__all__ = [
    "case_from_dict",
    "case_from_args",
    "add_case_arguments",
    "flag_ints",
    "parse_name_list",
    "parse_tensor_map",
    "parse_partition_spec",
]


def case_from_dict(data: Any) -> Case:
    """Build a Case from a decoded JSON object, naming any bad key."""
    form = _form(data)
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
        tl = _layout_led(layout, entries, partial)
        world = data.get("world_size", layout.num_devices)
        if world != layout.num_devices:
            raise SpmdsimError(world_size_mismatch(world, "device_matrix", matrix))
        case = Case(tl, shape, "layout")
    else:
        case = _dialect_case(data, form, shape, partial, cut)
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
        elif not hint and form == "strategy":
            hint = ("; MindSpore cuts every dim evenly: write it in the layout form (--device-matrix, --alias, "
                    "--tensor-map) with --cut chunk or balanced")
        elif not hint and form == "layout":
            hint = '; name a rule with "cut": "chunk" or "balanced" (--cut) to cut unevenly'
        if not hint:
            raise
        raise ShapeError(f"{exc}{hint}") from None
    return case


def _layout_led(layout: Layout, entries: tuple, partial: tuple) -> TensorLayout:
    """``layout(*entries, partial=partial)``, its refusal led by the flag that named the alias it does not have,
    --tensor-map or --partial, as the other forms' (``unknown alias 'zz' in tensor map ...`` named no flag)."""
    names = set(layout.alias_name)
    named = [a for e in entries for a in ((e,) if isinstance(e, str) else e or ())]
    if partial and all(a in names for a in named):
        key, text = "partial", ",".join(partial)
    else:
        key, text = "tensor_map", ",".join(e if isinstance(e, str) else "None" if e is None else
                                           f"({','.join(e)})" for e in entries)
    return led_by_flag(_flag_text(key, text), "", lambda: layout(*entries, partial=partial))  # the alias kept


def _form(data: Any) -> str:
    """The one form the case object `data` is written in: "layout", "strategy", "sbp", "dtensor" or
    "partition_spec"; one line naming an unknown key, a missing layout or two forms mixed."""
    if not isinstance(data, Mapping):
        raise SpmdsimError(f"a case must be a JSON object, got {data!r}")
    unknown = sorted(set(data) - set(_KNOWN_KEYS))
    if unknown:
        hint = did_you_mean(unknown[0], _KNOWN_KEYS)
        raise SpmdsimError(f"case has unknown key {unknown[0]!r}; {hint + ' ' if hint else ''}"
                           f"expected keys among {_KNOWN_KEYS!r}")
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
        raise SpmdsimError(_mixed(data, forms))
    form = forms[0]
    if "operand" in data and form != "strategy":
        raise SpmdsimError(f"{_flag_text('operand', data['operand'])} picks a tensor of a MatMul --strategy "
                           f"such as \"((2,1),(1,4))\"; the {form} form gives one tensor's layout already: "
                           "leave --operand out")
    return form


#: Each form's own flag (the one that is not its mesh's), and what each mesh flag is the mesh of.
_FORM_FLAG = {"layout": "--tensor-map", "strategy": "--strategy", "sbp": "--sbp", "dtensor": "--placements",
              "partition_spec": "--partition-spec"}
_MESH_OF = {"device_matrix": "the mesh of --tensor-map, --placements and --partition-spec",
            "alias_name": "the axis names of --tensor-map, --placements and --partition-spec",
            "placement": "the mesh of --sbp"}


def _mixed(data: Mapping, forms: list[str]) -> str:
    """Why a case of two forms is refused: a form given only by its mesh flag (--placement beside --placements,
    --device-matrix beside --sbp) names the mesh flag the other form takes; else both forms and their flags."""
    given = {form: [k for k in _FORM_TRIGGERS[form] if k in data] for form in forms}
    meshes = [form for form in forms if set(given[form]) <= set(_MESH_OF)]
    if len(forms) != 2 or len(meshes) != 1:
        return (f"case mixes the {forms[0]} form ({', '.join(_FLAG_OF[k] for k in given[forms[0]])}) and the "
                f"{forms[1]} form ({', '.join(_FLAG_OF[k] for k in given[forms[1]])}); give only one")
    form = next(f for f in forms if f not in meshes)
    wrong = given[meshes[0]][0]
    mesh = {"sbp": "placement", "dtensor": "device_matrix", "partition_spec": "device_matrix"}.get(form)
    if mesh is None or wrong == "alias_name":  # a strategy brings its own device matrix; an SBP names no axes
        why = " (which brings its own device matrix)" if form == "strategy" else ""
        return (f"{_FLAG_OF[wrong]} (case key {wrong!r}) gives {_MESH_OF[wrong]}, not of {_FORM_FLAG[form]}{why}: "
                "leave it out")
    value = data[wrong]
    write = (f": give {_FLAG_OF[mesh]} {','.join(map(str, value))}" if isinstance(value, (list, tuple)) else "")
    return (f"{_FORM_FLAG[form]} takes its mesh from {_FLAG_OF[mesh]}, not {_FLAG_OF[wrong]} ({_MESH_OF[wrong]}; "
            f"case keys {mesh!r} and {wrong!r}){write}")


def _dialect_case(data: Mapping, form: str, shape: tuple, partial: tuple, cut: Optional[str]) -> Case:
    """The case of a dialect form (spmdsim.tools.cli.case_dialects), its mesh checked against world_size and its
    dims cut by the rule named (DTensor's: torch.chunk's where a size does not divide)."""
    build = {"strategy": case_dialects.strategy_case, "sbp": case_dialects.sbp_case,
             "dtensor": case_dialects.dtensor_case, "partition_spec": case_dialects.partition_spec_case}
    key = {"dtensor": "placements"}.get(form, form)  # the key (and flag) that gave the form's text
    value = data.get(key)
    case = led_by_flag(_flag_text(key, value), value if isinstance(value, str) else "",
                       lambda: build[form](data, shape, partial))  # "sbp 'Q' in 'S(0),Q'" named no flag
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
            check_uneven_shards(case.tensor_layout, case.shape)
    return case


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
def add_case_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments `slices`, `explain` and `show` share."""
    note_no_ranks(parser, parser.prog.split()[-1], "--device-matrix (--placement for --sbp, --world-size for "
                  "--strategy)")
    parser.add_argument(
        "case", nargs="?", default=None,
        help="JSON case file ('-' or omitted with no flags: read stdin)",
    )
    g = parser.add_argument_group("case flags (override keys of the JSON case)")
    g.add_argument("--device-matrix", metavar="N,N,..", help="e.g. 2,1,2,2,1; with --placements or --partition-spec "
                   "also its ranks, as PyTorch's DeviceMesh writes them, e.g. [[0,1],[2,3]]")
    # --alias-name too: run matmul's flag, and the case key's name (`case key 'alias_name'` in refusals)
    g.add_argument("--alias", "--alias-name", metavar="NAME,..", help="axis names, e.g. a,b,c,d,e")
    g.add_argument("--tensor-map", metavar="ENTRY,..", help="e.g. b,d,e,c,a or mp,(sp,dp),None")
    g.add_argument("--shape", metavar="N,N,..", help="global shape, e.g. 1,2,1,2,2")
    g.add_argument("--partial", metavar="NAME,..", help="axes holding pending sums")
    g.add_argument("--strategy", metavar="S", help='one tensor\'s .shard strategy, e.g. "((2,1,2,2,1),)"')
    g.add_argument("--world-size", type=int, metavar="N", help="ranks for --strategy")
    g.add_argument("--operand", choices=("x", "w", "out"),
                   help='with a MatMul strategy such as "((2,1),(1,4))": which tensor to show')
    g.add_argument("--sbp", metavar="SBP", help='nD SBP, e.g. "S(0),B"')
    g.add_argument("--placement", metavar="N,N,..", help="placement shape for --sbp, e.g. 2,4, or its ranks "
                   "as OneFlow writes them, e.g. [[0,1],[2,3]]")
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


def _mesh_flag(text: str, flag: str, ranks: bool = True) -> tuple[int, ...]:
    """A mesh flag's sizes (`ranks`: or its ranks, [[0,1],[2,3]]); a sharding there named with its own flag."""
    try:
        return (ranks_mesh(text, flag) if ranks else None) or flag_ints(text, flag, 1)
    except SpmdsimError:
        hint = sharding_as_mesh(text, flag, dialect_flags())
        if hint:  # '--placement "S(0),R"', the mesh's flag given where --placements was meant
            raise SpmdsimError(hint) from None
        raise


_NO_LAYOUT_FLAGS = ("the flags give no layout: expected --device-matrix, --alias and --tensor-map "
                     "(e.g. --device-matrix 2,4 --alias dp,mp --tensor-map mp,None), --strategy (+ --world-size), "
                     "--sbp + --placement, --placements + --device-matrix (PyTorch DTensor) or "
                     "--partition-spec + --device-matrix (JAX)")


def case_from_args(args: argparse.Namespace, stdin: Optional[TextIO] = None) -> Case:
    """Build the case from a JSON file/stdin and the flags (flags win)."""
    flags: dict[str, Any] = {}
    if args.device_matrix is not None:
        text = args.device_matrix  # sizes, or the ranks of PyTorch's DeviceMesh and Paddle's ProcessMesh
        flags["device_matrix"] = _mesh_flag(text, "--device-matrix", text.lstrip()[:1] in "[(")
    if args.alias is not None:
        flags["alias_name"] = parse_name_list(args.alias, "--alias")
    if args.tensor_map is not None:
        flags["tensor_map"] = parse_tensor_map(args.tensor_map, takes=dialect_flags())
    if args.shape is not None:
        flags["shape"] = flag_ints(args.shape, "--shape", 0)
    if args.partial is not None:
        flags["partial"] = parse_name_list(args.partial, "--partial")
    if args.strategy is not None:
        flags["strategy"] = args.strategy
    if args.world_size is not None:
        if args.world_size < 1:  # the flag typed, not "case key 'world_size' must be ...", a JSON key never written
            raise SpmdsimError(f"--world-size {args.world_size} must be a positive number of ranks, such as 8")
        flags["world_size"] = args.world_size
    if args.operand is not None:
        flags["operand"] = args.operand
    if args.sbp is not None:
        flags["sbp"] = args.sbp
    if args.placement is not None:
        flags["placement"] = _mesh_flag(args.placement, "--placement")
    if args.placements is not None:
        flags["placements"] = args.placements
    if args.partition_spec is not None:
        flags["partition_spec"] = args.partition_spec
    if getattr(args, "cut", None) is not None:
        flags["cut"] = args.cut
    if args.case is None and flags and not any(k in flags for keys in _FORM_TRIGGERS.values() for k in keys):
        raise SpmdsimError(_NO_LAYOUT_FLAGS)  # flags alone, none of a layout's: said in flags, not JSON keys
    data: dict[str, Any] = {}
    if args.case is not None or not flags:
        data = _read_case_source(args.case, stdin, bool(flags))
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


#: Longest JSON case `_read_case_source` reads, in characters (a case is a few hundred; as `spmdsim pipeline --file`).
MAX_CASE_TEXT = 4_000_000


#: Why a case file that is not there came with flags: a word of a flag's value, parted from it by a space.
_STRAY_WORD = ("; beside the flags, a word that no flag takes is read as a case file: write a flag's value as one "
               "word, its entries parted by commas (--tensor-map mp,None), or quote it (--placements \"S(0), R\")")


def _read_case_source(path: Optional[str], stdin: Optional[TextIO], flags: bool = False) -> dict:
    """The JSON object of the case file `path` (stdin for None or "-"), read up to MAX_CASE_TEXT characters;
    `flags`: case flags came with it (a `path` not there is likely a stray word of one's value)."""
    if path in (None, "-"):
        stream = stdin if stdin is not None else sys.stdin
        if path is None and stream.isatty():
            raise SpmdsimError(
                "no case given: pass a JSON case file, pipe one on stdin, or use "
                "--device-matrix/--alias/--tensor-map/--shape"
            )
        where = "stdin"
        try:
            text = read_bounded(stream, MAX_CASE_TEXT, where, "a JSON case")
        except UnicodeDecodeError as exc:
            raise SpmdsimError(f"{where} is not UTF-8 text (a JSON case expected): {exc.reason} "
                               f"at byte {exc.start}") from None
    else:
        where = f"case file {path!r}"
        try:
            text = read_bounded(path, MAX_CASE_TEXT, where, "a JSON case")
        except OSError as exc:
            stray = _STRAY_WORD if flags and isinstance(exc, FileNotFoundError) else ""
            raise SpmdsimError(f"cannot read case file {path!r}: {exc.strerror}{stray}") from None
        except UnicodeDecodeError as exc:
            raise SpmdsimError(f"{where} is not UTF-8 text (a JSON case expected): {exc.reason} "
                               f"at byte {exc.start}") from None
    data = loads_json(text, where, "a JSON case")
    if not isinstance(data, dict):
        raise SpmdsimError(f"{where} must hold a JSON object, got {describe(data)}")
    return data
