"""MPI.ANY_SOURCE and MPI.ANY_TAG as the defaults of a simulated receive or probe (spmdsim.emulator.p2p,
persistent, partitioned and message), read from this process's MPI when the call is made."""
from __future__ import annotations

from typing import Any

from ..runtime.sim._mpi import c_int, special

__all__ = ["ANY_SOURCE", "ANY_TAG"]


class _Wildcard:
    """The default of a receive's or probe's source or tag: MPI.ANY_SOURCE or MPI.ANY_TAG as this process's MPI
    has them (read when the call is made), as mpi4py's defaults are; None there is mpi4py's TypeError."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"MPI.{self.name}"


ANY_SOURCE, ANY_TAG = _Wildcard("ANY_SOURCE"), _Wildcard("ANY_TAG")


def _any(value: Any, what: str) -> int:
    """A receive's or probe's source or tag (`what`: its name in the error) as mpi4py takes it: a C int (`c_int`:
    None is mpi4py's TypeError, "an integer is required"), the defaults the wildcards."""
    if isinstance(value, _Wildcard):
        return special(value.name)
    return c_int(value, what)
