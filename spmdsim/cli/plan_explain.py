"""What `spmdsim plan --explain/--png/--json` adds to a plan: reasons, byte matrix, moving pieces.

Shared by `spmdsim plan` and `spmdsim run redistribute`. Pure: never imports mpi4py.
"""
from __future__ import annotations

import argparse
import os

from ..plan import Plan
from ..plan.summary import FOLD_RANKS, block_rule, plan_traffic

__all__ = ["dialect_of", "folded_explain_lines", "moves_and_bytes_png", "plan_record", "plan_text"]


def dialect_of(args: argparse.Namespace) -> str:
    """How steps are written: DTensor names for DTensor input, SBP-style otherwise."""
    return "dtensor" if args.from_placements or args.to_placements else "sbp"


def moves_and_bytes_png(plan: Plan, directory: str, dialect: str) -> list[str]:
    """The pieces each step moves (moves_NN.png) and who sends how many bytes to whom (bytes.png).

    Up to FOLD_RANKS ranks: past that the pieces are too many to draw (a 65,536-device exchange
    can move 2**28) and the matrix too large; --explain describes the traffic per group.
    """
    if plan.num_ranks > FOLD_RANKS:
        return []
    from ..viz.moves import render_byte_matrix_png, render_moves_png
    from ..viz.why import byte_matrix

    paths = render_moves_png(plan, directory, dialect=dialect)
    if plan.steps:
        title = f"bytes each rank sends to each rank: {plan.source} -> {plan.target}"
        paths.append(render_byte_matrix_png(byte_matrix(plan.steps, plan.num_ranks),
                                            os.path.join(directory, "bytes.png"), title))
    return paths


def plan_record(plan: Plan, args: argparse.Namespace) -> dict:
    """The JSON record; with --explain, the rank -> rank byte matrix too (over FOLD_RANKS ranks:
    one traffic record per step, `bytes_by_step`, instead)."""
    record = plan.to_json()
    if args.explain:
        if plan.num_ranks > FOLD_RANKS:
            record["bytes_by_step"] = plan_traffic(plan)
            return record
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

    lines = folded_explain_lines(plan, dialect) if plan.num_ranks > FOLD_RANKS else explain_plan_lines(plan, dialect)
    return "\n".join([format_plan(plan, dialect)] + wrap_lines(lines))


#: Ranks whose blocks a folded --explain lists (then the last rank, and the rule for the rest).
_SHOWN_RANKS = 4


def folded_explain_lines(plan: Plan, dialect: str = "sbp") -> list[str]:
    """`--explain` past FOLD_RANKS ranks: each step's reason, a few ranks' blocks with the rule that
    gives every rank's, and each step's traffic per group (linear in the ranks, no dense matrix)."""
    from ..holdings import block_text
    from ..viz.table import nbytes
    from ..viz.why import step_text, step_why

    n = plan.num_ranks
    lines = []
    for i, step in enumerate(plan.steps, 1):
        lines.append(f"step {i}, {step_text(step, dialect)}:")
        lines.append(f"  why: {step_why(step)}")
    lines.append(f"each rank's block, before -> after (ranks 0-{_SHOWN_RANKS - 1} and {n - 1} of {n:,}; "
                 "the rule below gives every rank's):")
    for rank in list(range(_SHOWN_RANKS)) + [n - 1]:
        before = block_text(plan.source, plan.shape, rank)
        after = block_text(plan.target, plan.shape, rank)
        lines.append(f"  rank {rank} {plan.source.layout.coords(rank)}: {before} -> {after}")
        if rank == _SHOWN_RANKS - 1:
            lines.append("  ...")
    lines.append(f"  before, on {plan.source.layout}: {block_rule(plan.source, plan.shape)}")
    lines.append(f"  after, on {plan.target.layout}: {block_rule(plan.target, plan.shape)}")
    lines.append(f"bytes each rank sends to each rank, per step ({n:,} ranks: by group, not a "
                 f"{n:,} x {n:,} matrix):")
    for step, record in zip(plan.steps, plan_traffic(plan)):
        head = f"  step {record['step']}, {step_text(step, dialect)}: "
        if "senders" in record:
            rows = record["senders"]
            parts = [f"{r['ranks']:,} {'rank sends' if r['ranks'] == 1 else 'ranks send'} "
                     f"{nbytes(r['bytes_sent'])} to {r['destinations']:,} "
                     f"{'rank' if r['destinations'] == 1 else 'ranks'}" + (" each" if r["ranks"] > 1 else "")
                     for r in rows[:_SHOWN_RANKS]]
            if len(rows) > _SHOWN_RANKS:
                parts.append(f"{sum(r['ranks'] for r in rows[_SHOWN_RANKS:]):,} others in "
                             f"{len(rows) - _SHOWN_RANKS:,} more kinds (--json lists them)")
            lines.append(head + "; ".join(parts))
        elif record["bytes_to_each_peer"]:
            g = record["group_size"]
            lines.append(head + f"{record['groups']:,} groups of {g:,} ranks; each rank sends each of "
                                f"the {g - 1:,} others in its group {nbytes(record['bytes_to_each_peer'])}")
        else:
            lines.append(head + "no communication")
    return lines
