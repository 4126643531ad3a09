"""Simulated ranks in one process: the launcher, the thread engine and the dry run (docs/howto/simulate.md).

    import spmdsim
    results = spmdsim.simulate(8, main)      # main() runs once per rank, each in its own thread
    comm = spmdsim.world()                   # inside main: this rank's communicator

Names load on first use so that importing this package stays light.
"""
from __future__ import annotations

from ..._lazy import lazy

# Where each public name lives (a module of this package, or an absolute one): the user's mpi4py-like
# world and SimComm are the emulator's (spmdsim.emulator).
_WHERE = {name: module for module, names in {
    "run": ("simulate", "current_rank", "MAX_RANKS"),
    "spmdsim.emulator.comm": ("world", "SimComm"),
    "launch": ("script", "run_on_ranks"),
    "spmdsim.base.once": ("once",),
    "dry": ("dry_run_active",),
    "p2p": ("Request",),
    "_mpi": ("IN_PLACE", "BufferSpecError", "DatatypeMapError"),
    "engine": ("DeadlockError", "SimulationError"),
    "spmdsim.runtime.engines.memory": ("MemoryLimitError",),
}.items() for name in names}

__all__ = ["simulate", "world", "current_rank", "MAX_RANKS", "script", "run_on_ranks", "once", "dry_run_active",
           "SimComm", "Request", "IN_PLACE", "DeadlockError", "SimulationError", "MemoryLimitError", "BufferSpecError",
           "DatatypeMapError"]


__getattr__, __dir__ = lazy(__name__, _WHERE, globals())
