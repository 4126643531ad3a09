"""The per-operator table of a network run (pure: built from plain trace tuples).

One row per hop: the operator or the redistribution into it, its device
matrix, the layouts in -> out, the collectives with their counts, and the
largest number of bytes one rank sent.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .model import Hop, Network, short_layout
from ...base.validate import counted
from ...programs.viz.table import fold_table, nbytes, wrap_lines

__all__ = ["HopRow", "row_of", "format_table", "collective_name"]

_NAMES = {"allreduce": "Allreduce", "allgather": "Allgather", "alltoall": "Alltoall",
          "reduce_scatter": "Reduce_scatter", "alltoallv": "Alltoallv", "bcast": "Bcast"}


def collective_name(op: str, axes: Sequence[str] | None) -> str:
    """``Allreduce(k)``, ``Alltoall(sp,dp)``; an exchange spans the whole mesh."""
    name = _NAMES.get(op, op)
    if op == "alltoallv" or axes is None:
        return f"{name}(all)"
    return f"{name}({','.join(axes)})"


@dataclass(frozen=True)
class HopRow:
    """One table row, identical on every rank.

    Attributes:
        calls: ((op, axes), count) of collectives on groups of more than one rank.
        sent: per rank, the bytes it sent in this hop.
    """

    index: int
    hop: Hop
    calls: tuple[tuple[tuple[str, tuple[str, ...]], int], ...]
    sent: tuple[int, ...]

    @property
    def max_sent(self) -> int:
        return max(self.sent, default=0)

    def collectives(self) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """(op, axes) of every call in order of first use, repeated by count."""
        return tuple(key for key, n in self.calls for _ in range(n))

    def matches(self) -> bool:
        """Whether the traced collectives are exactly the ones the hop's plan expects."""
        traced = tuple((op, None if op == "alltoallv" else axes) for op, axes in self.collectives())
        return traced == tuple(self.hop.expected)

    def collectives_text(self) -> str:
        if not self.calls:
            note = self.hop.note()
            return "none" if note == "local compute" else f"none ({note})"
        return ", ".join(f"{collective_name(op, axes)} x{n}" for (op, axes), n in self.calls)


def row_of(index: int, hop: Hop, per_rank: Sequence[Sequence[tuple]]) -> HopRow:
    """A row from every rank's (op, axes, group_size, bytes_sent) entries of one hop."""
    calls: dict[tuple, int] = {}
    for op, axes, group_size, _ in per_rank[0]:
        if group_size > 1:
            key = (op, tuple(axes))
            calls[key] = calls.get(key, 0) + 1
    sent = tuple(sum(s for _, _, g, s in entries if g > 1) for entries in per_rank)
    return HopRow(index, hop, tuple(calls.items()), sent)


def format_table(net: Network, rows: Sequence[HopRow], world_size: int, width: int | None = 100) -> str:
    """The text table with a totals line (bytes: the rank that sent most over the whole run).

    Long cells fold onto more lines to keep within `width` columns (None: one line per row).
    """
    head = ("#", "step", "device matrix", "layout in -> out", "collectives", "sent/rank")
    body = []
    for row in rows:
        hop = row.hop
        stage = net.stages[hop.stage]
        step = hop.label if hop.is_redistribution else f"{stage.name} {stage.how}"
        matrix = "x".join(str(s) for s in hop.after.layout.device_matrix)
        names = ",".join(hop.after.layout.alias_name)
        body.append((str(row.index), step, f"{matrix} ({names})",
                     f"{short_layout(hop.before)} -> {short_layout(hop.after)}",
                     row.collectives_text(), nbytes(row.max_sent)))
    totals = [sum(r.sent[rank] for r in rows) for rank in range(world_size)] if rows else [0]
    calls = sum(n for r in rows for _, n in r.calls)
    title = (f"{net.name}: {net.title}; input {net.source.shape} {net.source.dtype}, "
             f"{counted(world_size, 'rank')}")
    lines = wrap_lines([title], width) if width else [title]
    table = fold_table(head, body, width=width, right=(0, 5), keep=(0,))
    # The totals on one line of their own, under the step column and the bytes column: in the
    # table the count would fold inside the narrow collectives column ("2 collective / calls").
    left = " " * table[0].index("step") + f"total: {counted(calls, 'collective call')}"
    sent = nbytes(max(totals))
    room = max(len(line) for line in table) - len(left)
    return "\n".join(lines + table + [left + (sent.rjust(room) if room > len(sent) else "  " + sent)])
