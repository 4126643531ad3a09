"""`spmdsim slices`: every rank's half-open [start, stop) range in each tensor dim, as JSON."""
from __future__ import annotations

import argparse
import json
from typing import Any

from .cases import add_case_arguments, case_from_args

__all__ = ["register", "run", "format_rank_slices"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "slices",
        help="print each rank's [start, stop) per tensor dim as JSON",
        description=(
            "Read a case (JSON file or stdin, or flags) and print "
            '{"rank_slices": {"<rank>": [[start, stop], ...], ...}}.'
        ),
    )
    add_case_arguments(parser)
    parser.set_defaults(func=run)


def format_rank_slices(rank_slices: dict[int, tuple[tuple[int, int], ...]]) -> str:
    """JSON with one rank per line, so the table stays readable in a terminal."""
    lines = [
        f"  {json.dumps(str(rank))}: {json.dumps([list(b) for b in bounds])}"
        for rank, bounds in sorted(rank_slices.items())
    ]
    return '{"rank_slices": {\n' + ",\n".join(lines) + "\n}}\n"


def run(args: argparse.Namespace) -> int:
    case = case_from_args(args)
    print(format_rank_slices(case.tensor_layout.rank_slices(case.shape)), end="")
    return 0
