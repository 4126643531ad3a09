"""`spmdsim plan`: the redistribution steps between two layouts, with bytes per rank.

    spmdsim plan --device-matrix 8 --alias x --from "x,None" --to "None,x" --shape 1024,1024
    spmdsim plan --device-matrix 2,2,2 --alias a,b,c --from "(a,b,c),None" \\
        --to-device-matrix 8 --to-alias x --to "None,x" --shape 64,64 --json
    mpiexec -n 8 spmdsim run redistribute --device-matrix 8 --alias x --from "x,None" \\
        --to "None,x" --shape 64,64

Planning is pure; `run_redistribute` (called by `spmdsim run redistribute`)
executes the plan under MPI and checks every rank's block bit-exactly.
"""
from __future__ import annotations

import argparse
import json
import math
from typing import Any

from ...base.once_parser import note_no_ranks
from ...errors import ShapeError, SpmdsimError
from ...layouts.layout import Layout, TensorLayout, default_axis_names
from ...layouts.slicing import CUTS
from ...programs.plan import plan_redistribution
from ...programs.plan.summary import FOLD_RANKS
from ...base.validate import counted
from ...layouts.dialects._common import parse_name_list, parse_partition_spec, parse_tensor_map
from ...layouts.dialects.dtensor import check_uneven_shards, placements_to_layout
from ...layouts.dialects.partition_spec import partition_spec_to_layout
from ...layouts.dialects.sbp import sbp_to_layout
from ...layouts.dialects.strategy import parse_strategy, strategy_to_layout
from .case_checks import (check_device_count, checked_axis_names, dialect_flags, indivisible, led_by_flag,
                          mesh_sizes, with_partial_axes)
from .cases import flag_ints
from .plan_sides import as_uneven, check_alias_used, check_target_names, cut_side, even_form
from .plan_explain import dialect_of, moves_and_bytes_png, plan_record, plan_text
from .paths import check_output_dir
from ...programs.viz.png import check_picture_ranks, require_matplotlib
from ...programs.viz import render_plan_ascii, render_plan_png

__all__ = [
    "register",
    "run",
    "add_plan_arguments",
    "add_redistribute_arguments",
    "layouts_from_args",
    "MAX_PLAN_DEVICES",
]

#: Most devices `plan` takes (as `slices`, `explain` and `show`). Planning and
#: --explain are linear in the devices (exchanges past 2**16 sender choices are
#: folded, --explain past 64 ranks prints traffic per group): about 2 s and
#: 150 MB at 65,536 (docs/explanation/redistribution.md, "At scale").
MAX_PLAN_DEVICES = 65536


