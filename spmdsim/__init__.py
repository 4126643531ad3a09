"""spmdsim: run and check tensor-parallel programs on plain CPUs with MPI.

The names exported here are pure (numpy only). MPI-facing names (`Mesh`,
`DTensor`, ops) live in `spmdsim.runtime` and `spmdsim.ops` and import mpi4py
when first used. `simulate(n, fn)` runs `fn` on n simulated ranks in this
process and `world()` is the running rank's communicator (spmdsim.sim).
"""
from __future__ import annotations

from ._malloc import keep_freed_buffers_under_launcher
from ._threads import cap_blas_threads_under_launcher

# Before numpy loads its BLAS: one rank per simulated device, not a thread pool each.
cap_blas_threads_under_launcher()
# Result arrays reuse freed heap memory instead of faulting in fresh pages (spmdsim/_malloc.py).
keep_freed_buffers_under_launcher()

from .datagen import SeededTensor
from .errors import (
    CheckFailed,
    DialectError,
    LayoutError,
    OperatorError,
    PlanError,
    RuntimeMismatchError,
    ShapeError,
    SpmdsimError,
)
from .layout import Layout, TensorLayout


def __getattr__(name: str) -> object:
    # simulate/world load the emulator on first use: `import spmdsim` stays free of mpi4py.
    if name in ("simulate", "world"):
        from . import sim

        return getattr(sim, name)
    if name == "autoshard":  # a callable module: spmdsim.autoshard(...), loaded on first use
        import importlib

        return importlib.import_module(".autoshard", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

