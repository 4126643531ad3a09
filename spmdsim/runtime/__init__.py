"""The MPI side of spmdsim: meshes, collectives, distributed tensors, checks, guards.

Names are loaded on first use so that ``import spmdsim.runtime`` alone does not
initialize MPI; ``spmdsim.runtime.trace`` and ``spmdsim.runtime.wait`` never
import mpi4py at module level.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "Mesh",
    "DTensor",
    "Verdict",
    "TraceEntry",
    "Trace",
    "collect_trace",
    "abort_on_error",
    "install_excepthook",
    "run_guarded",
    "allgather",
    "alltoall",
    "allreduce",
    "reduce_scatter",
    "bcast",
    "alltoallv",
    "exchange",
    "ExchangeSpec",
    "Prepared",
    "prepare_allreduce",
    "prepare_allgather",
    "prepare_reduce_scatter",
    "prepare_alltoall",
    "print_ranked",
    "rank_ordered",
    "write_chrome_trace",
    "redistribute",
]

_WHERE = {
    "Mesh": "mesh",
    "DTensor": "dtensor",
    "Verdict": "check",
    "TraceEntry": "trace",
    "Trace": "trace",
    "collect_trace": "trace",
    "abort_on_error": "guard",
    "install_excepthook": "guard",
    "run_guarded": "guard",
    "allgather": "collectives",
    "alltoall": "collectives",
    "allreduce": "collectives",
    "reduce_scatter": "collectives",
    "bcast": "collectives",
    "alltoallv": "collectives",
    "exchange": "collectives",
    "ExchangeSpec": "exchange_spec",
    "Prepared": "prepared",
    "prepare_allreduce": "prepared",
    "prepare_allgather": "prepared",
    "prepare_reduce_scatter": "prepared",
    "prepare_alltoall": "prepared",
    "print_ranked": "ranked",
    "rank_ordered": "ranked",
    "write_chrome_trace": "trace_export",
    "redistribute": "executor",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    path = module if module.startswith("spmdsim.") else f"{__name__}.{module}"
    value = getattr(importlib.import_module(path), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
