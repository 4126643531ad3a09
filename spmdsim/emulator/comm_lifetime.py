"""A simulated communicator's end (Free, free, Abort), its attached buffer, and the calls not simulated.

`CommLifetime` is SimComm's mixin of them: MPI handles (toint is -1; fromint
refused), an intercommunicator made by the simulated MPI.Intercomm, and so the children of a Spawn
(spmdsim.emulator.spawn) and the groups an Accept and a Connect join (spmdsim.emulator.ports).
"""
from __future__ import annotations

from typing import Any

from ..base import context as _local
from ..runtime.sim._mpi import mpi_error, mpi_module
from ..runtime.sim.engine import SimulationError
from ..runtime.sim.requests import completed
from .unsupported import not_simulated
from .job_end import end_every_rank

__all__ = ["CommLifetime"]


class CommLifetime:
    """A communicator's handles, its end and its buffer, and the calls refused (a mixin of SimComm)."""

    def toint(self) -> int:
        """-1: a simulated communicator has no MPI handle (mpi4py's answer where there is none)."""
        return -1

    py2f = toint

    @classmethod
    def fromint(cls, handle: int) -> Any:
        """No MPI handle to find one by (`toint` is -1): refused in one line, as the calls below are."""
        _not_simulated("a communicator from an MPI handle (Comm.fromint, Comm.f2py, Comm.fromhandle)")

    f2py = fromhandle = fromint

    @classmethod
    def Get_parent(cls) -> Any:
        """A rank a Spawn started: the intercommunicator to its parents (spmdsim.emulator.spawn), MPI.COMM_NULL
        once it was disconnected; any other rank: MPI.COMM_NULL (a null MPI.Intercomm, as mpi4py's)."""
        state = _local.simulated()
        if state is not None and state.parent is not None:
            return state.parent
        mpi = mpi_module()
        return mpi.Intercomm() if mpi is not None else None

    def Create_intercomm(self, local_leader: int, peer_comm: Any, remote_leader: int, tag: int = 0) -> Any:
        """An intercommunicator of this group and the remote leader's: the simulated MPI.Intercomm's
        (spmdsim.emulator.intercomm), as a simulated rank's mpi4py.MPI gives it (spmdsim.emulator.mpi4py_world)."""
        mpi = mpi_module()
        create = getattr(getattr(mpi, "Intercomm", None), "_create", None)
        if create is None:
            _not_simulated("intercommunicators outside a simulated rank's mpi4py (Intracomm.Create_intercomm)")
        return create(self, local_leader, peer_comm, remote_leader, tag)

    def Spawn(self, command: Any, args: Any = None, maxprocs: int = 1, info: Any = None, root: int = 0,
              errcodes: Any = None) -> Any:
        """Start `maxprocs` simulated ranks running the Python program `command` with `args` (the root's count):
        the intercommunicator to them (spmdsim.emulator.spawn, through the simulated MPI.Intercomm)."""
        return _intercomm("Spawn")._spawn(self, False, command, args, maxprocs, info, root, errcodes)

    def Spawn_multiple(self, command: Any, args: Any = None, maxprocs: Any = None, info: Any = None, root: int = 0,
                       errcodes: Any = None) -> Any:
        """Spawn of several programs, one world of all their ranks (spmdsim.emulator.spawn)."""
        return _intercomm("Spawn_multiple")._spawn(self, True, command, args, maxprocs, info, root, errcodes)

    def Accept(self, port_name: str, info: Any = None, root: int = 0) -> Any:
        """The intercommunicator to the group that Connects to `port_name` (the root's), collective over this
        communicator (spmdsim.emulator.ports, through the simulated MPI.Intercomm)."""
        return _intercomm("Accept")._accept(self, port_name, info, root)

    @classmethod
    def Join(cls, fd: int) -> Any:
        """The intercommunicator of this rank and the one at the other end of connected socket `fd`
        (spmdsim.emulator.ports)."""
        return _intercomm("Join")._join(int(fd))

    def Connect(self, port_name: str, info: Any = None, root: int = 0) -> Any:
        """The intercommunicator to the group that Accepts on `port_name` (the root's) (spmdsim.emulator.ports)."""
        return _intercomm("Connect")._connect(self, port_name, info, root)

    def Free(self) -> None:
        """Free the communicator (this handle then equals MPI.COMM_NULL); MPI.COMM_WORLD and MPI.COMM_SELF
        are permanent, and a null communicator is none: MPI.Exception (MPI.ERR_COMM), as MPICH raises (the
        permanent ones stay usable)."""
        h = self._h
        if h is None or h.predefined:
            text = "the communicator is MPI.COMM_NULL" if h is None else f"cannot free permanent communicator {h.name}"
            mpi = mpi_module()
            raise mpi_error(mpi, mpi.ERR_COMM, text) if mpi is not None else SimulationError(text)
        if h.attrs:
            self._delete_attrs()
        h.freed = True
        self._h = None  # this handle is MPI.COMM_NULL now; a copy (MPI.Comm(c)) keeps the freed one

    def free(self) -> None:
        """Free the communicator if it is not null or predefined (mpi4py's free: nothing on MPI.COMM_WORLD and
        MPI.COMM_SELF themselves; a copy of one, ``MPI.Comm(MPI.COMM_WORLD)``, becomes MPI.COMM_NULL)."""
        h = self._h
        if h is not None and h.predefined:
            state = _local.simulated()
            if state is None or self is not state.world_comm and self is not state.self_comm:
                self._h = None
        elif h is not None and not h.freed:
            self.Free()

    def Abort(self, errorcode: int = 0) -> None:
        """End every simulated rank at once, never returning (job_end.end_every_rank): the run's failure is a
        SimulationError, whose `abort_code` spmdsim mpirun exits with."""
        error = SimulationError(f"simulated rank {self.world_rank} called Abort({errorcode}) on "
                                f"{self._group.label()}: every rank was stopped")
        error.abort_code = int(errorcode)
        end_every_rank(error)

    def Attach_buffer(self, buf: Any) -> None:
        self._h.buffer = buf

    def Detach_buffer(self) -> Any:
        buf, self._h.buffer = self._h.buffer, None
        return buf

    def Flush_buffer(self) -> None:
        pass  # buffered sends are delivered from their own copies

    def Iflush_buffer(self) -> Any:
        return completed()


def _intercomm(call: str) -> Any:
    """The simulated MPI.Intercomm a rank's mpi4py.MPI gives (spmdsim.emulator.mpi4py_world), which spawns;
    outside one, `call` is refused in one line."""
    found = getattr(mpi_module(), "Intercomm", None)
    if getattr(found, "_spawn", None) is None:
        _not_simulated(f"dynamic processes and client-server connections outside a simulated rank's mpi4py "
                       f"(Intracomm.{call})")
    return found


def _not_simulated(what: str) -> None:
    raise not_simulated(what)
