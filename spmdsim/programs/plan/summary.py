"""Who sends how much to whom in a plan, folded: per step and group, never ranks x ranks.

Pure. A collective step runs on every group of its mesh axes at once and all
groups are alike up to relabelling their ranks, so one record per step says
it all: how many groups of how many ranks, and the bytes each member sends
each other member (the logical split of spmdsim.programs.viz.why.byte_matrix: a row of
that matrix is the step's bytes sent by that rank, spread evenly over its
peers). An Exchange is one group of every rank with no such symmetry; ranks
are folded by what they do instead: how many send how many bytes to how many
ranks. Time and memory are linear in the ranks (a folded exchange's ranks
come from its block grid, spmdsim.programs.plan.folded), where the dense matrix is
quadratic: 65,536 devices would need 2**32 cells.
"""
from __future__ import annotations

import math
from collections import Counter

from ...layouts.slicing import shard_sizes
from .record import Plan
from .steps import Exchange, Step

__all__ = ["FOLD_RANKS", "step_traffic", "plan_traffic", "sent_by_rank", "block_rule"]

#: Plans over more ranks than this print (and write in --json) per-step traffic records and a few
#: ranks' blocks instead of every rank's block and the dense rank -> rank byte matrix.
FOLD_RANKS = 64


def _destinations(step: Exchange) -> list[int]:
    """Per rank, how many ranks it sends boxes to."""
    counts = getattr(step.transfers, "counts", None)
    if counts is not None:  # folded: from the block grid
        return counts[1].tolist()
    out = [0] * step.before.layout.num_devices
    for src, _ in {(t.src, t.dst) for t in step.transfers}:
        out[src] += 1
    return out


def step_traffic(step: Step, index: int) -> dict:
    """One step's traffic as a JSON-ready record (`index`: its number in the plan, from 1).

    Collective: ``groups``, ``group_size``, ``bytes_to_each_peer`` (each member to each other
    member of its group). Exchange: ``senders``, a list of ``{"ranks", "bytes_sent",
    "destinations"}`` (that many ranks each send that many bytes to that many ranks), most
    common first. A local step (or a group of one): no traffic, ``bytes_to_each_peer`` 0.
    """
    record: dict = {"step": index, "op": step.op, "axes": list(step.axes)}
    if isinstance(step, Exchange):
        folded = Counter(zip(step.bytes_sent, _destinations(step)))
        record["senders"] = [{"ranks": n, "bytes_sent": sent, "destinations": peers}
                             for (sent, peers), n in sorted(folded.items(), key=lambda kv: (-kv[1], kv[0]))]
        return record
    n = step.before.layout.num_devices
    g = step.group_size if step.axes else 1
    sent = max(step.bytes_sent, default=0)
    record.update(groups=n // g, group_size=g, bytes_to_each_peer=sent // (g - 1) if g > 1 else 0)
    return record


def plan_traffic(plan: Plan) -> list[dict]:
    """`step_traffic` of every step of `plan`, in order."""
    return [step_traffic(step, i) for i, step in enumerate(plan.steps, 1)]


def sent_by_rank(plan: Plan) -> tuple[int, ...]:
    """Per rank, the bytes the traffic records say it sends over all steps (what a row of the
    dense byte matrix sums to)."""
    out = [0] * plan.num_ranks
    for step, record in zip(plan.steps, plan_traffic(plan)):
        if isinstance(step, Exchange):
            out = [a + b for a, b in zip(out, step.bytes_sent)]
        elif record["group_size"] > 1:
            each = record["bytes_to_each_peer"] * (record["group_size"] - 1)
            out = [a + each for a in out]
    return tuple(out)


def block_rule(tl, shape: tuple) -> str:
    """Which block of each dim a rank holds, by its mesh coordinates: ``dim 0: 16 blocks of 256,
    block a; dim 1: whole``."""
    layout = tl.layout
    parts = []
    for d, (size, axes) in enumerate(zip(shape, tl.tensor_map)):
        if not axes:
            parts.append(f"dim {d}: whole")
            continue
        sizes = [layout.axis_size(a) for a in axes]
        terms = []
        for k, axis in enumerate(axes):
            stride = math.prod(sizes[k + 1:])
            terms.append(axis if stride == 1 else f"{stride}*{axis}")
        count = math.prod(sizes)
        if count == 1:  # split over axes of size 1: every rank holds the whole dim (not "1 blocks of 64")
            parts.append(f"dim {d}: whole")
            continue
        blocks = f"{size // count:,}"
        if size % count and layout.cut != "even":  # an uneven cut's blocks: the longest first
            lengths = shard_sizes(size, tuple(sizes), layout.cut)
            blocks = f"{max(lengths):,} to {min(lengths):,} (cut {layout.cut!r})"
        parts.append(f"dim {d}: {count:,} blocks of {blocks}, block {' + '.join(terms)}")
    text = "; ".join(parts) if parts else "the 0-d value"
    return text + (f"; partial over {', '.join(tl.partial)}" if tl.partial else "")
