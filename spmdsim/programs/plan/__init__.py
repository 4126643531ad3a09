"""Redistribution planning (pure: numpy only, never mpi4py).

`plan_redistribution(source, target, shape, dtype)` returns a `Plan` whose
steps the in-process `emulate` (here) or the MPI executor
(`spmdsim.runtime.executor.redistribute`) carry out.
"""
from __future__ import annotations

from ..._lazy import modules_by_name
from .emulator import emulate, partial_addends, shards_of, sum_partials
from .planner import plan_redistribution
from .record import Plan
from .steps import Allgather, Allreduce, Alltoall, Exchange, LocalSlice, LocalZero, ReduceScatter, Step
from .volume import lower_bound

__all__ = ["plan_redistribution", "Plan", "Step", "LocalSlice", "Allgather", "Alltoall", "Allreduce", "ReduceScatter",
           "LocalZero", "Exchange", "emulate", "shards_of", "partial_addends", "sum_partials", "lower_bound"]

# Its modules by name, loaded on first use: spmdsim.programs.plan.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
