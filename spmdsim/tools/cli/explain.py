"""`spmdsim explain`: the number / reorder / compute derivation of each rank's shard."""
from __future__ import annotations

import argparse
import json
from typing import Any

from ...layouts.explain import explain, explanation_to_dict, format_explanation
from .cases import add_case_arguments, case_from_args

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="show step by step which shard each rank holds",
        description=(
            "Derive each rank's shard the way MindSpore's Layout tutorial does: number the "
            "device matrix right to left, reorder it by the tensor map, compute shard "
            "numbers with strides; then each rank's slice and its values of a small arange "
            "tensor."
        ),
    )
    add_case_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the tables as JSON")
    parser.add_argument(
        "--no-values", action="store_true", help="leave out the arange values of each rank"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    case = case_from_args(args)
    ex = explain(
        case.tensor_layout, case.shape, strategy=case.strategy, values=not args.no_values
    )
    if args.json:
        print(json.dumps(explanation_to_dict(ex), indent=1))
    else:
        print(format_explanation(ex), end="")
    return 0
