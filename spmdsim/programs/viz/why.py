"""Why each redistribution step runs, each rank's block before and after, and who sends to whom.

Pure: reads Plan and Step records only. The rank -> rank byte matrix is the
logical one: what each rank's collective delivers to each other rank of its
group (a ring Allreduce moves its 2(g-1)/g as a Reduce_scatter then an
Allgather, each peer getting 1/g of the block in each half), so a row sums to
the step's bytes sent by that rank and a column to the bytes that rank received.
"""
from __future__ import annotations

import re
from typing import Callable, Sequence

import numpy as np

from ...layouts.holdings import block_text
from ..plan.record import Plan
from ..plan.steps import Allgather, Allreduce, Alltoall, Exchange, LocalSlice, LocalZero, ReduceScatter, Step
from ..plan.uneven import is_uneven
from ..plan.volume import box_size, intersect, rank_boxes
from .table import WIDTH, fold_table, nbytes

__all__ = ["step_why", "step_text", "step_groups", "explain_plan_lines", "byte_matrix",
           "format_byte_matrix", "BOUND_WITH_SUMS"]

#: Why a plan with pending sums stays above the lower bound, in one sentence.
BOUND_WITH_SUMS = ("the bound counts each summed element once, as if adding were free; the "
                   "collectives that add (Allreduce, Reduce_scatter) must also move the addends, "
                   "so no plan reaches it")

# S(d)/B/P as PyTorch DTensor writes them: the placements a DTensor user gave.
_DTENSOR = ((re.compile(r"S\((\d+)\)"), r"Shard(\1)"),
            (re.compile(r"(?<![A-Za-z])B(?![A-Za-z(])"), "Replicate()"),
            (re.compile(r"(?<![A-Za-z])P(?![A-Za-z(])"), "Partial()"))


def _over(step: Step) -> str:
    return _names(step.axes)


def _names(axes: Sequence[str]) -> str:
    return "(" + ", ".join(repr(a) for a in axes) + ")" if len(axes) > 1 else repr(axes[0])


def step_why(step: Step) -> str:
    """One sentence: what the step changes and why that takes its collective (or none)."""
    g = step.group_size
    if isinstance(step, LocalSlice):
        return (f"the target splits a dim over {_over(step)} that every rank already holds whole: "
                "each rank keeps its part, no communication")
    if isinstance(step, LocalZero):
        return _zero_why(step)
    if isinstance(step, Allgather):
        return (f"dim {step.tensor_dim} is split over {_over(step)} and the target wants it whole: "
                f"each rank receives {_others(g - 1, 'piece')} of its group of {g}")
    if isinstance(step, Alltoall):
        sends = "sends the other rank its part" if g == 2 else f"sends each of the {g - 1} others its part"
        # Unequal figures by rank: an uneven cut's pieces (Layout.cut), not 1/g each.
        kept = "its own part" if len(set(step.bytes_received)) > 1 else f"1/{g}"
        return (f"the split moves from dim {step.concat_dim} to dim {step.split_dim} over "
                f"{_over(step)}: each rank keeps {kept} of its block and {sends}")
    if isinstance(step, Allreduce):
        return (f"the ranks over {_over(step)} hold addends of a pending sum and the target "
                f"wants the value on every rank: a ring Allreduce sends 2({g}-1)/{g} of the block")
    if isinstance(step, ReduceScatter):
        return (f"the ranks over {_over(step)} hold addends of a pending sum and the target "
                f"splits dim {step.tensor_dim}: each rank receives the sum of its part only")
    if isinstance(step, Exchange):
        return ("no single collective on one mesh-axis group makes the target: each rank receives "
                "exactly the boxes of its new block it lacks (Alltoallv)")
    return f"{step}"


def _zero_why(step: Step) -> str:
    """LocalZero's reason: an axis that split a dim (S -> P) pads each rank's own block with zeros; an axis
    of copies (B -> P) keeps one copy and zeros the others. One step may do both."""
    split = [a for a in step.axes if a in step.before.split_axes]
    copies = [a for a in step.axes if a not in split]
    parts = []
    if split:
        dims = [d for d, axes in enumerate(step.before.tensor_map) if set(axes or ()) & set(split)]
        which = f"dim {dims[0]}" if len(dims) == 1 else "dims " + ", ".join(map(str, dims))
        parts.append((f"{_names(split)}, which split {which}",
                      "each rank puts its own block inside a zero block the size of its new one, so the "
                      f"sum over {_names(split)} is the value"))
    if copies:
        parts.append((f"{_names(copies)}, whose ranks hold copies",
                      "one copy keeps the values and the others hold zeros"))
    if len(parts) == 1:
        (where, what), = parts
        return f"the target is a pending sum over {where}: {what}; no communication"
    return (f"the target is a pending sum over {_over(step)}: "
            + "; ".join(f"over {where}, {what}" for where, what in parts) + "; no communication")


def step_text(step: Step, dialect: str = "sbp") -> str:
    """The step as the plan prints it, its placements in the input's dialect.

    "sbp" (also Layout maps, PartitionSpecs, strategies): ``S(0)->B via Allgather``;
    "dtensor": ``Shard(0)->Replicate() via Allgather``.
    """
    text = str(step)
    if dialect != "dtensor" or isinstance(step, Exchange):
        return text
    head, sep, rest = text.partition(" via ")
    for pattern, repl in _DTENSOR:
        head = pattern.sub(repl, head)
    return head + sep + rest


def _others(n: int, noun: str) -> str:
    """"the other piece" / "the other 3 pieces"."""
    return f"the other {noun}" if n == 1 else f"the other {n} {noun}s"


