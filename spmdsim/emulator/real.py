"""mpi4py.MPI as mpi4py defines it, beneath the names a simulated rank sees swapped
(spmdsim.emulator.mpi4py_world): read by the modules that need MPI's own classes and constants."""
from __future__ import annotations

from typing import Any

from ..runtime.sim._mpi import mpi_module

__all__ = ["real", "real_module", "comm_null"]


def real(name: str) -> Any:
    """The mpi4py.MPI attribute `name` as mpi4py defines it (not swapped)."""
    from mpi4py import MPI

    return MPI.__dict__[name]


def real_module() -> Any:
    from mpi4py import MPI

    return MPI


def comm_null() -> Any:
    """MPI.COMM_NULL (None when mpi4py is not loaded), what Split gives a rank of no color."""
    mpi = mpi_module()
    return None if mpi is None else mpi.COMM_NULL
