"""`spmdsim plan`'s checks of its two sides beyond their parsing: the target's axis names over its own mesh, a
cut rule against the forms that cut evenly (a strategy, an SBP), --alias where no side uses it."""
from __future__ import annotations

import argparse

from ...base.validate import counted
from ...errors import SpmdsimError
from ...layouts.dialects._common import parse_name_list, parse_partition_spec, parse_tensor_map
from ...layouts.layout import Layout, TensorLayout
from .case_checks import dialect_flags
from .cases import ONEFLOW_EVEN

__all__ = ["check_target_names", "cut_side", "even_form", "as_uneven", "check_alias_used"]


def check_target_names(args: argparse.Namespace, source_mesh: Layout, target_mesh: Layout) -> None:
    """Refuse a target that names --alias's axes over a --to-device-matrix without --to-alias: that mesh is
    another one, its axes named axis_0, axis_1, ...; the parser's own refusal ("unknown alias 'x' in tensor map
    ...; expected one of ('axis_0', 'axis_1')") would not say why or name --to-alias."""
    for flag, text, parse in (("--to", args.to_map, lambda t: parse_tensor_map(t, takes=dialect_flags("to-"))),
                              ("--to-partition-spec", args.to_partition_spec, parse_partition_spec),
                              ("--to-partial", args.to_partial, lambda t: parse_name_list(t, "--to-partial"))):
        if text is None:
            continue
        used = [a for entry in parse(text) for a in ((entry,) if isinstance(entry, str) else entry or ())]
        theirs = [a for a in used if a not in target_mesh.alias_name and a in source_mesh.alias_name]
        if theirs:
            count = target_mesh.ndim
            raise SpmdsimError(
                f"{flag} {text!r} names {theirs[0]!r}, an axis of --alias {args.alias!r}, but --to-device-matrix "
                f"{args.to_device_matrix!r} gives the target a mesh of its own, whose axis names are "
                f"{', '.join(target_mesh.alias_name)} unless --to-alias gives others; expected --to-alias with "
                f"{counted(count, 'name')}, one per axis of --to-device-matrix")


def cut_side(args: argparse.Namespace, which: str, tl: TensorLayout, cut: str | None) -> TensorLayout:
    """`tl` cutting dims by rule `cut` (docs/explanation/semantics.md, "Uneven shards"); a strategy or an SBP cuts
    evenly."""
    if cut is None or cut == tl.layout.cut:
        return tl
    even = even_form(args, which)
    if even:
        raise SpmdsimError(f"--{which}-{even[0]} cannot take cut {cut!r}: {even[1]}; {as_uneven(which)}")
    return TensorLayout(tl.layout.with_cut(cut), tl.tensor_map, tl.partial)


def even_form(args: argparse.Namespace, which: str) -> tuple | None:
    """(form, why) where the --{which} side is a strategy or an SBP, which cut every dim evenly; else None."""
    return next(((form, why) for form, why in (("strategy", "MindSpore cuts every dim evenly"), ("sbp", ONEFLOW_EVEN))
                 if getattr(args, f"{which}_{form}")), None)


def as_uneven(which: str) -> str:
    """How to write side `which` so that it can cut unevenly: a form other than a strategy or an SBP."""
    return f"write that side as --{which}, --{which}-placements or --{which}-partition-spec"


def check_alias_used(args: argparse.Namespace) -> None:
    """Refuse --alias when no side is written over --device-matrix's axes (it would be dropped).

    A strategy brings its own device matrix, and the target uses its own mesh
    when --to-device-matrix or --to-alias is given.
    """
    if args.alias is None:
        return
    source_uses = not args.from_strategy
    target_uses = not (args.to_strategy or args.to_device_matrix or args.to_alias)
    if not (source_uses or target_uses):
        raise SpmdsimError(
            f"--alias {args.alias!r} names no axis used here: the source is a .shard strategy "
            "(it brings its own device matrix and axis names) and the target is written over "
            "its own mesh; expected no --alias, or a source/target written over --device-matrix"
        )
