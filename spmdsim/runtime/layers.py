"""The layers around an engine's transfer: the divergence check, an emulated algorithm, the watchdog.

A collective on a mesh with no debug hook on and no ``algorithms=`` is the
engine's transfer alone (from runtime.door.issue), then one trace row. Otherwise `run` passes it through these layers,
outermost first:

- `Checked`: with SPMDSIM_CHECK, the call's fingerprint (and an Alltoallv's
  counts) compared over the group before anything moves (`debug_calls.begin`; the
  dtype every member can move, and sum, runtime.door.issue checked before any
  layer, on every engine); numbers the call;
- `Emulated` (a mesh made with ``algorithms=`` naming this collective): the
  algorithm's schedule of point-to-point messages in place of MPI's call
  (runtime/algorithms.py); its trace name says which, e.g. "allreduce[ring]";
- `Watched` (SPMDSIM_WATCHDOG): the engine's transfer with the watchdog's wait,
  so a rank left waiting reports who is missing and ends the job (`debug_calls.wait`);
- else the engine's transfer with the mesh's wait (busy or polite).

Each layer has ``run(call) -> (trace name, bytes or None)``; None keeps the
bytes the collective worked out.
"""
from __future__ import annotations

from time import perf_counter
from typing import Any

import numpy as np

from .engines.wait import polite_wait
from . import debug, debug_calls
from .axes import normalize_axes
from .algorithms import emulate

__all__ = ["Collective", "run"]


class Collective:
    """One collective as its function laid it out: what the layers read."""

    __slots__ = ("mesh", "comm", "op", "axes", "run", "args", "x", "extra", "counts", "seq", "began")

    def __init__(self, mesh: Any, comm: Any, op: str, axes: Any, run: Any, args: tuple, x: Any, extra: tuple,
                 counts: tuple | None) -> None:
        self.mesh, self.comm, self.op, self.axes = mesh, comm, op, normalize_axes(axes)
        self.run, self.args = run, args  # the engine's transfer, run(comm, *args, wait), and its arguments
        self.x, self.extra, self.counts = x, extra, counts  # x: the array, or a dtype where shapes differ
        self.seq, self.began = 0, 0.0  # set by Checked: the call's number, when the check ended


class EngineCall:
    """The innermost layer: the mesh's engine runs the transfer, waited for as the mesh waits."""

    def run(self, c: Collective) -> tuple[str, Any]:
        c.run(c.comm, *c.args, polite_wait if c.mesh.polite else None)
        return c.op, None


class Watched:
    """SPMDSIM_WATCHDOG: the transfer's wait watched (a rank left waiting reports and ends the job)."""

    def run(self, c: Collective) -> tuple[str, Any]:
        c.run(c.comm, *c.args, debug_calls.waiter(c.op, c.axes, c.seq, c.mesh.polite, c.comm))
        return c.op, None


class Emulated:
    """The mesh's algorithm for this collective run as point-to-point messages in place of MPI's call."""

    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm

    def run(self, c: Collective) -> tuple[str, Any]:
        name, sent, received = emulate(c.mesh, c.op, self.algorithm, c.comm, *c.args,
                                       label="axes " + ",".join(c.axes))
        return name, (sent, received)


class Checked:
    """Before the call: SPMDSIM_CHECK's comparison; numbers the call."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def run(self, c: Collective) -> tuple[str, Any]:
        array = type(c.x) is np.ndarray
        dtype = c.x.dtype if array else np.dtype(c.x)  # checked by runtime.door.issue, before any layer
        c.seq = debug_calls.begin(c.comm, c.op, c.axes, dtype, c.x.shape if array else None, c.extra, c.mesh.polite,
                                  c.counts)
        c.began = perf_counter()
        return self.inner.run(c)


def layers(mesh: Any, op: str, emulate: bool) -> Checked:
    """The layers for one collective of `op` on `mesh` now (the settings can change between calls)."""
    algorithm = emulate and mesh.algorithms and mesh.algorithms.get(op)
    if algorithm:
        return Checked(Emulated(algorithm))
    return Checked(Watched() if debug.watchdog_seconds() is not None else EngineCall())


def run(call: Collective, emulate: bool, t0: float | None) -> tuple[str, Any, float]:
    """Run `call` through its layers: (trace name, bytes or None, when its traced time began).

    The check's own exchange is not the collective's time: a `t0` taken before it moves on by as long.
    """
    start = perf_counter()
    name, nbytes = layers(call.mesh, call.op, emulate).run(call)
    return name, nbytes, call.began if t0 is None else t0 + (call.began - start)
