"""A rank's record of its collectives: `Trace` and its `TraceEntry`s (docs/explanation/runtime.md, "Trace").

The rows are appended by spmdsim.runtime.trace (`collect_trace`, `record`) to the
collectors open in the running rank's context; a trace reads them back as entries,
totals and per-op counts. Pure Python: ``reduce`` takes the communicator as an argument.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any, Iterable
from . import engine_of
from ...base.validate import dtype_name

__all__ = ["TraceEntry", "Trace", "count_peers"]


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
    bytes_copied: int = 0  # packed into a send buffer / unpacked from a receive buffer
    # time.perf_counter() when the call returned: the ranks of one machine share
    # this clock (CLOCK_MONOTONIC), so it tells when each rank arrived and left.
    ended_at: float = 0.0
    # alltoallv/exchange: how many other ranks this rank sent to or received from
    # (the cost model prices one message per peer); 0 for the other collectives.
    peers: int = 0
    # numpy's name of the moved elements' type ("float64", "uint8": FP8 values moved as bytes); "" where the
    # row does not say (a group of messages, a call on a group of one)
    dtype: str = ""
    # a group of messages (send, recv, sendrecv): each peer's (rank in the group, bytes sent to it, bytes
    # received from it), by peer, as the estimate prices each within a node or across nodes; () otherwise
    partners: tuple = ()

    @property
    def started_at(self) -> float:
        return self.ended_at - self.seconds

    def __str__(self) -> str:
        where = ",".join(self.axes) or "-"
        tag = f" [{self.label}]" if self.label else ""
        return (f"{self.op}({where}) g={self.group_size} sent={self.bytes_sent}B "
                f"recv={self.bytes_received}B {self.seconds * 1e3:.3f}ms{tag}")


class Trace:
    """The entries collected by one ``collect_trace()`` block (this rank only)."""

    def __init__(self) -> None:
        # Plain tuples (record: TraceEntry's fields; record_call: the call's own arguments), built
        # into entries on first read: a frozen dataclass costs ~1 us per call, which shows at 8 ranks on 2 cores.
        self._rows: list[tuple] = []
        self._built: list[TraceEntry] = []
        # Rows a dry run repeats without running them again (`repeat`): id(rows) -> [rows, times, entries].
        self._repeated: dict[int, list] = {}
        self._folds: dict[tuple, tuple] = {}  # `fold`: a row less its times -> (the first such row,)
        # The rows each `fold` counted once more, in order: a dry run's measured cell (spmdsim.models.gpt.stage_memory)
        # repeats these with its own rows (a ring's messages inside a cell fold into its first one)
        self._folded: list[tuple] = []

    @property
    def _entries(self) -> list[TraceEntry]:
        self._built.extend(_build(self._rows[len(self._built):]))
        return self._built

    def repeat(self, rows: tuple) -> None:
        """`rows` (rows this trace holds already, as a tuple kept by the caller) happened once more: a dry
        run's later pipeline cell that repeats the first one's calls (spmdsim.models.gpt.pipeline). Counted, not
        copied: totals, counts and `weighted` read them times their count; `entries` lists every one."""
        block = self._repeated.get(id(rows))
        if block is None:
            self._repeated[id(rows)] = [rows, 1, None]
        else:
            block[1] += 1

    def fold(self, row: tuple, key: tuple) -> None:
        """Append `row` (a finished row: see `_build`), or count it as one more of the first row `fold` was
        given with the same `key`: `row` less its times (its seconds and end), which a dry run's messages
        differ in alone (~130,000 a 64-stage 1F1B step of 512 microbatches, of a few kinds; their times are
        the dry engine's own)."""
        rows = self._folds.get(key)
        if rows is None:
            self._folds[key] = (row,)
            self._rows.append(row)
        else:
            self._folded.append(rows)
            self.repeat(rows)

    def weighted(self) -> list[tuple[TraceEntry, int]]:
        """(entry, how many times it happened): each recorded call once, each repeated block's calls with
        their count (what `entries` would list, without listing the repeats one by one)."""
        out = [(e, 1) for e in self._entries]
        for block in self._repeated.values():
            if block[2] is None:
                block[2] = _build(block[0])
            out.extend((e, block[1]) for e in block[2])
        return out

    @property
    def entries(self) -> tuple[TraceEntry, ...]:
        if not self._repeated:
            return tuple(self._entries)
        return tuple(e for e, times in self.weighted() for _ in range(times))

    def __repr__(self) -> str:
        return f"<Trace of {len(self)} calls {self.counts(include_local=True)}: .summary() for the table>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """A notebook cell's value: the table (`summary`), not the object's address."""
        printer.text(self.summary())

    def __len__(self) -> int:
        return len(self._rows) + sum(len(rows) * times for rows, times, _ in self._repeated.values())

    def seconds(self, start: int = 0) -> float:
        """Seconds in the collectives recorded from entry number `start` on (cheap, no entries built)."""
        return sum(row[5] for row in self._rows[start:])

    def spans(self, start: int = 0) -> list[tuple[float, float]]:
        """(started_at, ended_at) of the entries from number `start` on (perf_counter seconds)."""
        return [(row[8] - row[5], row[8]) for row in self._rows[start:]]

    def counts(self, include_local: bool = False) -> dict[str, int]:
        """Calls per op. Calls on a group of one rank (no communication) only with include_local."""
        out: dict[str, int] = {}
        for e, times in (self.weighted() if self._repeated else ((e, 1) for e in self._entries)):
            if include_local or e.group_size > 1:
                out[e.op] = out.get(e.op, 0) + times
        return out

    def totals(self) -> dict[str, Any]:
        """This rank's totals: calls, bytes sent/received, seconds (communicating calls)."""
        pairs = self.weighted() if self._repeated else [(e, 1) for e in self._entries]
        live = [(e, times) for e, times in pairs if e.group_size > 1]
        return {
            "calls": sum(times for _, times in live),
            "bytes_sent": sum(e.bytes_sent * times for e, times in live),
            "bytes_received": sum(e.bytes_received * times for e, times in live),
            "seconds": sum(e.seconds * times for e, times in pairs),
        }

    def summary(self) -> str:
        """A short per-op table of this rank's collectives."""
        rows: dict[tuple, list[int | float]] = {}
        for e, times in self.weighted():
            row = rows.setdefault((e.op, e.axes, e.group_size), [0, 0, 0, 0.0])
            row[0] += times
            row[1] += e.bytes_sent * times
            row[2] += e.bytes_received * times
            row[3] += e.seconds * times
        width = max([15] + [len(op) + 1 for op, _, _ in rows])  # "allreduce[recursive-doubling]"
        lines = [f"{'op':<{width}}{'axes':<14}{'g':>3}{'calls':>7}{'sent B':>13}{'recv B':>13}{'ms':>10}"]
        for (op, axes, g), (n, sent, recv, sec) in rows.items():
            lines.append(f"{op:<{width}}{','.join(axes) or '-':<14}{g:>3}{n:>7}{sent:>13}{recv:>13}"
                         f"{sec * 1e3:>10.3f}")
        t = self.totals()
        lines.append(f"{'total':<{width + 17}}{t['calls']:>7}{t['bytes_sent']:>13}{t['bytes_received']:>13}"
                     f"{t['seconds'] * 1e3:>10.3f}")
        return "\n".join(lines)

    def reduce(self, comm: Any) -> dict[str, Any]:
        """Totals over all ranks of `comm` and the maximum per rank, the same dict on every rank (collective).

        Gathered on rank 0, reduced there and broadcast: O(p) for p simulated ranks, not an allgather's O(p^2).
        """
        mine = self.totals()
        mine["counts"] = self.counts()
        everyone = engine_of(comm).gather_object(comm, mine, 0)
        stats = None
        if everyone is not None:
            ops = sorted({op for r in everyone for op in r["counts"]})
            stats = {
                "ranks": len(everyone),
                "counts": {op: max(r["counts"].get(op, 0) for r in everyone) for op in ops},
                "calls_max": max(r["calls"] for r in everyone),
                "bytes_sent_total": sum(r["bytes_sent"] for r in everyone),
                "bytes_received_total": sum(r["bytes_received"] for r in everyone),
                "bytes_sent_max": max(r["bytes_sent"] for r in everyone),
                "bytes_received_max": max(r["bytes_received"] for r in everyone),
                "seconds_max": max(r["seconds"] for r in everyone),
            }
        return engine_of(comm).broadcast_object(comm, stats, 0)

    def to_json(self) -> str:
        """This rank's entries as a JSON list of objects."""
        return json.dumps([asdict(e) for e in self._entries])


def _build(rows: Any) -> list[TraceEntry]:
    """The entries of raw rows (see Trace.__init__)."""
    out = []
    for op, axes, g, sent, received, seconds, label, copied, ended, peers, dtype, partners in rows:
        if received is None:  # a row as runtime.door.issue appends it: finish it here
            op, axes, sent, received, peers = _as_called(op, axes, g, sent, peers)
        out.append(TraceEntry(op, axes, g, int(sent), int(received), float(seconds), label, int(copied), ended,
                              int(peers), "" if dtype is None else dtype_name(dtype), partners))
    return out


_MOVED: list = []  # spmdsim.programs.plan.steps.moved_bytes, imported on first use (not once per row)


def _as_called(op: str, axes: Any, g: int, nbytes: Any, counts: Any) -> tuple:
    """(op, axes, sent, received, peers) of a row `issue` recorded with its call's own arguments.

    `nbytes`: the per-rank n of `moved_bytes`, or (sent, received); `counts`: an Alltoallv's counts, or None.
    """
    if not _MOVED:
        from ...programs.plan.steps import moved_bytes

        _MOVED.append(moved_bytes)
    if type(nbytes) is int:
        sent = received = _MOVED[0](op, g, nbytes)
    else:
        sent, received = nbytes
    axes = (axes,) if isinstance(axes, str) else tuple(axes)
    return op, axes, sent, received, 0 if counts is None else count_peers(*counts)


def count_peers(scounts: Iterable[int], rcounts: Iterable[int]) -> int:
    """How many ranks an Alltoallv with these counts sends to or receives from."""
    return sum(1 for s, r in zip(scounts, rcounts) if s or r)
