"""Simulated ranks in one process: the launcher, the thread engine and the dry run (docs/simulate.md).

    import spmdsim
    results = spmdsim.simulate(8, main)      # main() runs once per rank, each in its own thread
    comm = spmdsim.world()                   # inside main: this rank's communicator

Names load on first use so that importing this package stays light.
"""
from __future__ import annotations

import importlib
from typing import Any

# Where each public name lives (a module of this package, or an absolute one): the user's mpi4py-like
# world and SimComm are the emulator's (spmdsim.emulator).
_WHERE = {name: module for module, names in {
    "run": ("simulate", "current_rank", "MAX_RANKS"),
    "spmdsim.emulator.comm": ("world", "SimComm"),
    "launch": ("script", "run_on_ranks"),
    "spmdsim.engines.once": ("once",),
    "dry": ("dry_run_active",),
    "p2p": ("Request",),
    "_buffers": ("IN_PLACE",),
    "engine": ("DeadlockError", "SimulationError"),
    "spmdsim.engines.memory": ("MemoryLimitError",),
}.items() for name in names}

__all__ = ["simulate", "world", "current_rank", "MAX_RANKS", "script", "run_on_ranks", "once", "dry_run_active",
           "SimComm", "Request", "IN_PLACE", "DeadlockError", "SimulationError", "MemoryLimitError"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    path = module if module.startswith("spmdsim.") else f"{__name__}.{module}"  # engines': absolute
    value = getattr(importlib.import_module(path), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
