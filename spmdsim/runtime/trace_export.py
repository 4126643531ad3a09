"""Traces as Chrome trace-event JSON: open the file in https://ui.perfetto.dev or chrome://tracing.

One process (``pid``) per rank, named ``rank N``; on its track, each collective
(or group of point-to-point messages) is a complete event (``"ph": "X"``) named
after the op, its mesh axes and the bytes it moved (a receive's received, a
sendrecv's both ways), with its bytes each way in ``args`` (``peers``: how many
ranks a message group or an alltoallv talked to; the trace keeps their number,
not which ranks), and the time between collectives is a ``local compute``
event. Timestamps are microseconds from the earliest event of any rank: the
ranks of one machine share ``time.perf_counter()`` (CLOCK_MONOTONIC), so the
tracks line up and a rank waiting in a collective for a slower one shows as a
longer bar.

    with collect_trace() as trace:
        start = time.perf_counter()
        y = matmul(x, w)
    write_chrome_trace(comm, trace, "matmul.trace.json", start=start)

Pure Python; `write_chrome_trace` is a collective over `comm` (lower-case
``gather``), and only its root writes the file.
"""
from __future__ import annotations

import json
import os
from typing import Any, Iterable, Sequence

from ..errors import SpmdsimError
from . import door

__all__ = ["chrome_events", "chrome_trace", "write_chrome_trace", "Span"]

#: (name, start, end) in perf_counter seconds: a named stretch of a rank's time (a scenario).
Span = tuple[str, float, float]

_COMPUTE = "local compute"
# Gaps shorter than this are bookkeeping between two calls, not compute worth a bar.
_MIN_GAP = 1e-6


def _entries(trace: Any) -> Sequence[Any]:
    return getattr(trace, "entries", trace)


def chrome_events(trace: Any, rank: int, start: float | None = None, end: float | None = None,
                  spans: Iterable[Span] = (), span_track: str = "scenarios") -> list[dict]:
    """This rank's events, timestamps in perf_counter seconds (`chrome_trace` shifts them).

    Args:
        trace: a Trace or its entries.
        rank: the pid of the events.
        start, end: when the traced work began and ended; the time before the
            first and after the last collective becomes local compute too.
        spans: named stretches (scenarios) drawn on a second track of the rank, named `span_track`.
    """
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
        {"ph": "M", "name": "thread_name", "pid": rank, "tid": 0,
         "args": {"name": "compute and collectives"}},
    ]
    cursor = start
    for e in _entries(trace):
        if cursor is not None and e.started_at - cursor > _MIN_GAP:
            events.append(_complete(_COMPUTE, "compute", rank, cursor, e.started_at, {}))
        where = ",".join(e.axes) or "-"
        args = {"bytes_sent": e.bytes_sent, "bytes_received": e.bytes_received,
                "group_size": e.group_size, "axes": list(e.axes)}
        if e.label:
            args["label"] = e.label
        if e.bytes_copied:
            args["bytes_copied"] = e.bytes_copied
        if e.peers:
            args["peers"] = e.peers
        cat = "collective" if e.group_size > 1 else "collective (group of one: no communication)"
        events.append(_complete(f"{e.op}({where}) {_moved(e)}", cat, rank, e.started_at, e.ended_at, args))
        cursor = e.ended_at
    if cursor is not None and end is not None and end - cursor > _MIN_GAP:
        events.append(_complete(_COMPUTE, "compute", rank, cursor, end, {}))
    spans = list(spans)
    if spans:
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": 1,
                       "args": {"name": span_track}})
    for name, begin, finish in spans:
        events.append(dict(_complete(name, "scenario" if span_track == "scenarios" else span_track, rank,
                                     begin, finish, {}), tid=1))
    return events


def _moved(e: Any) -> str:
    """The bytes a row's name shows: what the call moved. A receive sent nothing (its bytes are the ones
    received), a sendrecv moved both ways; a collective's are the bytes it sent, as before."""
    if e.op == "recv":
        return f"{e.bytes_received:,} B"
    if e.op == "sendrecv":
        return f"{e.bytes_sent:,} B sent, {e.bytes_received:,} B received"
    return f"{e.bytes_sent:,} B"


def _complete(name: str, cat: str, pid: int, begin: float, finish: float, args: dict) -> dict:
    return {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": 0,
            "ts": begin, "dur": max(finish - begin, 0.0), "args": args}


def chrome_trace(per_rank: Sequence[Sequence[dict]]) -> dict:
    """The JSON object of a trace file from every rank's `chrome_events` (times in microseconds)."""
    timed = [e for events in per_rank for e in events if "ts" in e]
    origin = min((e["ts"] for e in timed), default=0.0)
    out = []
    for events in per_rank:
        for e in events:
            if "ts" in e:
                e = dict(e, ts=round((e["ts"] - origin) * 1e6, 3), dur=round(e["dur"] * 1e6, 3))
            out.append(e)
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"producer": "spmdsim", "ranks": len(per_rank)}}


def _rank(comm: Any) -> int:
    get = getattr(comm, "Get_rank", None)
    return int(get() if get else comm.rank)


def write_chrome_trace(comm: Any, trace: Any, path: str | os.PathLike, start: float | None = None,
                       end: float | None = None, spans: Iterable[Span] = (), root: int = 0,
                       span_track: str = "scenarios") -> None:
    """Gather every rank's events to `root` and write one trace file there (a collective)."""
    rank = _rank(comm)
    per_rank = door.gather_object(comm, chrome_events(trace, rank, start, end, spans, span_track), root)
    if rank == root:
        try:
            with open(path, "w", encoding="utf-8") as f:
                json.dump(chrome_trace(per_rank), f, indent=0)
                f.write("\n")
        except OSError as exc:  # a full disk (/dev/full), an I/O error: one line naming the file
            raise SpmdsimError(f"cannot write the trace {os.fspath(path)!r}: "
                               f"{exc.strerror or exc}") from None
