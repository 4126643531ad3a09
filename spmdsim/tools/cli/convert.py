"""`spmdsim convert`: one layout written in all six dialects, each checked, or why one cannot say it.

    spmdsim convert --device-matrix 2,4 --alias dp,mp --tensor-map "mp,None" --shape 8,6
    spmdsim convert --placements "S(0),R" --device-matrix 2,4 --shape 8,8 --json
    spmdsim convert case.json

Takes the same flags and case files as `spmdsim slices`. Every form printed is
read back and must give every rank the same block (and the same pending sums)
as the input; a form that cuts the tensor the same way but numbers the ranks
otherwise (a `.shard` strategy puts its copies last) is reported as such.
Pure: never imports mpi4py.
"""
from __future__ import annotations

import argparse
import json
import math
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ...errors import DialectError
from ...base.validate import counted
from ...layouts.layout import TensorLayout
from ...layouts.notation import format_entry
from .cases import ONEFLOW_EVEN, add_case_arguments, case_from_args
from ...layouts.dialects import (format_partition_spec, format_placements, format_sbp, layout_to_partition_spec,
                                 layout_to_sbp, partition_spec_to_layout, placements_to_layout, sbp_to_layout)
from ...layouts.dialects.dtensor import placements_of
from ...layouts.dialects.strategy import format_strategy, layout_to_strategy, strategy_to_layout
from ...layouts.holdings import bounds_text
from ...programs.viz.table import wrap_lines

__all__ = ["register", "run", "Form", "convert_layout", "DIALECTS"]

#: The six dialects, in the order `convert` prints them.
DIALECTS = ("MindSpore Layout", "MindSpore .shard", "OneFlow SBP", "PyTorch DTensor",
            "JAX PartitionSpec", "Paddle split")


@dataclass(frozen=True)
class Form:
    """One dialect's spelling of a layout.

    Attributes:
        text: the spelling, or None when the dialect cannot express the layout.
        note: why not, or what differs (empty when the form means exactly the input).
        flags: the `spmdsim slices` flags that read this form back (None if it cannot).
    """

    dialect: str
    text: Optional[str]
    note: str = ""
    flags: Optional[str] = None

    def record(self) -> dict[str, Any]:
        return {"dialect": self.dialect, "text": self.text, "note": self.note, "flags": self.flags}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "convert", help="write one layout in all six dialects (or say why one cannot)",
        description="Read a layout (the flags or case file of `spmdsim slices`) and print it as a "
                    "MindSpore Layout, a .shard strategy, a OneFlow SBP, PyTorch DTensor "
                    "placements, a JAX PartitionSpec and a Paddle split, each read back and "
                    "compared rank by rank with the input.",
    )
    add_case_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def _csv(values: Any) -> str:
    return ",".join(str(v) for v in values)


def _map_text(tl: TensorLayout) -> str:
    """The tensor map as `--tensor-map` takes it: ``mp,(sp,dp),None``.

    A map of one multi-axis entry is bracketed once more, ``((sp,dp))``: `--tensor-map "(sp,dp)"`
    reads as the whole map in brackets, two entries."""
    text = ",".join("None" if not axes else axes[0] if len(axes) == 1 else f"({','.join(axes)})"
                    for axes in tl.tensor_map)
    return f"({text})" if len(tl.tensor_map) == 1 and len(tl.tensor_map[0] or ()) > 1 else text


def _layout(tl: TensorLayout, shape: tuple[int, ...]) -> Form:
    """The Layout call, as Python that MindSpore and spmdsim both run: a dim not split is the string "None" (MindSpore's
    Layout refuses Python's None: "The axis None is not found"); spmdsim's own keywords (partial=, cut=) noted."""
    m = tl.layout
    names = ", ".join(f'"{n}"' for n in m.alias_name) + ("," if len(m.alias_name) == 1 else "")
    cut = "" if m.cut == "even" else f", cut={m.cut!r}"
    entries = ['"None"' if not axes else format_entry(axes) for axes in tl.tensor_map]
    if tl.partial:
        entries.append("partial=(" + ", ".join(f'"{a}"' for a in tl.partial) + ("," if len(tl.partial) == 1 else "")
                       + ")")
    text = f"Layout({m.device_matrix!r}, ({names}){cut})({', '.join(entries)})"
    extras = [what for what, given in (("partial= (MindSpore's Layout has no pending sums)", tl.partial),
                                       ("cut= (MindSpore cuts every dim evenly)", cut)) if given]
    note = f"spmdsim's {' and '.join(extras)}" if extras else ""
    flags = (f"--device-matrix {_csv(m.device_matrix)} --alias {_csv(m.alias_name)} "
             f"--tensor-map \"{_map_text(tl)}\"")
    if tl.partial:
        flags += f" --partial {_csv(tl.partial)}"
    if cut:
        flags += f" --cut {m.cut}"
    return Form(DIALECTS[0], text, note, flags)


