"""Simulated ranks in one process: the collective emulator (docs/simulate.md).

    import spmdsim
    results = spmdsim.simulate(8, main)      # main() runs once per rank, each in its own thread
    comm = spmdsim.world()                   # inside main: this rank's communicator

Names load on first use so that importing this package stays light.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["simulate", "world", "current_rank", "script", "run_on_ranks", "once", "dry_run_active", "SimComm",
           "Request", "IN_PLACE", "DeadlockError", "SimulationError", "MemoryLimitError", "MAX_RANKS"]

_WHERE = {
    "simulate": "run",
    "world": "run",
    "current_rank": "run",
    "script": "launch",
    "run_on_ranks": "launch",
    "once": "shared",
    "dry_run_active": "dry",
    "MAX_RANKS": "run",
    "SimComm": "comm",
    "Request": "p2p",
    "IN_PLACE": "_buffers",
    "DeadlockError": "engine",
    "SimulationError": "engine",
    "MemoryLimitError": "memory",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
