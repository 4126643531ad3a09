"""The text of `spmdsim plan` (`format_plan`) and what --explain/--png/--json add: reasons, byte
matrix, moving pieces.

Shared by `spmdsim plan` and `spmdsim run redistribute`. Pure: never imports mpi4py or the runtime.
"""
from __future__ import annotations

import argparse
import math
import os
import textwrap

import numpy as np

from ...errors import SpmdsimError
from ...programs.plan import Plan
from ...programs.plan.steps import Allgather, Allreduce
from ...programs.plan.summary import FOLD_RANKS, block_rule, plan_traffic
from ...programs.cost import DEFAULT_MODEL, load_or_default, predict_plan
from ...programs.viz.table import nbytes, WIDTH, wrap_lines
from ...programs.viz.why import BOUND_WITH_SUMS, byte_matrix, explain_plan_lines, step_text, step_why
from ...programs.viz.moves import render_byte_matrix_png, render_moves_png
from ...layouts.holdings import block_text

__all__ = ["dialect_of", "folded_explain_lines", "format_plan", "moves_and_bytes_png", "plan_record", "plan_text",
           "ratio_text"]


def _baseline(plan: Plan) -> int:
    """Bytes per rank of the Allgather-based conversion: gather everything, then slice."""
    source, layout = plan.source, plan.source.layout
    size = math.prod(plan.shape) * np.dtype(plan.dtype).itemsize
    gathered = layout.group_size(source.split_axes)
    g = layout.group_size(source.partial)
    summed = Allreduce.moved(g, size) if g > 1 else 0
    if source.uneven_dims(plan.shape):  # unequal shards: the rank holding the least receives the most
        itemsize = np.dtype(plan.dtype).itemsize
        least = min(math.prod(source.local_shape(plan.shape, r)) for r in range(layout.num_devices))
        return size - least * itemsize + summed
    return Allgather.moved(gathered, size // gathered) + summed


def _predicted(plan: Plan) -> tuple[list[float], str]:
    """Seconds per step from the alpha-beta model (spmdsim.programs.cost) and where the model came from.

    ([], why) when the estimate is unavailable.
    """
    try:
        model = load_or_default()
    except (SpmdsimError, OSError) as exc:
        # The plan itself is still right: print it, and say why the column is missing.
        return [], f"unavailable, {exc}"
    origin = ("built-in model (`spmdsim calibrate` fits one for this machine)"
              if model is DEFAULT_MODEL else "this machine's calibration (`spmdsim calibrate`)")
    try:
        return [p.seconds for p in predict_plan(plan, model)], origin
    except Exception as exc:  # noqa: BLE001 - the estimate is optional decoration, but say why
        return [], f"unavailable, the cost model cannot price this plan: {exc}"


def ratio_text(numerator: int, denominator: int) -> str:
    """numerator / denominator to one decimal, rounded half up in integers (exact at any size)."""
    tenths = (20 * numerator + denominator) // (2 * denominator)
    return f"{tenths // 10:,}.{tenths % 10}"


def _duration(seconds: float) -> str:
    """A predicted time: milliseconds up to a thousand seconds, then seconds in 3 digits."""
    return f"{seconds * 1e3:.3f} ms" if seconds < 1e3 else f"{seconds:.3g} s"


def format_plan(plan: Plan, dialect: str = "sbp") -> str:
    """The human-readable `spmdsim plan` report (steps written in `dialect`: "sbp" or "dtensor")."""
    where = str(plan.source.layout)
    if plan.target.layout != plan.source.layout:
        where += f" -> {plan.target.layout}"
    lines = [f"redistribute {plan.source} -> {plan.target} on {where}",
             f"shape {plan.shape!r} {plan.dtype}"]
    mesh = plan.steps[0].before.layout if plan.steps else plan.source.layout
    if mesh not in (plan.source.layout, plan.target.layout):
        lines.append(f"planned on the common mesh {mesh}")
    if not plan.steps:
        lines.append("  no steps: every rank already holds its target block")
    texts = [step_text(s, dialect) for s in plan.steps]
    sent = [f"{s.max_bytes_sent:,} B" for s in plan.steps]
    received = [f"{s.max_bytes_received:,} B" for s in plan.steps]
    columns = max(map(len, sent + received + ["received/rank"]))  # wider at huge sizes, never cut
    seconds, origin = _predicted(plan)
    # A step too long for the row wraps inside its column, the figures on its first line: the whole row
    # wrapped at 100 columns cut the table apart ("2,048" on one line, its "B" under the step).
    numbers = 2 * (columns + 2) + (13 if seconds else 0)
    width = max(min(max(map(len, texts + ["step"])), WIDTH - 6 - numbers), 24)
    if plan.steps:
        lines.append(f"  {'#':>2}  {'step':<{width}}  {'sent/rank':>{columns}}  {'received/rank':>{columns}}"
                     + ("  predicted" if seconds else ""))
    for i, text in enumerate(texts, 1):
        first, *more = textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False) or [""]
        lines.append(f"  {i:>2}. {first:<{width}}  {sent[i - 1]:>{columns}}  {received[i - 1]:>{columns}}"
                     + (f"  {_duration(seconds[i - 1]):>11}" if seconds else ""))
        lines += [f"      {line}" for line in more]
    got, low = plan.max_bytes_received, plan.max_lower_bound
    verdict = "meets it on every rank" if plan.meets_lower_bound else "above it"
    if not plan.meets_lower_bound and (plan.source.partial or plan.target.partial):
        # Say why, or a reader takes the plan for a poor one (docs/explanation/redistribution.md).
        verdict += f": with pending sums {BOUND_WITH_SUMS}"
    lines.append(f"total received per rank (max): {got:,} B; lower bound {low:,} B ({verdict})")
    base = _baseline(plan)
    if base and got:
        how = " and ".join(w for w, on in (("Allreduce", plan.source.partial),
                                            ("Allgather", plan.source.split_axes)) if on)
        lines.append(f"for comparison, the whole tensor on every rank ({how}, then slice) would "
                     f"receive {base:,} B per rank ({ratio_text(base, got)}x this plan)")
    if seconds:
        lines.append(f"predicted: alpha-beta cost model, {origin}")
    elif plan.steps and origin:
        lines.append(f"predicted: {origin}")
    return "\n".join(wrap_lines(lines))


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
    paths = render_moves_png(plan, directory, dialect=dialect)
    if plan.steps:
        title = f"bytes each rank sends to each rank: {plan.source} -> {plan.target}"
        matrix = byte_matrix(plan.steps, plan.num_ranks, plan.shape, np.dtype(plan.dtype).itemsize)
        paths.append(render_byte_matrix_png(matrix,
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
        record["bytes_matrix"] = byte_matrix(plan.steps, plan.num_ranks, plan.shape, np.dtype(plan.dtype).itemsize)
    return record


def plan_text(plan: Plan, args: argparse.Namespace) -> str:
    """`format_plan`, followed by the --explain lines when asked for."""
    dialect = dialect_of(args)
    if not args.explain:
        return format_plan(plan, dialect)
    lines = folded_explain_lines(plan, dialect) if plan.num_ranks > FOLD_RANKS else explain_plan_lines(plan, dialect)
    return "\n".join([format_plan(plan, dialect)] + wrap_lines(lines))


#: Ranks whose blocks a folded --explain lists (then the last rank, and the rule for the rest).
_SHOWN_RANKS = 4


def folded_explain_lines(plan: Plan, dialect: str = "sbp") -> list[str]:
    """`--explain` past FOLD_RANKS ranks: each step's reason, a few ranks' blocks with the rule that
    gives every rank's, and each step's traffic per group (linear in the ranks, no dense matrix)."""
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
            # An uneven cut's pieces (Layout.cut): the busiest rank's bytes, spread over its peers.
            spread = " on average (the busiest rank's)" if len(set(step.bytes_sent)) > 1 else ""
            peers = "the other rank" if g == 2 else f"each of the {g - 1:,} others"  # not "each of the 1 others"
            groups = "1 group" if record["groups"] == 1 else f"{record['groups']:,} groups"  # not "1 groups"
            lines.append(head + f"{groups} of {g:,} ranks; each rank sends {peers} in its "
                                f"group {nbytes(record['bytes_to_each_peer'])}{spread}")
        else:
            lines.append(head + "no communication")
    return lines
