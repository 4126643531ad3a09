"""SimComm's point-to-point methods (mpi4py's Send, Recv, Isend, ..., send, recv): the thread engine's
messages (spmdsim.sim.p2p: matching, eager sends, probes) behind mpi4py's names and arguments."""
from __future__ import annotations

from typing import Any, Optional

from ..sim._buffers import message, no_buffer, special
from ..sim.p2p import _any, post_recv, post_send, probe
from ..sim.requests import Request
from .derived import may_be_derived, packed, unpacking

__all__ = ["PointToPoint"]



def _no_buffer(call: str) -> TypeError:
    """mpi4py's error for None where a buffer goes (the thread engine reads None as an object message)."""
    return no_buffer(call, "send, recv")


class PointToPoint:
    """Point-to-point methods of SimComm (a mixin; `self._group`, `self._me`)."""

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        if buf is None and dest != special("PROC_NULL"):  # None is an empty message only to MPI.PROC_NULL
            raise _no_buffer("Send")
        return post_send(self._group, self._me, dest, tag, packed(buf) if may_be_derived(buf) else buf)

    def Ibsend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        if buf is None and dest != special("PROC_NULL"):  # None is an empty message only to MPI.PROC_NULL
            raise _no_buffer("Bsend")
        buf = packed(buf) if may_be_derived(buf) else buf
        return post_send(self._group, self._me, dest, tag, buf, mode="buffered")

    def Issend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        if buf is None and dest != special("PROC_NULL"):  # None is an empty message only to MPI.PROC_NULL
            raise _no_buffer("Ssend")
        buf = packed(buf) if may_be_derived(buf) else buf
        return post_send(self._group, self._me, dest, tag, buf, mode="synchronous")

    Irsend = Isend

    def Irecv(self, buf: Any, source: Optional[int] = None, tag: Optional[int] = None) -> Request:
        if buf is None and source != special("PROC_NULL"):  # None is an empty message only to MPI.PROC_NULL
            raise _no_buffer("Recv")
        into, unpack = unpacking(buf) if may_be_derived(buf) else (buf, None)  # a derived type: unpacked on arrival
        return post_recv(self._group, self._me, _any(source, "ANY_SOURCE"), _any(tag, "ANY_TAG"), into, unpack)

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self.Isend(buf, dest, tag).Wait()

    def Bsend(self, buf: Any, dest: int, tag: int = 0) -> None:
        self.Ibsend(buf, dest, tag).Wait()

    def Ssend(self, buf: Any, dest: int, tag: int = 0) -> None:
        self.Issend(buf, dest, tag).Wait()

    Rsend = Send

    def Recv(self, buf: Any, source: Optional[int] = None, tag: Optional[int] = None, status: Any = None) -> None:
        self.Irecv(buf, source, tag).Wait(status)

    def Isendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                  source: Optional[int] = None, recvtag: Optional[int] = None) -> Request:
        if recvbuf is None and sendbuf is not None and source != special("PROC_NULL"):
            raise _no_buffer("Recv")  # before the send is posted: mpi4py reads both messages before MPI sends
        send = self.Isend(sendbuf, dest, sendtag)
        recv = self.Irecv(recvbuf, source, recvtag)
        both = Request(None, self._me, "sendrecv")
        both.null, both.parts = False, (send, recv)
        return both

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: Optional[int] = None, recvtag: Optional[int] = None, status: Any = None) -> None:
        self.Isendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag).Wait(status)

    def Isendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: Optional[int] = None,
                          recvtag: Optional[int] = None) -> Request:
        if buf is None and dest == source == special("PROC_NULL"):
            buf = [None, 0]  # mpi4py's empty message: None is one only to and from MPI.PROC_NULL
        data, count, _ = message(buf, "Sendrecv_replace buffer", readonly=False)
        both = Request(None, self._me, "sendrecv")
        send = self.Isend(data[:count].copy(), dest, sendtag)  # sent from a copy: `buf` is received into
        both.null, both.parts = False, (send, self.Irecv(data[:count], source, recvtag))
        return both

    def Sendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: Optional[int] = None,
                         recvtag: Optional[int] = None, status: Any = None) -> None:
        self.Isendrecv_replace(buf, dest, sendtag, source, recvtag).Wait(status)

    def Probe(self, source: Optional[int] = None, tag: Optional[int] = None, status: Any = None) -> bool:
        return probe(self._group, self._me, _any(source, "ANY_SOURCE"), _any(tag, "ANY_TAG"), status, True)

    def Iprobe(self, source: Optional[int] = None, tag: Optional[int] = None, status: Any = None) -> bool:
        return probe(self._group, self._me, _any(source, "ANY_SOURCE"), _any(tag, "ANY_TAG"), status, False)

    probe = Probe
    iprobe = Iprobe

    def Mprobe(self, source: Optional[int] = None, tag: Optional[int] = None, status: Any = None) -> Any:
        """A matched probe: the message, taken for the returned MPI.Message to receive (SimMessage)."""
        from .message import SimMessage

        return SimMessage._taken(probe(self._group, self._me, _any(source, "ANY_SOURCE"), _any(tag, "ANY_TAG"),
                                       status, True, take=True))

    def Improbe(self, source: Optional[int] = None, tag: Optional[int] = None, status: Any = None) -> Any:
        """Mprobe if a message waits, else None."""
        from .message import SimMessage

        found = probe(self._group, self._me, _any(source, "ANY_SOURCE"), _any(tag, "ANY_TAG"), status, False,
                      take=True)
        return None if found is None else SimMessage._taken(found)

    mprobe = Mprobe
    improbe = Improbe

    # -- objects (pickled) -------------------------------------------------------------------------

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        return post_send(self._group, self._me, dest, tag, None, obj)

    def ibsend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        return post_send(self._group, self._me, dest, tag, None, obj, mode="buffered")

    def issend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        return post_send(self._group, self._me, dest, tag, None, obj, mode="synchronous")

    def irecv(self, buf: Any = None, source: Optional[int] = None, tag: Optional[int] = None) -> Request:
        return post_recv(self._group, self._me, _any(source, "ANY_SOURCE"), _any(tag, "ANY_TAG"), None)

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        self.isend(obj, dest, tag).wait()

    def bsend(self, obj: Any, dest: int, tag: int = 0) -> None:
        self.ibsend(obj, dest, tag).wait()

    def ssend(self, obj: Any, dest: int, tag: int = 0) -> None:
        self.issend(obj, dest, tag).wait()

    def recv(self, buf: Any = None, source: Optional[int] = None, tag: Optional[int] = None,
             status: Any = None) -> Any:
        if buf is not None:  # as mpi4py warns; the message is unpickled from its own bytes
            import warnings

            warnings.warn("the 'buf' argument is deprecated", UserWarning, stacklevel=2)
        return self.irecv(None, source, tag).wait(status)

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: Optional[int] = None, recvtag: Optional[int] = None, status: Any = None) -> Any:
        send = self.isend(sendobj, dest, sendtag)
        got = self.irecv(None, source, recvtag).wait(status)
        send.wait()
        return got