def step_groups(step: Step) -> tuple[tuple[int, ...], ...]:
    """The rank groups `step` runs on (every rank in one group for an Exchange)."""
    if not step.axes:
        return (tuple(range(step.before.layout.num_devices)),)
    return step.before.layout.axis_groups(step.axes)


def byte_matrix(steps: Step | Sequence[Step], num_ranks: int, shape: Sequence[int] | None = None,
                itemsize: int = 0) -> list[list[int]]:
    """matrix[src][dst]: logical bytes rank `src` sends rank `dst` over the given step(s).

    Row `src` sums to the steps' bytes_sent[src] and column `dst` to their bytes_received[dst], the
    figures of the step table. With the tensor's `shape` and `itemsize`, a collective on an uneven
    cut's pieces (Layout.cut) counts each pair's own piece; else a rank's bytes are shared out
    equally over its peers."""
    steps = (steps,) if isinstance(steps, Step) else tuple(steps)
    out = [[0] * num_ranks for _ in range(num_ranks)]
    for step in steps:
        if isinstance(step, (LocalSlice, LocalZero)):
            continue  # each rank keeps (or zeroes) part of its own block: nothing moves
        if isinstance(step, Exchange):
            # Each rank's bytes sent, shared out over its boxes by their element counts.
            volume = [0] * num_ranks
            for src, _, box, _, _ in step.transfers:
                volume[src] += _volume(box)
            for src, dst, box, _, _ in step.transfers:
                out[src][dst] += step.bytes_sent[src] * _volume(box) // volume[src]
            continue
        if shape is not None and not isinstance(step, Allreduce) and is_uneven(step, tuple(shape)):
            _uneven_pairs(out, step, tuple(shape), itemsize)
            continue
        for group in step_groups(step):
            peers = len(group) - 1
            for i, src in enumerate(group):
                if peers < 1 or not step.bytes_sent[src]:
                    continue
                # The remainder of an inexact share (a ring Allreduce's 2(g-1)/g of a block that
                # g does not divide) goes one byte each to the next ranks round the group: every
                # member holds as many bytes, so each column gets as many extra bytes as each row.
                share, extra = divmod(step.bytes_sent[src], peers)
                for k in range(1, peers + 1):
                    out[src][group[(i + k) % len(group)]] += share + (k <= extra)
    return out


def _uneven_pairs(out: list[list[int]], step: Step, shape: tuple, itemsize: int) -> None:
    """Add each pair's bytes of a collective on unequal pieces: a gathered piece, a moved overlap, an addend."""
    before, after = rank_boxes(step.before, shape), rank_boxes(step.after, shape)
    for group in step_groups(step):
        for src in group:
            for dst in group:
                if src == dst:
                    continue
                if isinstance(step, Allgather):
                    n = box_size(before[src])
                elif isinstance(step, ReduceScatter):
                    n = box_size(after[dst])
                else:
                    common = intersect(before[src], after[dst])
                    n = 0 if common is None else box_size(common)
                out[src][dst] += n * itemsize


def _volume(box: Sequence[tuple[int, int]]) -> int:
    size = 1
    for start, stop in box:
        size *= stop - start
    return size


def format_byte_matrix(matrix: Sequence[Sequence[int]], width: int | None = WIDTH,
                       total: Callable[[int], str] = nbytes) -> list[str]:
    """The rank -> rank table: one row per sending rank, one column per receiving rank.

    Columns that do not fit `width` are dropped with a note naming them (the
    JSON record and the PNG heatmap keep them all). `total` writes a row's sum
    (bytes; an MoE dispatch's token matrix gives counts, spmdsim.models.moe.report).
    """
    n = len(matrix)
    cell = max([len(f"{v:,}") for row in matrix for v in row] + [len(str(n - 1)) + 2, 1])
    shown = n
    if width is not None:
        shown = max(1, min(n, (width - 22) // (cell + 1)))
    head = ["from \\ to"] + [f"r{d}" for d in range(shown)] + ["sent"]
    rows = []
    for src in range(n):
        row = matrix[src]
        rows.append([f"r{src}"] + [f"{v:,}" if v else "." for v in row[:shown]] + [total(sum(row))])
    rows.append(["received"] + [f"{sum(matrix[s][d] for s in range(n)):,}" for d in range(shown)] + [""])
    lines = fold_table(head, rows, width=None, right=tuple(range(1, shown + 2)), gap=1)
    if shown < n:
        lines.append(f"(columns r{shown}..r{n - 1} left out to fit {width} columns; --json has them)")
    return lines


def explain_plan_lines(plan: Plan, dialect: str = "sbp", width: int = WIDTH) -> list[str]:
    """`--explain` of a redistribution: each step's reason, each rank's block before and after."""
    lines = []
    for i, step in enumerate(plan.steps, 1):
        lines.append(f"step {i}, {step_text(step, dialect)}:")
        lines.append(f"  why: {step_why(step)}")
    lines.append("each rank's block, before -> after:")
    for rank in range(plan.num_ranks):
        before = block_text(plan.source, plan.shape, rank)
        after = block_text(plan.target, plan.shape, rank)
        lines.append(f"  rank {rank} {plan.source.layout.coords(rank)}: {before} -> {after}")
    lines.append("bytes each rank sends to each rank (all steps):")
    matrix = byte_matrix(plan.steps, plan.num_ranks, plan.shape, np.dtype(plan.dtype).itemsize)
    lines.extend("  " + line for line in format_byte_matrix(matrix, width - 2))
    return lines
