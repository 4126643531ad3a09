"""A dry run's report (spmdsim.runtime.sim.dry): each rank's collectives, bytes on the wire and peak bytes
held, as a table whose runs of equal lines fold, or as JSON."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .waiting import ranks_text
from ...programs.viz.table import fold_table

__all__ = ["RankBytes", "DryRunReport", "report"]


@dataclass(frozen=True)
class RankBytes:
    """One rank's line of a dry run: its collectives, bytes on the wire, peak bytes held."""

    rank: int
    calls: int
    bytes_sent: int
    bytes_received: int
    peak_bytes_held: int
    counts: tuple[tuple[str, int], ...] = ()

    def key(self) -> tuple:
        return (self.calls, self.bytes_sent, self.bytes_received, self.peak_bytes_held, self.counts)


@dataclass(frozen=True, repr=False)
class DryRunReport:
    """Every rank's line; `table()` folds runs of ranks with equal lines, `to_json()` lists them all;
    `notes`: the lines the program added (`note`), below the table. Printed, or shown as a notebook cell's
    value (IPython's `_repr_pretty_`), it is the table; its repr is one line (a line per rank would be 94 KB at
    1,024 ranks)."""

    ranks: tuple[RankBytes, ...]
    notes: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"<DryRunReport of {len(self.ranks)} simulated ranks: print() it or .table() for the table>"

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.table())

    def folded(self) -> list[tuple[list[int], RankBytes]]:
        """(ranks, line) for each distinct line, ranks in order (equal lines anywhere fold together)."""
        groups: dict[tuple, tuple[list[int], RankBytes]] = {}
        for row in self.ranks:
            groups.setdefault(row.key(), ([], row))[0].append(row.rank)
        return list(groups.values())

    def table(self) -> str:
        """Equal ranks folded into one row; within 100 columns (a long list of collectives folds)."""
        head = ("ranks", "calls", "sent B", "received B", "peak held B", "collectives")
        rows = [(_ranks_cell(ranks), row.calls, f"{row.bytes_sent:,}", f"{row.bytes_received:,}",
                 f"{row.peak_bytes_held:,}", ", ".join(f"{op} x{n}" for op, n in row.counts) or "none")
                for ranks, row in self.folded()]
        return "\n".join([f"dry run on {len(self.ranks)} simulated ranks (no data; bytes from the trace)"]
                         + fold_table(head, rows, right=(1, 2, 3, 4), keep=(0, 1, 2, 3, 4)) + list(self.notes))

    def to_json(self) -> str:
        return json.dumps({"ranks": [asdict(r) for r in self.ranks], **({"notes": list(self.notes)}
                                                                         if self.notes else {})})


def _ranks_cell(ranks: list[int]) -> str:
    """"ranks 0-6,8-44" within 21 columns, else how many ("1022 ranks"; --json lists them)."""
    text = ranks_text(ranks)
    return text if len(text) <= 21 else f"{len(ranks)} ranks"


def report(contexts: Any, size: int, stands_for: Any = None) -> DryRunReport:
    """The report of a finished dry run: every rank's line from its representative's trace and meter.

    `contexts`: representative rank -> its finished context (one, rank 0's, unless the program said its
    ranks differ: `differ`); `stands_for`: each rank's representative (None: rank 0 for all). Exchanges
    (the only steps whose bytes differ by rank within a representative's ranks) count each rank's own
    bytes, as the step records give them.
    """
    if not isinstance(contexts, dict):
        contexts = {contexts.rank: contexts}
    lines: dict = {}
    notes: list[str] = []
    for rep, context in contexts.items():
        notes += context.meter.notes
        trace = context.traces[0]
        totals = trace.totals()
        counts = tuple(sorted(trace.counts().items()))
        sent = np.full(size, totals["bytes_sent"], np.int64)
        received = np.full(size, totals["bytes_received"], np.int64)
        for by_rank_sent, by_rank_received in context.meter.varied:
            by_rank_sent = np.asarray(by_rank_sent, np.int64)
            by_rank_received = np.asarray(by_rank_received, np.int64)
            sent += by_rank_sent - by_rank_sent[rep]
            received += by_rank_received - by_rank_received[rep]
        lines[rep] = (totals["calls"], sent, received, context.meter.peak, counts)
    owner = np.zeros(size, np.int64) if stands_for is None else stands_for
    rows = []
    for r in range(size):
        calls, sent, received, peak, counts = lines[int(owner[r])]
        rows.append(RankBytes(r, calls, int(sent[r]), int(received[r]), peak, counts))
    return DryRunReport(tuple(rows), tuple(notes))
