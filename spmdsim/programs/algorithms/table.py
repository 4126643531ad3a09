"""Text pictures of a schedule: its rounds as a table and what every rank holds after each round.

Pure. Transfers of a round that follow one rule are folded into one line:
``r->r+1`` (every rank sends to the next), ``r<->r^2`` (pairs exchange),
with the ranks they cover (``0-7``) and the slot each sends (``slot r-1``).
"""
from __future__ import annotations

from typing import Sequence

from ..viz.model import compact_ranks
from .schedule import Schedule
from ..transfer import Transfer
from .symbolic import leaves, states

__all__ = ["format_rounds", "format_states", "describe_round", "cell_text"]

_PATTERN = 50  # columns of the "sends" column; a table row stays within 100


def _offset(c: int, p: int) -> str:
    c %= p
    return f"+{c}" if c <= p // 2 else f"-{p - c}"


def _slots_text(slots: Sequence[int]) -> str:
    return ("slot " if len(slots) == 1 else "slots ") + compact_ranks(slots, run=2)


def _slot_rule(group: list[Transfer], p: int, count: int) -> str:
    """The slots a group sends, as one phrase."""
    first = group[0].piece
    if all(t.piece == first for t in group):
        return "all slots" if len(first) == count and count > 1 else _slots_text(first)
    if all(len(t.piece) == 1 for t in group):
        shifts = {(t.piece[0] - t.src) % p for t in group}
        if len(shifts) == 1 and count == p:
            shift = shifts.pop()
            return "slot r" if shift == 0 else f"slot r{_offset(shift, p)}"
        if all(t.piece[0] == t.dst for t in group):
            return "the receiver's slot"
    sizes = {len(t.piece) for t in group}
    if len(sizes) == 1:
        n = sizes.pop()
        return f"{n} slot{'s' if n > 1 else ''} each"
    return "slots vary"


def _peer_rule(group: list[Transfer], p: int) -> str | None:
    xors = {t.dst ^ t.src for t in group}
    pairs = {(t.src, t.dst) for t in group}
    if len(xors) == 1 and all((b, a) in pairs for a, b in pairs):  # pairs that swap
        return f"r<->r^{xors.pop()}"
    shifts = {(t.dst - t.src) % p for t in group}
    if len(shifts) == 1:
        return f"r->r{_offset(shifts.pop(), p)}"
    return None


def describe_round(schedule: Schedule, index: int) -> list[tuple[str, int]]:
    """(phrase, bytes per message) lines for round `index`, transfers of one rule folded together."""
    p, count = schedule.group_size, len(schedule.slot_counts)
    by_size: dict[int, list[Transfer]] = {}
    for t in schedule.rounds[index].transfers:
        by_size.setdefault(schedule.slot_bytes(t.piece), []).append(t)
    lines = []
    for nbytes, group in by_size.items():
        rule = _peer_rule(group, p) if len(group) > 1 else None
        if rule is not None:
            ranks = compact_ranks([t.src for t in group])
            lines.append((f"{rule} ({ranks}), {_slot_rule(group, p, count)}", nbytes))
            continue
        for t in group:
            lines.append((f"{t.src}->{t.dst}, {_slots_text(t.piece)}", nbytes))
    return lines


def format_rounds(schedule: Schedule, seconds: Sequence[float] | None = None, width: int = 100) -> str:
    """The rounds as a table: phase, who sends what to whom, bytes per message, time if given."""
    pattern = max(20, min(_PATTERN, width - 48))
    head = f"{'round':>5}  {'phase':<16}  {'sends':<{pattern}}  {'bytes/msg':>11}"
    lines = [head + ("  " + f"{'ms':>8}" if seconds is not None else "")]
    for i, rnd in enumerate(schedule.rounds):
        for j, (text, nbytes) in enumerate(describe_round(schedule, i)):
            if len(text) > pattern:
                text = text[:pattern - 3] + "..."
            row = f"{i + 1 if j == 0 else '':>5}  {rnd.phase if j == 0 else '':<16}  {text:<{pattern}}  {nbytes:>11,}"
            if seconds is not None:
                row += "  " + (f"{seconds[i] * 1e3:>8.3f}" if j == 0 else " " * 8)
            lines.append(row.rstrip())
    if not schedule.rounds:
        lines.append("    -  (one rank: nothing to send)")
    return "\n".join(lines)


def cell_text(schedule: Schedule, term) -> str:
    """What a slot holds, in a few characters (see format_states)."""
    if term is None:
        return "."
    got = leaves(term)
    if schedule.collective in ("allreduce", "reduce_scatter"):
        return compact_ranks([rank for rank, _ in got])
    if schedule.collective == "alltoall":
        return f"{got[0][0]}>{got[0][1]}"
    if schedule.collective == "allgather":
        return str(got[0][0])
    return f"b{got[0][1]}"


def format_states(schedule: Schedule, width: int = 100) -> str:
    """What each rank's slots hold before and after every round: the ranks summed in (reductions),

    the block's owner (allgather), ``j>k`` (rank j's block for rank k, alltoall) or
    ``bK`` (piece K of the root's buffer, bcast); ``.`` holds nothing yet.
    """
    snapshots = states(schedule)
    cells = [[[cell_text(schedule, t) for t in rank_slots] for rank_slots in snap] for snap in snapshots]
    cell_width = max(len(c) for snap in cells for rank in snap for c in rank) + 1
    slots = len(schedule.slot_counts)
    if 8 + slots * cell_width > width:
        return f"(the {slots} slots per rank do not fit {width} columns; use --png)"
    lines = []
    for i, snap in enumerate(cells):
        title = "before round 1" if i == 0 else f"after round {i} ({schedule.rounds[i - 1].phase})"
        lines.append(title)
        lines.append("  rank  " + "".join(f"{'s' + str(s):>{cell_width}}" for s in range(slots)))
        for rank, row in enumerate(snap):
            lines.append(f"  {rank:>4}  " + "".join(f"{c:>{cell_width}}" for c in row))
    return "\n".join(lines)
