"""The memory budget every rank of a communicator agrees on (the MPI side of spmdsim.programs.memory).

Ranks read MemAvailable at slightly different times and see slightly different
figures; a refusal must be the same on every rank, so they take the minimum
(one Allgather per communicator, on first use, cached). The ranks sharing a
node come from ``Split_type(COMM_TYPE_SHARED)``; without it, the whole
communicator counts as one node (conservative). mpi4py is imported lazily.
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..errors import ShapeError
from ..programs.memory import ENV_VAR, Budget, Need, budget_per_rank, check_need, seeded_need
from .engines import engine_of
from . import door
from ..base.tables import found_table, owned_table, put

__all__ = ["agreed_budget", "check_memory", "check_seeded"]

_UNKNOWN = 1 << 62  # a rank that cannot tell leaves the decision to those that can
# id(comm) -> (a weak reference to comm, {setting: budget}): the entry goes with its communicator (a simulation's
# every rank's and mesh group's; holding them kept each finished simulation's whole world alive)
_AGREED: dict[int, tuple[Any, dict]] = {}


def _ranks_on_node(comm: Any) -> int:
    """Ranks of `comm` on this rank's node (collective): its engine's answer (MPI's shared-memory split;
    simulated ranks share one process, so all of them; a dry run's one rank for all)."""
    return engine_of(comm).node_size(comm)


def agreed_budget(comm: Any) -> Optional[Budget]:
    """The bytes each rank of `comm` may use, the same on every rank (collective on first use).

    None when the check is off (SPMDSIM_MEMORY=off) or the machine does not say, and in a dry run, which
    holds no block in memory (its shards are zeros whose pages are never written: spmdsim.runtime.sim.dry), so that
    this machine's memory does not refuse a model sized for a cluster; what a rank of the modelled machine
    holds is the estimate's to judge (`spmdsim estimate --machine`).
    A bad SPMDSIM_MEMORY raises the same SpmdsimError on every rank, before any collective.
    """
    setting = os.environ.get(ENV_VAR, "")  # a changed setting is read again
    agreed = found_table(_AGREED, comm)
    if agreed is not None and setting in agreed:
        return agreed[setting]
    if engine_of(comm).dry:
        if setting.strip():
            budget_per_rank(1)  # a bad SPMDSIM_MEMORY is refused here too
        return None
    mine = budget_per_rank(1)  # validates SPMDSIM_MEMORY first, on every rank alike
    # Whether to agree depends only on the environment mpiexec gives every rank.
    if not os.environ.get(ENV_VAR, "").strip() and comm.Get_size() > 1:
        mine = budget_per_rank(_ranks_on_node(comm))
        # Object form (simulated ranks too); a reduction, so p simulated ranks cost O(p). The least budget
        # with the words of the rank that read it (its MemAvailable, its node's ranks): each rank's own reading
        # differs, and a refusal must be one line on every rank.
        low = door.all_reduce_object(comm, (_UNKNOWN, "") if mine is None else (mine.bytes, mine.source), "min")
        mine = None if low[0] == _UNKNOWN else Budget(low[0], low[1])
    owned_table(_AGREED, comm)[setting] = mine
    return mine


def check_memory(comm: Any, what: str, need_of: Callable[[tuple], Need], shape: Sequence[int],
                 multiples: Sequence[int], shape_flag: str = "shape") -> None:
    """Refuse, on every rank of `comm` alike, a job whose `need_of(shape)` exceeds the agreed budget.

    The message names the largest `shape_flag` that fits (`shape` scaled down, each
    dim a multiple of its entry in `multiples`). Collective on first use per comm.
    """
    budget = agreed_budget(comm)
    if budget is not None:
        shape = tuple(shape)
        check_need(need_of(shape), budget, what, (shape, lambda s: need_of(s).total, multiples), shape_flag)


def check_seeded(comm: Any, layout: Any, seeded: Any) -> None:
    """Refuse a `DTensor.from_seeded` shard that the generator cannot index or the rank cannot hold."""
    key = (layout, seeded.shape, seeded.dtype)
    total = _SEEDED.get(key)
    if total is None:
        span = math.prod(max(1, n) for n in seeded.shape) * np.dtype(seeded.dtype).itemsize
        if span >= 1 << 63:
            # numpy sizes arrays (empty dims counted as 1) and the generator numbers elements
            # in 64-bit integers: past that they would fail or wrap.
            raise ShapeError(f"seeded tensor of shape {seeded.shape!r} is too large to index: numpy and the "
                             "generator address it in 64-bit integers; expected the product of its sizes "
                             "(empty dims counted as 1) times the item size below 2**63")
        total = seeded_need(layout, seeded.shape, seeded.dtype).total
        put(_SEEDED, key, total, 4096)
    budget = agreed_budget(comm)
    if budget is not None and total > budget.bytes:  # the refusal, with its message
        check_memory(comm, f"a {seeded.dtype} tensor of shape {seeded.shape!r} under {layout}",
                     lambda s: seeded_need(layout, s, seeded.dtype), seeded.shape, layout.shards_per_dim)


#: seeded_need's total by (layout, shape, dtype), for shards whose index span passed: each parameter of a model
#: is checked on every rank (and a dry run's every representative) alike, ~25 us a check worked out anew.
_SEEDED: dict = {}
