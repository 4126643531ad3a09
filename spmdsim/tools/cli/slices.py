"""`spmdsim slices`: every rank's half-open [start, stop) range in each tensor dim, as JSON."""
from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

from ...layouts.explain import partial_text
from .cases import add_case_arguments, case_from_args

__all__ = ["register", "run", "format_rank_slices"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "slices",
        help="print each rank's [start, stop) per tensor dim as JSON",
        description=(
            "Read a case (JSON file or stdin, or flags) and print "
            '{"rank_slices": {"<rank>": [[start, stop], ...], ...}}; a layout with '
            'pending sums adds "partial": {"axes": [...], "note": "..."}.'
        ),
    )
    add_case_arguments(parser)
    # The other commands that print JSON do so with --json; this one always does, and takes the flag alike (it
    # was refused as an unrecognized argument). show, pipeline and context draw text and refuse it.
    parser.add_argument("--json", action="store_true",
                        help="its output is JSON already (taken, as by explain, convert and plan)")
    parser.set_defaults(func=run)


def format_rank_slices(
    rank_slices: dict[int, tuple[tuple[int, int], ...]],
    partial: Sequence[str] = (),
    partial_note: str = "",
) -> str:
    """JSON with one rank per line, so the table stays readable in a terminal.

    With `partial` axes a last line names them: ranks that differ only there
    hold the same slice but as addends, which the slices alone do not show.
    """
    lines = [
        f"  {json.dumps(str(rank))}: {json.dumps([list(b) for b in bounds])}"
        for rank, bounds in sorted(rank_slices.items())
    ]
    text = '{"rank_slices": {\n' + ",\n".join(lines) + "\n}"
    if partial:
        text += ',\n "partial": ' + json.dumps({"axes": list(partial), "note": partial_note})
    return text + "}\n"


def run(args: argparse.Namespace) -> int:
    case = case_from_args(args)
    tl = case.tensor_layout
    note = partial_text(tl) or ""
    print(format_rank_slices(tl.rank_slices(case.shape), tl.partial, note), end="")
    return 0
