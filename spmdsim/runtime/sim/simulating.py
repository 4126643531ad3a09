"""What the process does while any simulation runs (spmdsim.runtime.sim.run): BLAS on one thread, and
whole lines on the standard streams, so that ranks printing at once do not mix their words.

A rank's partial line (``print(..., end="")``) waits for the rest of its line. One it leaves unended is
written when the rank ends (`end_lines`), or closes its stdout, as a line of its own: what another rank
writes next starts on a new line, and so does the caller's output once the simulation ends."""
from __future__ import annotations

import contextlib
import io
import sys
import threading
import time
from typing import Any, Iterable, Iterator

from ...base import context as _local
from ...base import threads as _threads
from ...base.output import note_output_failure
from . import rank_sleep
from .engine import run_slots


class _simulating:
    """While any simulation runs: BLAS on one thread, whole lines on the streams, ``time.sleep`` that gives a
    rank's run slot away while it sleeps (spmdsim.runtime.sim.rank_sleep) (and its ranks' arrays are
    never on huge pages: spmdsim.base.buffers uses its pool only outside simulated ranks).

    Counted, so that two simulations side by side share the switch and the last one to end
    restores what was there.
    """

    _lock = threading.Lock()
    _count = 0
    _saved: Any = None
    lines: tuple = ()  # the _Lines in place of sys.stdout and sys.stderr while any simulation runs

    def __init__(self, slots: int) -> None:
        self._slots = slots

    def __enter__(self) -> None:
        cls = _simulating
        with cls._lock:
            cls._count += 1
            if cls._count > 1:
                return
            # Ranks computing at once each call BLAS: one thread each, as an MPI rank on its share of
            # the cores (a multithreaded OpenBLAS runs one caller's call at a time; the MindSpore
            # tutorial network's training at 8 ranks on 2 cores took 1.2-1.4x as long with two).
            # A thread count the user set is kept.
            blas = contextlib.ExitStack()
            if self._slots > 1 and not _threads.threads_set_by_user():
                blas.enter_context(_threads.blas_threads(1))
            cls._saved = (blas, sys.stdout, sys.stderr, time.sleep)
            sys.stdout, sys.stderr = cls.lines = _Lines(sys.stdout, "stdout"), _Lines(sys.stderr, "stderr")
            time.sleep = rank_sleep.sleep  # a rank that sleeps lets another compute

    def __exit__(self, *exc: object) -> None:
        cls = _simulating
        with cls._lock:
            cls._count -= 1
            if cls._count:
                return
            blas, out, err, sleep = cls._saved
            cls._saved = None
            time.sleep = sleep
            for stream in cls.lines:
                stream.flush_all()
            cls.lines = ()
            sys.stdout, sys.stderr = out, err
            blas.close()


@contextlib.contextmanager
def whole_lines(size: int) -> Iterator[None]:
    """Within this block, what a simulation of `size` ranks sets up: whole lines on the standard streams (a
    simulation inside it keeps them): for a caller that reports a failed run while the ranks it left computing
    (spmdsim.runtime.sim.engine.World.given_up) print on, a line at a time, their partial lines kept."""
    with _simulating(run_slots(size)):
        yield


def end_lines() -> None:
    """A simulated rank ends (on its own thread): its partial lines, each written as a line of its own."""
    for stream in _simulating.lines:
        stream.end_line()


class _Lines:
    """A stream that writes whole lines only, so that ranks printing at once do not mix their words; what
    a rank writes after it set a stream of its own as `name` (``sys.stderr = io.StringIO()`` under
    spmdsim.emulator's swap, spmdsim.emulator.rank_streams) goes there, as in its own process."""

    def __init__(self, stream: Any, name: str = "") -> None:
        self._stream = stream
        self._name = name
        self._lock = threading.Lock()
        self._pending: dict[int, str] = {}  # thread id -> text after its last newline
        # whether the stream ends with a partial line a rank left unended (it ended, or closed its stdout):
        # what comes next starts on a new line (not by thread: a rank's thread id is the next rank's again)
        self._open = False

    def write(self, text: str) -> int:
        state = _local.simulated()
        if state is not None and state.streams:
            own = state.streams.get(self._name)
            if own is not None:
                return own.write(text)
        me = threading.get_ident()
        with self._lock:
            pending = self._pending.pop(me, "") + text
            cut = pending.rfind("\n") + 1
            if pending[cut:]:
                self._pending[me] = pending[cut:]
            if cut:
                self._write(pending[:cut])
        return len(text)

    def _write(self, text: str) -> None:
        """Write `text`, on a new line where the stream ends with a partial line a rank left unended."""
        if self._open:
            text = "\n" + text
        try:
            self._stream.write(text)
        except OSError as exc:  # a full disk under `> file`: the run's error, not the rank's (one line)
            note_output_failure(exc)
            raise
        self._open = not text.endswith("\n")

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            note_output_failure(exc)
            raise

    def end_line(self) -> None:
        """The running thread ends: its partial line, written as a line of its own (`_write`)."""
        with self._lock:
            text = self._pending.pop(threading.get_ident(), "")
            if text:
                self._write(text)

    def flush_all(self) -> None:
        """The simulations end: every partial line left, each a line of its own, and the last one ended, so
        that the caller's output starts on a line of its own."""
        with self._lock:
            for text in self._pending.values():
                self._write(text)
            self._pending.clear()
            if self._open:
                self._open = False
                self._write("\n")
            self._flush()

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def close(self) -> None:
        """On a simulated rank, close the rank's own stream: its later writes raise ValueError, as its own
        process's closed stdout would, and the process's stays open for the other ranks (it closed the
        process's: every rank's prints, and the run's, failed); elsewhere, close the stream. The rank's
        partial line is written first, as a closing file flushes."""
        state = _local.simulated()
        if state is None:
            self._stream.close()
            return
        with self._lock:
            text = self._pending.pop(threading.get_ident(), "")
            if text:
                self._write(text)
            self._flush()
        closed = io.TextIOWrapper(io.BytesIO(), encoding=getattr(self._stream, "encoding", None) or "utf-8")
        closed.close()
        state.streams = {**(state.streams or {}), self._name: closed}

    def __enter__(self) -> "_Lines":
        return self

    def __exit__(self, *exc: object) -> None:
        """``with sys.stdout:`` closes it at the end, as a file does (`close`)."""
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