def _uneven_note(tl: TensorLayout, shape: tuple[int, ...], who: str) -> Optional[str]:
    """Why a dialect that cuts only evenly (`who` does) cannot say `tl`, or None when every dim divides."""
    dims = tl.uneven_dims(shape)
    if not dims:
        return None
    d = dims[0]
    why = {"OneFlow": ONEFLOW_EVEN, "Paddle's split()": PADDLE_EVEN}.get(who, f"{who} cuts every dim evenly")
    return f"{why}: dim {d} of size {shape[d]} does not divide into {tl.num_shards(d)} shards"


#: Why a Paddle split() form needs a dim that divides: spmdsim's split() (version 1) refuses one that does not, as
#: Paddle's own linear split does; Paddle's embedding split would give the last rank the remainder
#: (docs/reference/dialects.md).
PADDLE_EVEN = ("spmdsim's split() cuts only evenly, as Paddle's linear split does (Paddle's embedding split "
               "gives the last rank the remainder, which spmdsim does not model)")


def _same_blocks(a: TensorLayout, b: TensorLayout, shape: tuple[int, ...]) -> Optional[str]:
    """None when `b` gives every rank the block `a` gives it (and the same pending sums), else why not."""
    if a.layout.num_devices != b.layout.num_devices:
        return f"it uses {b.layout.num_devices} devices, not {a.layout.num_devices}"
    for rank in range(a.layout.num_devices):
        if a.bounds(rank, shape) != b.bounds(rank, shape):
            return (f"the same cut with another rank numbering: rank {rank} would hold "
                    f"{_block(b, shape, rank)} instead of {_block(a, shape, rank)}")
    if sorted(a.addend_axes) != sorted(b.addend_axes) and bool(a.partial) != bool(b.partial):
        return "the pending sums differ"
    return None


def _block(tl: TensorLayout, shape: tuple[int, ...], rank: int) -> str:
    return bounds_text(tl.bounds(rank, shape))


def _strategy(tl: TensorLayout, shape: tuple[int, ...]) -> Form:
    counts = layout_to_strategy(tl)
    world = tl.layout.num_devices
    text = format_strategy((counts,))
    flags = f"--strategy \"{text}\" --world-size {world}"
    uneven = _uneven_note(tl, shape, "MindSpore")
    if uneven:
        return Form(DIALECTS[1], None, uneven)
    if tl.partial:
        return Form(DIALECTS[1], None, "a .shard strategy gives slice counts only: it has no "
                                      f"pending sums (here over {', '.join(tl.partial)})")
    if world % math.prod(counts):
        return Form(DIALECTS[1], None, f"its {math.prod(counts)} slices do not divide {world} devices")
    why = _same_blocks(tl, strategy_to_layout(counts, world), shape)
    if why:
        return Form(DIALECTS[1], text, f"{why} (a strategy puts its copies on the last, fastest "
                                       "device axis)", flags)
    return Form(DIALECTS[1], text, "", flags)


def _mesh_form(dialect: str, to: Callable, back: Callable, fmt: Callable, flag: str,
               tl: TensorLayout, shape: tuple[int, ...], mesh_flags: str) -> Form:
    """A dialect written over the same mesh axes: converted, then read back and compared."""
    try:
        value = to(tl)
    except DialectError as exc:
        return Form(dialect, None, str(exc))
    text = fmt(value)
    body = text[len("PartitionSpec"):] if text.startswith("PartitionSpec(") else text[1:-1]
    why = _same_blocks(tl, back(value), shape)
    return Form(dialect, text, why or "", f"{flag} \"{body}\" {mesh_flags}")


