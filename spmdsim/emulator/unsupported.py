"""What a simulated rank's ``mpi4py.MPI`` refuses: one-sided windows, MPI I/O files and sessions over
simulated ranks (docs/simulate.md, "Limits"). ``MPI.Win``, ``MPI.File`` and ``MPI.Session`` are, on a
simulated rank, subclasses of mpi4py's whose constructors raise NotImplementedError in one line (what
mpi4py raises where the MPI library lacks a call, so a program that checks for it goes on), instead of
a TypeError about a communicator of the wrong class, or a session of the real process.
"""
from __future__ import annotations

from typing import Any

__all__ = ["refusing"]

#: mpi4py's class -> (what it is, its constructors).
_REFUSED = {"Win": ("one-sided communication (MPI.Win)", ("Create", "Allocate", "Allocate_shared", "Create_dynamic")),
            "File": ("MPI I/O (MPI.File)", ("Open",)),
            "Session": ("MPI sessions (MPI.Session)", ("Init",))}

_MADE: dict = {}


def refusing(name: str) -> Any:
    """mpi4py.MPI's class `name` (Win, File, Session) with its constructors refused on simulated ranks."""
    found = _MADE.get(name)
    if found is None:
        from mpi4py import MPI

        what, constructors = _REFUSED[name]

        def refuse(cls: type, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError(f"{what} is not simulated: spmdsim mpirun runs communicators, point to "
                                      f"point and collectives (docs/simulate.md); run this program under mpiexec")

        base = MPI.__dict__[name]
        found = _MADE[name] = _Refusing(name, (base,), {c: classmethod(refuse) for c in constructors}
                                        | {"__module__": "mpi4py.MPI", "_real": base})
    return found


class _Refusing(type):
    """The metaclass of the refusing classes: mpi4py's own objects (MPI.WIN_NULL) are instances too."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._real)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._real)
