"""What a simulated rank's ``mpi4py.MPI`` refuses, and how (docs/reference/emulator.md, "Limits"): `not_simulated`
is the one wording of a call spmdsim mpirun does not simulate (a communicator from an MPI handle, sessions' calls), a
NotImplementedError, what mpi4py raises where the MPI library lacks a call, so a program that checks for it goes
on. ``MPI.Session.Init`` makes a session of this process's MPI (its groups are the process's, not the simulated
world's) with the error handler the rank's ``mpi4py.rc.errors`` gives, as mpi4py sets it when a process starts
one.
"""
from __future__ import annotations

from typing import Any

from .handles import initial_errhandler

__all__ = ["session_class", "not_simulated"]


def not_simulated(what: str, instead: str = "run this program under mpiexec") -> NotImplementedError:
    """The refusal of `what` (a call spmdsim mpirun does not simulate; `instead`: what to do), in one line:
    NotImplementedError, as
    mpi4py raises where the MPI library lacks a call (a program may catch it and go on). Raised and not caught,
    it ends the run even from a thread the rank started, whose rank may wait for it outside MPI
    (as mpi4py.futures' pool waits for its manager thread): `spmdsim_ends_run`, read by
    spmdsim.emulator.rank_threads and spmdsim.runtime.sim.engine.World.fail."""
    exc = NotImplementedError(f"{what}: not simulated; spmdsim mpirun runs communicators (intercommunicators "
                              "too), point to point, collectives, one-sided communication and MPI I/O "
                              f"(docs/howto/simulate.md); {instead}")
    exc.spmdsim_ends_run = True  # type: ignore[attr-defined]
    return exc


_MADE: list = []  # the session class, once made


def session_class() -> Any:
    """mpi4py.MPI.Session as a simulated rank sees it: Init makes a session of this process's MPI with the handler
    of the rank's rc.errors (`_session_init`); mpi4py's own sessions (MPI.SESSION_NULL) are instances too."""
    if not _MADE:
        from mpi4py import MPI

        base = MPI.__dict__["Session"]
        _MADE.append(_Sessions("Session", (base,), {"Init": classmethod(_session_init), "__module__": "mpi4py.MPI",
                                                    "_real": base}))
    return _MADE[0]


def _session_init(cls: type, *args: Any, **kwargs: Any) -> Any:
    """This process's MPI.Session.Init, then the handler of the rank's rc.errors (unless one was given)."""
    from mpi4py import MPI

    session = cls._real.Init(*args, **kwargs)
    if len(args) < 2 and "errhandler" not in kwargs:
        handler = initial_errhandler()
        session.Set_errhandler(MPI.ERRORS_RETURN if handler is None else handler)
    return session


class _Sessions(type):
    """The session class's metaclass: mpi4py's own sessions (MPI.SESSION_NULL) are instances too."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, cls._real)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls._real)
