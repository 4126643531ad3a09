"""A record of every collective: op, group, bytes on the wire, time.

Pure Python (no mpi4py): ``reduce`` takes the communicator as an argument.

    with collect_trace() as tr:
        y = allreduce(mesh, x, ("mp",))
    print(tr.summary())

Collectors nest: an entry goes to every collector open at the time.
Byte figures are per rank and follow the formulas in docs/runtime.md.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any, Iterator

__all__ = ["TraceEntry", "Trace", "collect_trace", "record", "OPEN_TRACES"]


@dataclass(frozen=True)
class TraceEntry:
    """One collective call as this rank saw it."""

    op: str
    axes: tuple[str, ...]
    group_size: int
    bytes_sent: int
    bytes_received: int
    seconds: float
    label: str | None = None

    def __str__(self) -> str:
        where = ",".join(self.axes) or "-"
        tag = f" [{self.label}]" if self.label else ""
        return (
            f"{self.op}({where}) g={self.group_size} sent={self.bytes_sent}B "
            f"recv={self.bytes_received}B {self.seconds * 1e3:.3f}ms{tag}"
        )


class Trace:
    """The entries collected by one ``collect_trace()`` block (this rank only)."""

    def __init__(self) -> None:
        self._entries: list[TraceEntry] = []

    @property
    def entries(self) -> tuple[TraceEntry, ...]:
        return tuple(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def counts(self, include_local: bool = False) -> dict[str, int]:
        """Calls per op. Calls on a group of one rank (no communication) only with include_local."""
        out: dict[str, int] = {}
        for e in self._entries:
            if include_local or e.group_size > 1:
                out[e.op] = out.get(e.op, 0) + 1
        return out

    def totals(self) -> dict[str, Any]:
        """This rank's totals: calls, bytes sent/received, seconds (communicating calls)."""
        live = [e for e in self._entries if e.group_size > 1]
        return {
            "calls": len(live),
            "bytes_sent": sum(e.bytes_sent for e in live),
            "bytes_received": sum(e.bytes_received for e in live),
            "seconds": sum(e.seconds for e in self._entries),
        }

    def summary(self) -> str:
        """A short per-op table of this rank's collectives."""
        rows: dict[tuple, list[int | float]] = {}
        for e in self._entries:
            row = rows.setdefault((e.op, e.axes, e.group_size), [0, 0, 0, 0.0])
            row[0] += 1
            row[1] += e.bytes_sent
            row[2] += e.bytes_received
            row[3] += e.seconds
        lines = [f"{'op':<15}{'axes':<14}{'g':>3}{'calls':>7}{'sent B':>13}{'recv B':>13}{'ms':>10}"]
        for (op, axes, g), (n, sent, recv, sec) in rows.items():
            lines.append(
                f"{op:<15}{','.join(axes) or '-':<14}{g:>3}{n:>7}{sent:>13}{recv:>13}{sec * 1e3:>10.3f}"
            )
        t = self.totals()
        lines.append(
            f"{'total':<32}{t['calls']:>7}{t['bytes_sent']:>13}{t['bytes_received']:>13}"
            f"{t['seconds'] * 1e3:>10.3f}"
        )
        return "\n".join(lines)

    def reduce(self, comm: Any) -> dict[str, Any]:
        """Totals over all ranks of `comm` and the maximum per rank (a collective call)."""
        mine = self.totals()
        mine["counts"] = self.counts()
        everyone = comm.allgather(mine)
        ops = sorted({op for r in everyone for op in r["counts"]})
        return {
            "ranks": len(everyone),
            "counts": {op: max(r["counts"].get(op, 0) for r in everyone) for op in ops},
            "calls_max": max(r["calls"] for r in everyone),
            "bytes_sent_total": sum(r["bytes_sent"] for r in everyone),
            "bytes_received_total": sum(r["bytes_received"] for r in everyone),
            "bytes_sent_max": max(r["bytes_sent"] for r in everyone),
            "bytes_received_max": max(r["bytes_received"] for r in everyone),
            "seconds_max": max(r["seconds"] for r in everyone),
        }

    def to_json(self) -> str:
        """This rank's entries as a JSON list of objects."""
        return json.dumps([asdict(e) for e in self._entries])


# Open collectors, innermost last; `record` skips all work when none is open.
# Mutated in place only, so OPEN_TRACES (for hot paths that test it without a call) stays the same list.
_ACTIVE: list[Trace] = []
OPEN_TRACES = _ACTIVE


@contextmanager
def collect_trace() -> Iterator[Trace]:
    """Collect every collective this process performs inside the block."""
    trace = Trace()
    _ACTIVE.append(trace)
    try:
        yield trace
    finally:
        _ACTIVE.remove(trace)


def record(
    op: str, axes: tuple[str, ...], group_size: int, sent: int, received: int, seconds: float,
    label: str | None,
) -> None:
    """Append one entry to every open collector."""
    if _ACTIVE:
        entry = TraceEntry(op, axes, group_size, int(sent), int(received), seconds, label)
        for trace in _ACTIVE:
            trace._entries.append(entry)
