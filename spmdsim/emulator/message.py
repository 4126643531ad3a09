"""SimMessage: mpi4py's MPI.Message for simulated ranks (matched probes: Mprobe, Improbe, then Recv).

A matched probe takes the message out of its destination's queue (spmdsim.runtime.sim.p2p.probe
with `take`), so that no other receive, on this thread or another, can take it; the
Message then receives exactly that message (Recv, Irecv; recv, irecv for objects)
and becomes null, as MPI_Mrecv leaves MPI_MESSAGE_NULL. ``SimMessage()`` is null
(equal to MPI.MESSAGE_NULL); a probe of MPI.PROC_NULL gives a "no proc" message,
equal to MPI.MESSAGE_NO_PROC, whose receive completes at once with MPI.PROC_NULL's
status.
"""
from __future__ import annotations

from typing import Any, Optional

from ..runtime.sim._buffers import message
from ..runtime.sim._mpi import mpi_error, mpi_module
from ..runtime.sim.p2p import receive_matched
from ..runtime.sim.requests import Request, completed, noted
from .group import speak_mpi4py
from .wildcards import ANY_SOURCE, ANY_TAG
from .derived import may_be_derived, unpacking
from .typemap import mapped

__all__ = ["SimMessage", "MESSAGE_NULL", "MESSAGE_NO_PROC"]

_NO_PROC = "no proc"


class SimMessage:
    """A message a matched probe took, to be received by this handle only (see the module docstring)."""

    def __init__(self, message: Any = None) -> None:
        self._send: Any = None  # the taken send (spmdsim.runtime.sim.requests.Request), or _NO_PROC
        if isinstance(message, SimMessage):  # MPI.Message(message): the same handle
            self._send = message._send
        elif message is not None:
            mpi = mpi_module()
            if mpi is None or not isinstance(message, mpi.__dict__["Message"]):
                raise TypeError(f"expected a Message, got {type(message).__name__}")
            if message == mpi.__dict__["MESSAGE_NO_PROC"]:
                self._send = _NO_PROC

    @classmethod
    def _taken(cls, send: Any) -> "SimMessage":
        msg = cls()
        msg._send = _NO_PROC if send is True else send
        return msg

    # -- matched probes as class methods (MPI.Message.Probe(comm, ...)) --------------------------------

    @classmethod
    def Probe(cls, comm: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
              status: Any = None) -> "SimMessage":
        return comm.Mprobe(source, tag, status)

    @classmethod
    def Iprobe(cls, comm: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Any = None) -> Optional["SimMessage"]:
        return comm._improbe(source, tag, status, "Message.Iprobe")

    @classmethod
    def iprobe(cls, comm: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG,
               status: Any = None) -> Optional["SimMessage"]:
        return comm._improbe(source, tag, status, "Message.iprobe")

    probe = Probe

    # -- receiving -------------------------------------------------------------------------------------

    def _take(self, call: str) -> Any:
        send = self._send
        if self is not MESSAGE_NO_PROC:  # the constant stays what it is, as MPI's does
            self._send = None
        if send is None:
            mpi = mpi_module()
            # MPICH names the MPI call: MPI_Mrecv for Recv and recv, MPI_Imrecv for Irecv and irecv
            text = (f"{call} (MPI_{'Imrecv' if call[0] in 'Ii' else 'Mrecv'}): the message is MPI.MESSAGE_NULL "
                    f"(received already, or never probed)")
            if mpi is not None:
                raise mpi_error(mpi, mpi.ERR_REQUEST, text)
            raise ValueError(text)
        return send

    def Irecv(self, buf: Any) -> Request:
        return noted(self._irecv(buf, "Irecv", True), "Irecv")

    def _irecv(self, buf: Any, call: str, defer: bool) -> Request:
        """Irecv (`call`: the program's); `defer` as spmdsim.runtime.sim.p2p.post_recv's (the blocking Recv's: none)."""
        if self._send is _NO_PROC:  # any buffer, as mpi4py's
            self._take(call)
            return completed(kind="recv-null")
        # the buffer first, as mpi4py reads it before MPI_Mrecv: one refused leaves the message to receive
        mapped(buf, "Recv buffer")
        into, unpack = unpacking(buf) if may_be_derived(buf) else (buf, None)
        message(into, "receive buffer", readonly=False)
        return receive_matched(self._take(call), into, unpack, defer)

    def Recv(self, buf: Any, status: Any = None) -> None:
        self._irecv(buf, "Recv", False).Wait(status)

    def irecv(self) -> Request:
        return noted(self._irecv_object("irecv"), "irecv")

    def _irecv_object(self, call: str) -> Request:
        send = self._take(call)
        if send is _NO_PROC:
            return completed(kind="recv-null")
        return receive_matched(send, None)

    def recv(self, status: Any = None) -> Any:
        return self._irecv_object("recv").wait(status)

    # -- identity (an MPI handle) ----------------------------------------------------------------------

    def __bool__(self) -> bool:
        return self._send is not None

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, SimMessage):
            return self._send is other._send
        mpi = mpi_module()
        if mpi is not None and isinstance(other, mpi.__dict__["Message"]):  # the class itself, also swapped
            if other == mpi.__dict__["MESSAGE_NULL"]:
                return self._send is None
            if other == mpi.__dict__["MESSAGE_NO_PROC"]:
                return self._send is _NO_PROC
            return False
        return NotImplemented

    def __ne__(self, other: Any) -> Any:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = object.__hash__

    def free(self) -> None:
        """Make this handle null (mpi4py's Message.free)."""
        if self is not MESSAGE_NULL and self is not MESSAGE_NO_PROC:
            self._send = None

    def __reduce__(self) -> Any:
        """Only the null and "no proc" messages pickle (a copy, equal; the constants themselves), others raise
        ValueError, as mpi4py's."""
        if self is MESSAGE_NULL or self is MESSAGE_NO_PROC:
            return "MESSAGE_NULL" if self is MESSAGE_NULL else "MESSAGE_NO_PROC"  # this module's constants
        if self._send is None:
            return (SimMessage, ())
        if self._send is _NO_PROC:
            return (SimMessage._taken, (True,))
        raise ValueError("cannot serialize 'mpi4py.MPI.Message' instance")

    def __repr__(self) -> str:
        send = self._send
        what = "null" if send is None else "from PROC_NULL" if send is _NO_PROC else send._what()
        return f"<simulated Message {what}>"


speak_mpi4py(SimMessage, "Message")

#: A simulated rank's MPI.MESSAGE_NULL and MPI.MESSAGE_NO_PROC (spmdsim.emulator.mpi4py_world swaps them in).
MESSAGE_NULL = SimMessage()
MESSAGE_NO_PROC = SimMessage._taken(True)
