"""A record of every collective: op, group, bytes on the wire, time (docs/explanation/runtime.md, "Trace").

Pure Python (no mpi4py): ``reduce`` takes the communicator as an argument.
Collectors nest: an entry goes to every collector open at the time. Under
spmdsim.simulate each simulated rank collects only its own calls.
"""
from __future__ import annotations

from time import perf_counter
from typing import Any

from ..base.context import current as _context
from ..errors import SpmdsimError
from .engines.trace import Trace, TraceEntry

__all__ = ["TraceEntry", "Trace", "collect_trace", "record", "record_to", "fold_to", "open_traces"]


def open_traces() -> list:
    """The running rank's open collectors, innermost last (spmdsim.base.context: an MPI
    process's own, or its simulated rank's); `record` skips all work when there are none."""
    return _context().traces


class _Collector:
    """The context manager collect_trace() returns (a class: cheaper than a generator)."""

    __slots__ = ("trace", "traces")

    def __enter__(self) -> Trace:
        self.trace = Trace()
        self.traces = _context().traces
        self.traces.append(self.trace)
        return self.trace

    def __exit__(self, *exc: object) -> None:
        self.traces.remove(self.trace)

    def __getattr__(self, name: str) -> Any:
        """A Trace's name read off the collector itself (``t = collect_trace(); ...; t.counts()``), which records
        nothing outside a ``with``: one line saying so, not "'_Collector' object has no attribute 'counts'"."""
        if name.startswith("__") or name in _Collector.__slots__ or not hasattr(Trace, name):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        raise SpmdsimError(f"collect_trace().{name}: collect_trace() is a context manager, which records only inside "
                           f"a with block: with collect_trace() as trace: ..., then trace.{name}")


def collect_trace() -> _Collector:
    """Collect every collective this rank performs inside the ``with`` block."""
    return _Collector()


def record(op: str, axes: tuple[str, ...], group_size: int, sent: int, received: int, seconds: float,
           label: str | None, copied: int = 0, peers: int = 0) -> None:
    """Append one entry to every open collector (`copied`: bytes packed/unpacked locally;
    `peers`: other ranks an alltoallv/exchange talked to)."""
    traces = _context().traces
    if traces:  # called right after the collective returns: now is when it ended
        record_to(traces, op, axes, group_size, sent, received, seconds, label, copied, perf_counter(), peers)


def record_to(traces: list, op: str, axes: tuple[str, ...], group_size: int, sent: int, received: int,
              seconds: float, label: str | None, copied: int, ended: float, peers: int, partners: tuple = ()) -> None:
    """`record`'s entry, appended to `traces` (the running rank's open collectors, read by the caller) with
    its end time `ended` given (`partners`: a group of messages' TraceEntry.partners)."""
    row = (op, axes, group_size, sent, received, seconds, label, copied, ended, peers, None, partners)
    for trace in traces:
        trace._rows.append(row)


def fold_to(traces: list, op: str, axes: tuple[str, ...], group_size: int, sent: int, received: int,
            seconds: float, label: str | None, copied: int, ended: float, peers: int, partners: tuple = ()) -> None:
    """`record_to`'s entry, folded into an equal one of each trace that differs in its times alone
    (engines.trace.Trace.fold: a dry run's)."""
    row = (op, axes, group_size, sent, received, seconds, label, copied, ended, peers, None, partners)
    key = (op, axes, group_size, sent, received, label, copied, peers, partners)
    for trace in traces:
        trace.fold(row, key)


def record_call(traces: list, op: str, axes: Any, group_size: int, nbytes: Any, seconds: float,
                label: str | None, copied: int, ended: float, counts: Any, dtype: Any = None) -> None:
    """Append one collective to every one of `traces` (the running rank's open collectors, as
    runtime.door.issue read them) as it was called.

    The row keeps the call's own arguments (`nbytes`, `counts`: see `_as_called`; `dtype`: the moved
    elements' numpy dtype) and is finished when the trace is read: each microsecond here is paid by the
    group's last rank at 4 ranks per core.
    """
    if type(axes) is not tuple and type(axes) is not str:  # a list the caller may change later
        axes = tuple(axes)
    row = (op, axes, group_size, nbytes, None, seconds, label, copied, ended, counts, dtype, ())
    for trace in traces:
        trace._rows.append(row)
