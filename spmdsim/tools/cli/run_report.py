"""`spmdsim run OP`'s run on the ranks and its report: each rank's layout and collectives, folded past a few
ranks, the error against the reference and PASS or FAIL (or one JSON record).
"""
from __future__ import annotations

import json
import re
from typing import Any, Sequence

from ...layouts.holdings import _layout_and_shape
from ...programs.plan.summary import FOLD_RANKS, block_rule
from ...programs.viz.table import nbytes, wrap_lines
from ...runtime.ranked import fold_ranked, trace_lines
from ..demo.registry import explain_notes, group_text

__all__ = ["report", "fold_rank_lines"]


#: Ranks whose lines a run past FOLD_RANKS ranks prints (then "...", the last rank, and the rule that
#: gives every rank's blocks), as `spmdsim plan --explain` does.
SHOWN_RANKS = 4


_RANK_PREFIX = re.compile(r"rank \d+ \([^)]*\): ")


def fold_rank_lines(job: Any, out: Any, rank_lines: Sequence[Sequence[str]]) -> list[str]:
    """Every rank's lines (its blocks, with --explain its collectives), in rank order.

    Up to FOLD_RANKS ranks, each rank's lines as they are. Past that (one line per rank is 4,096
    lines at 4,096 ranks), ranks whose lines are equal apart from their rank share one entry
    (``ranks 0-3 (4 ranks): holds ...``), and when more than SHOWN_RANKS + 1 entries remain only
    the first SHOWN_RANKS and the last are printed, then the rule that gives every rank's block
    of each tensor and each collective's groups.
    """
    n = len(rank_lines)
    if n <= FOLD_RANKS:
        return [line for lines in rank_lines for line in lines]
    entries: dict[tuple[str, ...], list[int]] = {}
    for rank, lines in enumerate(rank_lines):
        head = _RANK_PREFIX.sub("", lines[0], count=1) if lines else ""
        entries.setdefault((head, *lines[1:]), []).append(rank)
    kinds = sorted(entries.items(), key=lambda item: item[1][0])
    text = []
    shown = kinds if len(kinds) <= SHOWN_RANKS + 1 else kinds[:SHOWN_RANKS] + kinds[-1:]
    for i, (key, ranks) in enumerate(shown):
        if len(ranks) == 1:
            text.extend(rank_lines[ranks[0]])
        else:
            text.append(f"ranks {group_text(ranks, braces=False)}: {key[0]}")
            text.extend(key[1:])
        if len(shown) < len(kinds) and i == SHOWN_RANKS - 1:
            text.append(f"... ({sum(len(r) for _, r in kinds[SHOWN_RANKS:-1]):,} ranks more)")
    if len(shown) == len(kinds):
        return text
    mesh = job.mesh
    text.append(f"each rank's block ({n:,} ranks; the rule gives every rank's, by its coordinates "
                f"on {mesh.layout}):")
    for name, tensor in job.inputs.items():
        layout, shape, _ = _layout_and_shape(name, tensor)
        text.append(f"  {name}: {block_rule(layout, shape)}")
    text.append(f"  output: {block_rule(out.layout, out.global_shape)}")
    for step, _ in job.steps:
        size = len(mesh.group_ranks(step.axes))
        text.append(f"  {step.via} over each rank's group along {', '.join(step.axes)}: "
                    f"{n // size:,} {'group' if n == size else 'groups'} of {size:,} ranks")
    return text


def report(job: Any, result: Any, rank_lines: list, as_json: bool = False,
           calls: Sequence[str] | None = None, explain: bool = False) -> str:
    """The text (or JSON) rank 0 prints for one run (`calls`: every rank's, folded; else rank 0's)."""

    v, stats = result.verdict, result.stats
    if as_json:
        return json.dumps({
            "op": job.op, "layouts": job.layouts, "passed": bool(v.passed),
            "max_abs_error": float(v.max_abs_error), "collectives": stats["counts"],
            "bytes_sent_per_rank": stats["bytes_sent_max"],
        })
    text = [f"{job.op}: {job.layouts} on {job.mesh.layout}"]
    text.extend(fold_rank_lines(job, result.out, rank_lines))
    if explain:
        text.extend(explain_notes(job))
    text.append("collectives:")
    if calls is None:  # only this rank's trace at hand
        calls = fold_ranked([trace_lines(result.entries)])
    text.extend("  " + line for line in calls)
    text.append(f"sent per rank (max): {nbytes(stats['bytes_sent_max'])}")
    # An empty result (a size 0 in --shape, which the command takes) compares nothing: said, not a bare PASS.
    empty = " (the result is empty: 0 elements compared)" if v.elements == 0 else ""
    text.append(f"max abs error: {float(v.max_abs_error):.3e}  {'PASS' if v.passed else 'FAIL'}{empty}")
    return "\n".join(wrap_lines(text))
