"""Simulated ranks in one process: the collective emulator (docs/simulate.md).

    import spmdsim
    results = spmdsim.simulate(8, main)      # main() runs once per rank, each in its own thread
    comm = spmdsim.world()                   # inside main: this rank's communicator

Names load on first use so that importing this package stays light.
"""
from __future__ import annotations

import importlib
from typing import Any

# Where each public name lives (module of this package); the order is __all__'s.
_WHERE = {name: module for module, names in {
    "run": ("simulate", "world", "current_rank", "MAX_RANKS"),
    "launch": ("script", "run_on_ranks"),
    "spmdsim.engines.once": ("once",),
    "dry": ("dry_run_active",),
    "comm": ("SimComm",),
    "p2p": ("Request",),
    "_buffers": ("IN_PLACE",),
    "engine": ("DeadlockError", "SimulationError"),
    "spmdsim.engines.memory": ("MemoryLimitError",),
}.items() for name in names}

__all__ = list(_WHERE)


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