def _paddle(tl: TensorLayout, shape: tuple[int, ...]) -> Form:
    """Paddle's split() lays a 2-D weight over one model-parallel group of every device."""
    world = tl.layout.num_devices
    splits = [d for d, axes in enumerate(tl.tensor_map) if axes]
    uneven = _uneven_note(tl, shape, "Paddle's split()")
    if uneven:
        return Form(DIALECTS[5], None, uneven)
    if tl.partial or len(shape) != 2 or len(splits) != 1 or tl.num_shards(splits[0]) != world:
        return Form(DIALECTS[5], None, "split() cuts one dim of a 2-D weight over all devices "
                                       "(one model-parallel group, no copies, no pending sums)")
    dim = splits[0]
    text = f'split(x, {tuple(shape)!r}, operation="linear", axis={dim}, num_partitions={world})'
    note = ("the weight of a row-parallel Linear; operation=\"embedding\" splits the same rows "
            "(the vocabulary)" if dim == 0 else "the weight of a column-parallel Linear")
    order = [r for r in range(world) if tl.bounds(r, shape)[dim][0] != shape[dim] // world * r]
    if order:
        note += (f"; split() gives rank r the r-th piece, here rank {order[0]} holds "
                 f"{_block(tl, shape, order[0])}")
    return Form(DIALECTS[5], text, note)


def convert_layout(tl: TensorLayout, shape: tuple[int, ...]) -> tuple[Form, ...]:
    """The layout `tl` of a tensor of `shape` in every dialect (pure)."""
    m, ndim = tl.layout, len(shape)
    mesh = f"--device-matrix {_csv(m.device_matrix)} --alias {_csv(m.alias_name)}"
    placement = f"--placement {_csv(m.device_matrix)}"
    uneven = bool(tl.uneven_dims(shape))
    sbp_uneven = _uneven_note(tl, shape, "OneFlow")
    # DTensor cuts a dim that does not divide by the chunk rule; JAX only with a rule named (--cut).
    dtensor_cut = "chunk" if uneven else None
    # placements_of refuses what DTensor would cut otherwise than `tl` for this shape: another rule than
    # torch.chunk's, or a dim on several mesh dims cut piece by piece (the check line would be refused).
    return (
        _layout(tl, shape),
        _strategy(tl, shape),
        Form(DIALECTS[2], None, sbp_uneven) if sbp_uneven else
        _mesh_form(DIALECTS[2], layout_to_sbp, lambda v: sbp_to_layout(v, m.device_matrix, ndim),
                   format_sbp, "--sbp", tl, shape, placement),
        _mesh_form(DIALECTS[3], lambda t: placements_of(t, shape),
                   lambda v: placements_to_layout(v, m.device_matrix, ndim, m.alias_name, cut=dtensor_cut),
                   format_placements, "--placements", tl, shape, mesh),
        _mesh_form(DIALECTS[4], layout_to_partition_spec,
                   lambda v: partition_spec_to_layout(v, m.device_matrix, ndim, m.alias_name,
                                                      cut=m.cut if uneven else None),
                   format_partition_spec, "--partition-spec", tl, shape,
                   mesh + (f" --cut {m.cut}" if uneven else "")),
        _paddle(tl, shape),
    )


def _command(command: str, lead: str, width: int = 100) -> list[str]:
    """A shell command within `width` columns, cut at spaces with `` \\`` continuations."""

    lines = textwrap.wrap(command, width - len(lead) - 2, break_long_words=False,
                          break_on_hyphens=False)
    return [(lead if i == 0 else " " * len(lead)) + line + (" \\" if i < len(lines) - 1 else "")
            for i, line in enumerate(lines)]


def run(args: argparse.Namespace) -> int:
    case = case_from_args(args)
    forms = convert_layout(case.tensor_layout, case.shape)
    if args.json:
        print(json.dumps({"shape": list(case.shape), "forms": [f.record() for f in forms]}))
        return 0
    lines = [f"one layout of a tensor of shape {case.shape!r} on "
             f"{counted(case.tensor_layout.layout.num_devices, 'device')}, in six dialects:"]
    for form in forms:
        lines.append(f"{form.dialect}:")
        lines.append(f"  {form.text}" if form.text else "  cannot express it")
        if form.note:
            lines.append(f"  {'note' if form.text else 'why'}: {form.note}")
        lines = wrap_lines(lines)
        if form.flags:
            shape = _csv(case.shape) or '""'  # a 0-d tensor's shape is the empty string, which a shell drops unquoted
            lines += _command(f"spmdsim slices {form.flags} --shape {shape}", "  check: ")
    print("\n".join(lines))
    return 0
