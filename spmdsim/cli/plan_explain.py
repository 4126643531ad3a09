"""What `spmdsim plan --explain/--png/--json` adds to a plan: reasons, byte matrix, moving pieces.

Shared by `spmdsim plan` and `spmdsim run redistribute`. Pure: never imports mpi4py.
"""
from __future__ import annotations

import argparse
import os

from ..plan import Plan

__all__ = ["dialect_of", "moves_and_bytes_png", "plan_record", "plan_text"]


def dialect_of(args: argparse.Namespace) -> str:
    """How steps are written: DTensor names for DTensor input, SBP-style otherwise."""
    return "dtensor" if args.from_placements or args.to_placements else "sbp"


def moves_and_bytes_png(plan: Plan, directory: str, dialect: str) -> list[str]:
    """The pieces each step moves (moves_NN.png) and who sends how many bytes to whom (bytes.png)."""
    from ..viz.moves import render_byte_matrix_png, render_moves_png
    from ..viz.why import byte_matrix

    paths = render_moves_png(plan, directory, dialect=dialect)
    if plan.steps:
        title = f"bytes each rank sends to each rank: {plan.source} -> {plan.target}"
        paths.append(render_byte_matrix_png(byte_matrix(plan.steps, plan.num_ranks),
                                            os.path.join(directory, "bytes.png"), title))
    return paths


def plan_record(plan: Plan, args: argparse.Namespace) -> dict:
    """The JSON record; with --explain, the rank -> rank byte matrix too."""
    record = plan.to_json()
    if args.explain:
        from ..viz.why import byte_matrix

        record["bytes_matrix"] = byte_matrix(plan.steps, plan.num_ranks)
    return record


def plan_text(plan: Plan, args: argparse.Namespace) -> str:
    """`format_plan`, followed by the --explain lines when asked for."""
    from .plan import format_plan  # plan.py imports this module

    dialect = dialect_of(args)
    if not args.explain:
        return format_plan(plan, dialect)
    from ..viz.table import wrap_lines
    from ..viz.why import explain_plan_lines

    return "\n".join([format_plan(plan, dialect)] + wrap_lines(explain_plan_lines(plan, dialect)))
