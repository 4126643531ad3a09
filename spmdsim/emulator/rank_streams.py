"""Each simulated rank's own ``sys.stdout`` and ``sys.stderr``, as each MPI process has its own.

While `streams_of_ranks()` is active (spmdsim.emulator.mpi4py_world.swapped), the ``sys`` module has a
subclass of its type whose ``stdout`` and ``stderr`` are properties: a simulated rank (or a thread it
started) that sets one (``sys.stderr = io.StringIO()``, as a test that captures a traceback does) sets
its own, which it then reads back, and setting the process's stream back ends it. What the rank writes
through the process's stream (``print``, a traceback Python or mpi4py prints from C, which read
``sys``'s own dictionary) goes to the rank's own stream too (spmdsim.runtime.sim.run's whole-line streams ask
the rank's context, `RankContext.streams`). Every other thread sees ``sys`` as it is.
"""
from __future__ import annotations

import contextlib
import sys
import types
from typing import Any, Iterator

from ..base import context as _local
from ._nesting import Nesting

__all__ = ["streams_of_ranks"]

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


class _SysOfRanks(types.ModuleType):
    """sys's module type while swapped (see the module docstring)."""

    stdout = _stream("stdout")
    stderr = _stream("stderr")


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
