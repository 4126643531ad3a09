"""spmdsim: run and check tensor-parallel programs on plain CPUs with MPI.

The names exported here are pure (numpy only). MPI-facing names (`Mesh`,
`DTensor`, ops) live in `spmdsim.runtime` and `spmdsim.ops` and import mpi4py
when first used. `simulate(n, fn)` runs `fn` on n simulated ranks in this
process and `world()` is the running rank's communicator (spmdsim.sim).
"""
from __future__ import annotations

from .datagen import SeededTensor
from .errors import (
    CheckFailed,
    DialectError,
    DTypeError,
    LayoutError,
    OperatorError,
    PlanError,
    RankError,
    RuntimeMismatchError,
    ShapeError,
    SpmdsimError,
)
from .layout import Layout, TensorLayout


__version__ = "0.1.0"

__all__ = [
    "simulate",
    "world",
    "Layout",
    "TensorLayout",
    "SeededTensor",
    "SpmdsimError",
    "LayoutError",
    "ShapeError",
    "DialectError",
    "OperatorError",
    "PlanError",
    "RuntimeMismatchError",
    "CheckFailed",
]


def __getattr__(name: str) -> object:
    # Loaded on first use, so `import spmdsim` stays free of mpi4py: simulate/world
    # (the emulator, spmdsim.sim) and `spmdsim.autoshard(...)` (a callable module).
    import importlib

    if name in ("simulate", "world"):
        return getattr(importlib.import_module(".sim", __name__), name)
    if name == "autoshard":
        return importlib.import_module(".autoshard", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