class _EachGiven(argparse.Action):
    """Store the value, and keep every (flag, value) given for it in `<dest>_given`: a flag and its other
    name (--device-matrix, --placement), or one flag twice, must not silently keep only the last value."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        given = list(getattr(namespace, f"{self.dest}_given", None) or ())
        setattr(namespace, f"{self.dest}_given", given + [(option_string, values)])


def _one_device_matrix(args: argparse.Namespace) -> None:
    """Refuse --device-matrix and --placement (one flag by two names) given two different device matrices."""
    given = getattr(args, "device_matrix_given", None) or []
    for flag, value in given[1:]:
        first_flag, first = given[0]
        try:
            same = mesh_sizes(value, flag) == mesh_sizes(first, first_flag)
        except SpmdsimError:
            same = value == first  # a value that is no list is refused, naming it, when the mesh is built
        if not same:
            raise SpmdsimError(f"{first_flag} {first!r} and {flag} {value!r} give two device matrices "
                               "(--placement is another name for --device-matrix); give one")


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Source/target layout, shape and dtype flags (shared by `plan` and `run redistribute`)."""
    g = parser.add_argument_group("layouts")
    g.add_argument("--device-matrix", "--placement", dest="device_matrix", metavar="N,..", action=_EachGiven,
                   help="e.g. 8 or 2,2,2 (--placement: the same, as OneFlow and `spmdsim show` call it; "
                        "also its ranks, e.g. [[0,1],[2,3]]); two .shard strategies need none")
    g.add_argument("--alias", "--alias-name", metavar="NAME,..", help="axis names (default axis_0,axis_1,..)")
    g.add_argument("--from", dest="from_map", metavar="MAP", help='source tensor map, e.g. "x,None"')
    g.add_argument("--to", dest="to_map", metavar="MAP", help='target tensor map, e.g. "None,(sp,dp)"')
    g.add_argument("--from-partial", metavar="NAME,..", help="source axes holding pending sums")
    g.add_argument("--to-partial", metavar="NAME,..", help="target axes holding pending sums")
    g.add_argument("--from-sbp", metavar="SBP", help='source nD SBP over the device matrix, e.g. "S(0),B"')
    g.add_argument("--to-sbp", metavar="SBP", help="target nD SBP over the target device matrix")
    g.add_argument("--from-placements", metavar="P",
                   help='source PyTorch DTensor placements over the device matrix, e.g. "S(0),R"')
    g.add_argument("--to-placements", metavar="P", help="target DTensor placements over the target device matrix")
    g.add_argument("--from-partition-spec", metavar="SPEC",
                   help="source JAX PartitionSpec over the device matrix's axis names, e.g. \"('x', None)\"")
    g.add_argument("--to-partition-spec", metavar="SPEC",
                   help="target JAX PartitionSpec over the target mesh's axis names")
    g.add_argument("--from-strategy", metavar="S", help='source .shard strategy, e.g. "((8,1),)"')
    g.add_argument("--to-strategy", metavar="S", help='target .shard strategy, e.g. "((1,8),)"')
    g.add_argument("--to-device-matrix", "--to-placement", dest="to_device_matrix", metavar="N,..", action=_EachGiven,
                   help="target device matrix (same device count; --to-placement: the same, as --placement)")
    g.add_argument("--to-alias", metavar="NAME,..", help="target axis names")
    g.add_argument("--cut", choices=CUTS, help="how a dim that does not divide is cut: even (refused), chunk "
                   "(DTensor's torch.chunk rule) or balanced (sizes differ by at most one)")
    g.add_argument("--to-cut", choices=CUTS, help="the target's rule, when it differs from --cut")
    parser.add_argument("--shape", required=True, metavar="N,..", help="global shape, e.g. 1024,1024")
    parser.add_argument("--dtype", default="float32",
                        choices=("float32", "float64", "int32", "int64"),
                        help="element type, whose width sets the bytes (default float32)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--explain", action="store_true",
                        help="also say why each step runs, each rank's block before and after, and "
                             "the bytes each rank sends to each rank")


