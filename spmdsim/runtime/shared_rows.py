"""Every rank's row on every rank: under MPI each rank's own table, on simulated ranks one table they share.

A check needs every rank's figures on every rank: the result check's 72-byte record per rank
(spmdsim.runtime.check.agree), a training check's parameter blocks (`all_rows`: spmdsim.models.gpt.train,
spmdsim.models.gpt.pipeline, spmdsim.models.nets.train). Under MPI a rank is a process: one Allgather, and each rank
holds its own table. Simulated ranks are threads of one process, where an Allgather gives each of the p ranks its
own table of p rows: p^2 rows in one process (1.2 GB of check records at 4,096 ranks, 2.98 GB of a GPT's
parameter blocks at 256; docs/howto/simulate.md).

`gather_shared(comm, row, label, polite, extra)` makes one table for the members of `comm` instead: the first
member to ask makes it, every member takes the same one, and one Gather to member 0 through the door
(runtime.door.transfer: numbered as `label` with SPMDSIM_CHECK, this rank's `row` its fingerprint, watched
with SPMDSIM_WATCHDOG, waited politely where `polite`) fills it. The thread engine writes the root's table
before it releases any member (spmdsim.runtime.sim.engine, Group.enter_all), so every member reads it full once its
Gather returns. Every member takes the table before it enters the Gather, and none leaves the Gather before
every member has entered it: the table goes from the registry when the last member takes it, and the next
call finds none and makes its own (a table is never filled twice, so a caller may keep one). What the
members compute from the table alike, `Shared.derived(fn, *args)` computes once for all of them (the first
member to ask; the others wait for it and get the same object): the check's Verdict, O(p) once, not on
each of p ranks. Where none is shared (under MPI, in a dry run, on one member, on a communicator of no
thread-engine group) it returns None and the caller makes its own collective.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import numpy as np

from ..base.context import simulated
from ..errors import ShapeError
from . import door
from .engines import engine_of
from .executor import gather

__all__ = ["Shared", "gather_shared", "all_rows"]

_LOCK = threading.Lock()
#: This module's registry inside a simulation's shared dict (spmdsim.base.context's `shared`, once's table too).
_REGISTRY = "spmdsim.runtime.shared_rows"


class Shared:
    """The table the members of one call share: `rows` (a row per member, in group order; member 0's Gather
    fills it; to read, not to change) and `derived`, what they compute from it once for all."""

    __slots__ = ("rows", "_lock", "_derived")

    def __init__(self, size: int, width: int) -> None:
        self.rows = np.empty((size, width))
        self._lock = threading.Lock()
        self._derived: dict = {}

    def derived(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(self.rows, *args)`` (local work, hashable `args`), computed by the first member to ask and
        returned to every member that asks with equal `args`: the same object, which must not be changed."""
        key = (fn, args)
        with self._lock:  # the others wait while the first computes (local work: it finishes)
            if key not in self._derived:
                self._derived[key] = fn(self.rows, *args)
            return self._derived[key]


def gather_shared(comm: Any, row: np.ndarray, label: str, polite: bool, extra: Any = ()) -> Optional[Shared]:
    """Every member's `row` (float64, 1-d, alike in length) in one table the simulated members of `comm`
    share, by one Gather to member 0 (a collective, labelled `label`, `extra` in its fingerprint); None where
    none is shared (module doc): under MPI, in a dry run, on one member, off the thread engine."""
    group = getattr(comm, "_group", None)  # the thread engine's group: what its members share
    engine = engine_of(comm)
    size = comm.Get_size()
    state = simulated()
    if size == 1 or not engine.simulated or engine.dry or group is None or state is None:
        return None
    shared = _take(state.shared, (id(group), label), size, row.size)
    door.transfer(comm, label, (), row, extra, polite, engine.gather_to, row,
                  shared.rows if comm.Get_rank() == 0 else None, 0)
    return shared


def _take(table: dict, key: tuple, size: int, width: int) -> Shared:
    """The call's Shared for one more member: made by the first to ask, out of the registry once all `size`
    members took it (keyed by the group, alive while its communicator is, and the label)."""
    with _LOCK:
        registry = table.setdefault(_REGISTRY, {})
        entry = registry.get(key)
        if entry is None:
            entry = registry[key] = [Shared(size, width), 0]
        shared = entry[0]
        entry[1] += 1
        if entry[1] == size:
            del registry[key]
    if shared.rows.shape[1] != width:
        raise ShapeError(f"{key[1]}: this rank's row has {width} items where another's has {shared.rows.shape[1]}; "
                         "every rank's row must be as long")
    return shared


def all_rows(mesh: Any, flat: np.ndarray, label: str) -> np.ndarray:
    """Every rank's `flat` (float64, alike in length), a row per rank, on every rank of `mesh` (a collective,
    labelled `label`). Under MPI one Allgather (spmdsim.runtime.executor.gather): each rank holds its own
    table. Simulated ranks share one table, the same array on every rank, to read and not to change
    (`gather_shared`: one Gather to rank 0, untraced, as the checks' collectives lie outside a step's trace).
    An Allgather would give each of the p ranks its own table of p rows: p^2 rows in one process (3 GB for
    `examples/train_gpt.py` at 256 ranks: docs/howto/simulate.md)."""
    shared = gather_shared(mesh.comm, flat, label, mesh.polite, (0,))
    if shared is not None:
        return shared.rows
    return gather(mesh, flat, tuple(mesh.layout.alias_name), label)
