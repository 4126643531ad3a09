"""Each simulated rank's own ``sys.stdout`` and ``sys.stderr``, as each MPI process has its own.

While `streams_of_ranks()` is active (spmdsim.emulator.mpi4py_world.swapped), the ``sys`` module has a
subclass of its type whose ``stdout`` and ``stderr`` are properties: a simulated rank (or a thread it
started) that sets one (``sys.stderr = io.StringIO()``, as a test that captures a traceback does) sets
its own, which it then reads back, and setting the process's stream back ends it. What the rank writes
through the process's stream (``print``, a traceback Python or mpi4py prints from C, which read
``sys``'s own dictionary) goes to the rank's own stream too (spmdsim.runtime.sim.run's whole-line streams ask
the rank's context, `RankContext.streams`). A rank that a Spawn started (spmdsim.emulator.spawn) reads its
own ``sys.argv`` too, the command line its parent gave it (`RankContext.argv`), as a spawned MPI process has its
own. Every other thread sees ``sys`` as it is.
"""
from __future__ import annotations

import contextlib
import io
import sys
import types
from typing import Any, Iterator

from ..base import context as _local
from ._nesting import Nesting
from ..runtime.sim.run import current_rank

__all__ = ["streams_of_ranks", "StdinOfRankZero"]

_NESTING = Nesting()
_OWN: list = []  # sys's own type, while swapped


def _stream(name: str) -> property:
    def get(module: Any) -> Any:
        state = _local.simulated()
        if state is not None and state.streams:
            own = state.streams.get(name)
            if own is not None:
                return own
        return module.__dict__[name]

    def put(module: Any, stream: Any) -> None:
        state = _local.simulated()
        if state is None:
            module.__dict__[name] = stream
            return
        streams = state.streams if state.streams is not None else {}
        if stream is module.__dict__[name]:  # the process's again: the rank's own ends
            streams.pop(name, None)
        else:
            streams[name] = stream
        state.streams = streams or None

    return property(get, put)


def _argv() -> property:
    """sys.argv: a spawned rank's own list (read, and set, as its own), else the process's."""
    def get(module: Any) -> Any:
        state = _local.simulated()
        own = None if state is None else state.argv
        return module.__dict__["argv"] if own is None else own

    def put(module: Any, argv: Any) -> None:
        state = _local.simulated()
        if state is None or state.argv is None:
            module.__dict__["argv"] = argv
        else:
            state.argv = argv

    return property(get, put)


class _SysOfRanks(types.ModuleType):
    """sys's module type while swapped (see the module docstring)."""

    stdout = _stream("stdout")
    stderr = _stream("stderr")
    argv = _argv()


@contextlib.contextmanager
def streams_of_ranks() -> Iterator[None]:
    """Within this block, a simulated rank's sys.stdout and sys.stderr are its own (nests)."""
    def install() -> None:
        _OWN[:] = [type(sys)]
        sys.__class__ = _SysOfRanks

    def restore() -> None:
        sys.__class__ = _OWN.pop()

    with _NESTING(install, restore):
        yield


class StdinOfRankZero:
    """sys.stdin while the ranks of `spmdsim mpirun` run: rank 0's, as mpiexec forwards stdin to rank 0 only. Another
    rank that reads it gets EOFError saying so (MPICH leaves it waiting forever; Open MPI gives
    it end of file); threads that are no rank read it as usual. A rank that closes it (``with sys.stdin:``, as
    ``python -m json.tool`` does) closes its own: its later reads raise ValueError, as a closed file's do, and
    the process's stays open (for the run's other ranks, and after it)."""

    _READS = ("read", "readline", "readlines", "buffer", "fileno", "__next__")

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._closed: set = set()  # the ranks that closed their stdin

    def _refuse(self) -> bool:
        if current_rank() in self._closed:
            raise ValueError("I/O operation on closed file.")
        return current_rank() not in (0, None)

    def _eof(self) -> EOFError:
        return EOFError(f"simulated rank {current_rank()} reads stdin, which goes to rank 0 only (as mpiexec "
                        f"forwards it): read it on rank 0 and send it on (comm.bcast)")

    def __getattr__(self, name: str) -> Any:
        if name in self._READS and self._refuse():
            if name == "fileno":  # input() then reads through readline, which says why
                raise io.UnsupportedOperation("stdin goes to rank 0 only")
            raise self._eof()
        return getattr(self._stream, name)

    @property
    def closed(self) -> bool:
        return current_rank() in self._closed or self._stream.closed

    def close(self) -> None:
        rank = current_rank()
        if rank is None:
            self._stream.close()
        else:
            self._closed.add(rank)

    def __enter__(self) -> "StdinOfRankZero":
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> "StdinOfRankZero":
        if self._refuse():
            raise self._eof()
        return self

    def __next__(self) -> str:
        if self._refuse():
            raise self._eof()
        return next(self._stream)