def add_redistribute_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `spmdsim run redistribute` (the plan flags plus --seed, --check, --watchdog)."""
    from ...runtime.debug import add_cli_arguments

    from .common import add_trace_out

    add_plan_arguments(parser)
    add_trace_out(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated tensor")
    add_cli_arguments(parser)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="plan a redistribution between two layouts (steps, bytes, lower bound)",
        description="Print the steps that move a tensor from one layout to another, the bytes "
                    "each rank sends and receives per step, and the total against the lower "
                    "bound (each rank receives only the part of its target block it lacks).",
    )
    note_no_ranks(parser, "plan", "--device-matrix (or two .shard strategies)")
    add_plan_arguments(parser)
    parser.add_argument("--show", action="store_true",
                        help="also draw the layout before and after each step (ASCII, 80 columns)")
    parser.add_argument("--png", metavar="DIR",
                        help="write one picture per step into DIR (up to 256 ranks; needs the 'plot' extra)")
    parser.set_defaults(func=run)


def _typed(args: argparse.Namespace, dest: str) -> str:
    """The flag the user typed for `dest` (--device-matrix or --placement; --to-device-matrix or --to-placement)."""
    return (getattr(args, f"{dest}_given", None) or [("--" + dest.replace("_", "-"), None)])[0][0]


def _mesh(matrix: str, alias: str | None, prefix: str = "", flag: str = "") -> Layout:
    """The mesh of `matrix` (--{prefix}device-matrix's text, or `flag`'s) named by `alias` (--{prefix}alias's)."""
    flag = flag or f"--{prefix}device-matrix"
    dims = mesh_sizes(matrix, flag, dialect_flags(prefix or "from-"))
    if not dims:
        raise SpmdsimError(f"{flag} {matrix!r} gives no axis; expected at least one size, such as 2,4")
    check_device_count(math.prod(dims), f"{flag} {matrix!r}", MAX_PLAN_DEVICES)
    if alias is None:
        return Layout(dims, default_axis_names(len(dims)))
    names = checked_axis_names(parse_name_list(alias, f"--{prefix}alias"), f"--{prefix}alias {alias!r}",
                               f"{flag} {matrix!r}", len(dims))  # "" is given, not absent: no names
    return Layout(dims, names)


def _side(args, which: str, mesh: Layout, ndim: int, world: int) -> TensorLayout:
    tmap, partial = getattr(args, f"{which}_map"), getattr(args, f"{which}_partial")
    sbp, strategy = getattr(args, f"{which}_sbp"), getattr(args, f"{which}_strategy")
    placements = getattr(args, f"{which}_placements")
    spec = getattr(args, f"{which}_partition_spec")
    given = [flag[len(which) + 3:] or "map" for flag, _ in _one_form(args, which)]
    if strategy is not None and which == "to" and (args.to_device_matrix is not None or args.to_alias is not None):
        # A strategy brings its own device matrix; the target mesh flags would be dropped.
        raise SpmdsimError("--to-strategy gives the target's device matrix itself; "
                           "expected no --to-device-matrix or --to-alias with it")
    if strategy is not None:
        # Both sides of a strategy pair would name their axes axis_0, axis_1, ...: the
        # target's are to_0, to_1, ... so the report tells the two meshes apart.
        counts = parse_strategy(strategy)
        if len(counts) != 1:  # an operator's .shard, one tuple per input: whose counts move?
            raise SpmdsimError(f"--{which}-strategy {strategy!r} has {len(counts)} tensors' slice counts (an "
                               f"operator's .shard); expected one tensor's, such as {_one_of(counts)}")
        if len(counts[0]) != ndim:  # before the layout, whose error names its axis_0, ...
            raise SpmdsimError(f"--{which}-strategy {strategy!r} has {counted(len(counts[0]), 'slice count')} but "
                               f"--shape {args.shape!r} has {counted(ndim, 'dim')}; expected one slice count per "
                               "tensor dim")
        tl = strategy_to_layout(strategy, world)
        if which == "to":
            tl = _renamed(tl, {n: "to_" + n[5:] for n in tl.layout.alias_name if n[:5] == "axis_"})
    else:  # a refusal led by the flag: plan reads two layouts, and "sbp 'Q' in 'S(0),Q'" alone does not say whose
        form, text = given[0], {"map": tmap, "sbp": sbp, "placements": placements, "partition-spec": spec}[given[0]]
        flag = f"--{which}" + ("" if form == "map" else f"-{form}")
        tl = led_by_flag(f"{flag} {text!r}", text, lambda: _read_side(form, text, mesh, ndim, which),
                         {"(--placements on the command line)": f"(--{which}-placements)"})
    if partial:
        axes = parse_name_list(partial, f"--{which}-partial")
        if tmap is not None:  # the user wrote the map: the layout's own refusal, led by the flag
            return led_by_flag(f"--{which}-partial {partial!r}", "",  # (the alias the refusal names, kept)
                               lambda: tl.with_partial(tuple(tl.partial) + axes))
        flag, value = next((f"--{which}-{form}", v) for form, v in (
            ("sbp", sbp), ("strategy", strategy), ("placements", placements), ("partition-spec", spec))
            if v is not None)
        return with_partial_axes(tl, axes, f"{flag} {value!r}", lambda axis: f"--{which}-partial {axis!r}")
    return tl


def _read_side(form: str, text: str, mesh: Layout, ndim: int, which: str) -> TensorLayout:
    """The layout that --{which}-{form} (--{which}, a tensor map) gives as `text` over `mesh`."""
    if form == "partition-spec":
        return partition_spec_to_layout(parse_partition_spec(text), mesh.device_matrix, ndim, mesh.alias_name)
    if form == "sbp":
        return sbp_to_layout(text, mesh.device_matrix, ndim, mesh.alias_name)
    if form == "placements":
        return placements_to_layout(text, mesh.device_matrix, ndim, mesh.alias_name)
    return mesh(*parse_tensor_map(text, takes=dialect_flags(f"{which}-")))


def _renamed(tl: TensorLayout, names: dict[str, str]) -> TensorLayout:
    """`tl` with its mesh axes renamed (the same device matrix and sharding)."""
    def entry(axes: tuple[str, ...]) -> Any:
        return None if not axes else tuple(names.get(a, a) for a in axes)

    mesh = Layout(tl.layout.device_matrix, tuple(names.get(a, a) for a in tl.layout.alias_name))
    return mesh(*(entry(axes) for axes in tl.tensor_map)).with_partial(
        tuple(names.get(a, a) for a in tl.partial))


def layouts_from_args(args: argparse.Namespace) -> tuple[TensorLayout, TensorLayout, tuple, str]:
    """(source, target, shape, dtype) from the flags."""
    _one_device_matrix(args)
    shape = flag_ints(args.shape, "--shape", 0)  # "shape (8, -8) must not have negative sizes" named no flag
    matrix = args.device_matrix if args.device_matrix is not None else _strategies_world(args)
    source_mesh = _mesh(matrix, args.alias, flag=_typed(args, "device_matrix"))
    if args.to_device_matrix is not None:
        target_mesh = _mesh(args.to_device_matrix, args.to_alias, "to-", _typed(args, "to_device_matrix"))
    elif args.to_alias is not None:
        target_mesh = _mesh(matrix, args.to_alias, "to-", _typed(args, "device_matrix"))
    else:
        target_mesh = source_mesh
    world = source_mesh.num_devices
    # Before the maps: a map naming the source's axes on a target of another size
    # would otherwise be reported as an unknown alias.
    if target_mesh.num_devices != world:
        raise SpmdsimError(
            f"{_typed(args, 'to_device_matrix')} {args.to_device_matrix!r} has "
            f"{counted(target_mesh.num_devices, 'device')} but {_typed(args, 'device_matrix')} "
            f"{args.device_matrix!r} has {world}; expected the same count"
        )
    source_side = _side(args, "from", source_mesh, len(shape), world)
    if args.to_device_matrix is not None and args.to_alias is None:
        check_target_names(args, source_mesh, target_mesh)
    sides = {"from": source_side, "to": _side(args, "to", target_mesh, len(shape), world)}
    cuts = {"from": args.cut, "to": args.to_cut or args.cut}
    if args.cut is None and any(getattr(args, f"{which}_placements") and indivisible(tl, shape)
                                for which, tl in sides.items()):
        # DTensor placements cut a dim that does not divide as DTensor does (torch.chunk's rule), unasked, as
        # `spmdsim slices` reads them; the other side takes the same rule where it can (an even-only strategy
        # or SBP keeps its own), so that the two differ only where the placements do.
        for which in sides:
            if cuts[which] is None and not any(getattr(args, f"{which}_{form}") for form in ("strategy", "sbp")):
                cuts[which] = "chunk"
    source, target = (cut_side(args, which, sides[which], cuts[which]) for which in ("from", "to"))
    check_alias_used(args)
    even_only = any(even_form(args, which) for which in sides)
    for which, tl in (("from", source), ("to", target)):
        if getattr(args, f"{which}_placements") and indivisible(tl, shape):
            check_uneven_shards(tl, shape)  # where DTensor would cut piece by piece otherwise: one line
        try:
            tl.check_shape(shape)
        except ShapeError as exc:  # a dim an even layout cannot cut: the rules that can, and where a strategy or
            even = even_form(args, which)  # SBP (even cuts only) is the other side, none: it refuses --cut
            if not indivisible(tl, shape) or (even_only and even is None):
                raise
            raise ShapeError(f"{exc}; " + (f"{even[1]}: {as_uneven(which)} and --{'to-' * (which == 'to')}cut chunk "
                             "or balanced" if even else "--cut chunk or balanced cuts it unevenly (--to-cut for "
                             "the target alone)")) from None
    return source, target, shape, args.dtype


def _one_form(args: argparse.Namespace, which: str) -> list[tuple[str, str]]:
    """[(flag, value)] of the one form that gives the --{which} side's layout; none or several refused."""
    given = [(f"--{which}" + ("" if form == "map" else f"-{form}"), value) for form, value in (
        ("map", getattr(args, f"{which}_map")), ("sbp", getattr(args, f"{which}_sbp")),
        ("strategy", getattr(args, f"{which}_strategy")), ("placements", getattr(args, f"{which}_placements")),
        ("partition-spec", getattr(args, f"{which}_partition_spec"))) if value is not None]
    if len(given) != 1:  # the flags named, not "give exactly one of ..., got []" (or "got ['map', 'sbp']")
        side = "source" if which == "from" else "target"
        both = "both" if len(given) == 2 else "all"
        raise SpmdsimError(
            (f"no {side} layout given" if not given else f"{' and '.join(f for f, _ in given)} {both} give the "
             f"{side} layout") + f"; expected one of --{which}, --{which}-sbp, --{which}-placements, "
            f"--{which}-partition-spec and --{which}-strategy")
    return given


def _strategies_world(args: argparse.Namespace) -> str:
    """The device matrix (one axis) that --device-matrix, left out, stands for: as `slices --strategy` takes the
    strategy's own device count, two .shard strategies take the larger of theirs (the other one dividing it:
    its repeats fill the rest), a strategy beside --to-device-matrix that mesh's count. Any other form lies
    over --device-matrix's mesh: refused, naming it."""
    for which in ("from", "to"):
        [(flag, value)] = _one_form(args, which)
        if flag != f"--{which}-strategy" and (which == "from" or args.to_device_matrix is None):
            raise SpmdsimError(f"--device-matrix is missing, the mesh {flag} {value!r} lies over; expected its "
                               "sizes, such as --device-matrix 2,4 (only two .shard strategies need none: they "
                               "bring their own device counts)")
    if args.to_device_matrix is not None:
        flag = _typed(args, "to_device_matrix")
        return str(math.prod(mesh_sizes(args.to_device_matrix, flag, dialect_flags("to-"))))
    counts = {}
    for flag, text in (("--from-strategy", args.from_strategy), ("--to-strategy", args.to_strategy)):
        slices = led_by_flag(f"{flag} {text!r}", text, lambda: parse_strategy(text))
        counts[flag] = math.prod(slices[0]) if len(slices) == 1 else 1  # two tensors: _side refuses them
        check_device_count(counts[flag], f"{flag} {text!r}", MAX_PLAN_DEVICES)
    low, high = sorted(counts.values())
    if high % low:
        raise SpmdsimError(f"--from-strategy {args.from_strategy!r} uses {counts['--from-strategy']} devices and "
                           f"--to-strategy {args.to_strategy!r} {counts['--to-strategy']}, and neither count "
                           f"divides the other; expected --device-matrix N with N a multiple of both, such as "
                           f"{math.lcm(low, high)}")
    return str(high)


def _one_of(counts: tuple) -> str:
    """The first tensor's slice counts of a strategy, written as a strategy of one: "((2,1),)"."""
    return "((" + ",".join(map(str, counts[0])) + "),)"


def run(args: argparse.Namespace) -> int:
    if getattr(args, "show", False) and args.json:  # given both, the record would print and --show be dropped
        raise SpmdsimError("--show draws the layout before and after each step, which --json replaces (its record "
                           "lists each step): give one of them")
    if getattr(args, "png", None) is not None:
        check_output_dir(args.png, "--png")  # before the report: no traceback after it
        require_matplotlib()
    source, target, shape, dtype = layouts_from_args(args)
    plan = plan_redistribution(source, target, shape, dtype)
    if getattr(args, "png", None) is not None:  # before the report, as the folder's check
        check_picture_ranks(plan.num_ranks, "--png", "--show draws every step in ASCII")
    print(json.dumps(plan_record(plan, args)) if args.json else plan_text(plan, args))
    if getattr(args, "show", False):
        print()
        print(render_plan_ascii(plan), end="")
    if getattr(args, "png", None) is not None:
        paths = render_plan_png(plan, args.png)
        paths += moves_and_bytes_png(plan, args.png, dialect_of(args))
        if not args.json:
            print(f"wrote {counted(len(paths), 'picture')} to {args.png}")
            if plan.num_ranks > FOLD_RANKS:
                print(f"(moves_NN.png and bytes.png are drawn up to {FOLD_RANKS} ranks; "
                      "--explain gives the traffic per group)")
    return 0
