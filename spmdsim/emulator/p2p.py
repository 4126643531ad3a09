"""SimComm's point-to-point methods (mpi4py's Send, Recv, Isend, ..., send, recv): the thread engine's
messages (spmdsim.runtime.sim.p2p: matching, eager sends, probes) behind mpi4py's names and arguments."""
from __future__ import annotations

import numbers
import warnings
from typing import Any

from ..runtime.sim._buffers import no_buffer
from ..runtime.sim._mpi import special
from ..runtime.sim.p2p import post_recv, post_send, probe
from ..runtime.sim.requests import Request, noted
from .derived import may_be_derived, packed, unpacking
from .typemap import mapped, message
from .message import SimMessage
from .wildcards import ANY_SOURCE, ANY_TAG, _any

__all__ = ["PointToPoint"]


def _no_buffer(call: str) -> TypeError:
    """mpi4py's error for None where a buffer goes (the thread engine reads None as an object message)."""
    return no_buffer(call, "send, recv")


def _send_buffer(buf: Any, call: str) -> None:
    """Refuse, as mpi4py does, a message `call` reads (one to or from a rank, not MPI.PROC_NULL): None, and a
    buffer without a datatype that mpi4py maps to none (spmdsim.emulator.typemap)."""
    if buf is None:
        raise _no_buffer(call)
    mapped(buf, f"{call} buffer")


def _predefined(buf: Any) -> bool:
    """Whether `buf` is ``[buffer, count, datatype]`` of a predefined datatype (each of osu_bw's messages): a
    datatype given, so none to map (`mapped`), and none derived (`may_be_derived`); asked first, of every message."""
    return type(buf) in (list, tuple) and len(buf) == 3 and getattr(buf[2], "is_predefined", False) is True


#: A C int's bounds: a rank or tag within them is one mpi4py takes as it is (spmdsim.runtime.sim._mpi.c_int).
_C_INT = 1 << 31

#: The blocking call of each send mode, as mpi4py names it in a refused buffer's error.
_BLOCKING = {"standard": "Send", "buffered": "Bsend", "synchronous": "Ssend"}


class PointToPoint:
    """Point-to-point methods of SimComm (a mixin; `self._group`, `self._me`)."""

    def _to(self, dest: Any) -> tuple:
        """(the engine's group, this member, the destination) of a message to rank `dest`: an intercommunicator's
        are its own (spmdsim.emulator.intercomm)."""
        return self._group, self._me, dest

    def _from(self, source: Any) -> tuple:
        """(the engine's group, this member, the source) of a receive or probe of a message from `source`."""
        return self._group, self._me, source

    # The program's nonblocking calls note their requests until completed (a warning names one never completed:
    # spmdsim.runtime.sim.requests.noted); the blocking calls, which complete theirs at once, post through
    # _isend, _irecv.

    def Isend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        return noted(self._isend(buf, dest, tag, "standard", True), "Isend")

    def Ibsend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        return noted(self._isend(buf, dest, tag, "buffered", True), "Ibsend")

    def Issend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        return noted(self._isend(buf, dest, tag, "synchronous", True), "Issend")

    def Irsend(self, buf: Any, dest: int, tag: int = 0) -> Request:
        return noted(self._isend(buf, dest, tag, "standard", True), "Irsend")

    def _isend(self, buf: Any, dest: int, tag: int, mode: str, watch: Any = False) -> Request:
        """A send; with `watch` (the program's nonblocking send) its completion checks that the program did not
        write into the buffer since (spmdsim.runtime.sim.p2p.rewritten)."""
        if _predefined(buf):  # nothing to refuse here, nothing to pack
            return post_send(*self._to(dest), tag, buf, mode=mode, watch=watch or None)
        if dest != special("PROC_NULL"):  # None is an empty message only to MPI.PROC_NULL
            _send_buffer(buf, _BLOCKING[mode])
        if may_be_derived(buf):
            given, buf = buf, packed(buf)
            if watch and buf is not given:  # a derived datatype's: compared packed again
                watch = lambda: packed(given)[0]  # noqa: E731
        return post_send(*self._to(dest), tag, buf, mode=mode, watch=watch or None)

    def Irecv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """The message lands in `buf` when the request completes (Wait, Test, ...): read before, `buf` holds what
        it held (spmdsim.runtime.sim.p2p: MPI forbids reading it until then; a cluster's receive may land it late)."""
        return noted(self._irecv(buf, source, tag, True), "Irecv")

    def _irecv(self, buf: Any, source: Any, tag: Any, defer: bool) -> Request:
        """Irecv; without `defer` (the blocking calls, which wait for it at once) the message lands as it arrives."""
        if type(source) is int and type(tag) is int and -_C_INT <= source < _C_INT and -_C_INT <= tag < _C_INT:
            if _predefined(buf):  # a rank and tag as mpi4py takes them, a message with its datatype: nothing to check
                return post_recv(*self._from(source), tag, buf, None, defer=defer)
        else:
            source, tag = _any(source, "source"), _any(tag, "tag")  # first, as mpi4py converts its arguments
        if source != special("PROC_NULL"):  # None is an empty message only to MPI.PROC_NULL
            _send_buffer(buf, "Recv")
        into, unpack = unpacking(buf) if may_be_derived(buf) else (buf, None)  # a derived type: unpacked on arrival
        return post_recv(*self._from(source), tag, into, unpack, defer=defer)

    def Send(self, buf: Any, dest: int, tag: int = 0) -> None:
        self._isend(buf, dest, tag, "standard").Wait()

    def Bsend(self, buf: Any, dest: int, tag: int = 0) -> None:
        self._isend(buf, dest, tag, "buffered").Wait()

    def Ssend(self, buf: Any, dest: int, tag: int = 0) -> None:
        self._isend(buf, dest, tag, "synchronous").Wait()

    Rsend = Send

    def Recv(self, buf: Any, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None) -> None:
        self._irecv(buf, source, tag, False).Wait(status)

    def Isendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                  source: int = ANY_SOURCE, recvtag: int = ANY_TAG) -> Request:
        return noted(self._isendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag, True), "Isendrecv")

    def _isendrecv(self, sendbuf: Any, dest: Any, sendtag: Any, recvbuf: Any, source: Any, recvtag: Any,
                   defer: bool) -> Request:
        source, recvtag = _any(source, "source"), _any(recvtag, "recv tag")  # before the send is posted
        if recvbuf is None and sendbuf is not None and source != special("PROC_NULL"):
            raise _no_buffer("Recv")  # before the send is posted: mpi4py reads both messages before MPI sends
        if source != special("PROC_NULL"):
            mapped(recvbuf, "Recv buffer")
        send = self._isend(sendbuf, dest, sendtag, "standard", defer)  # Isendrecv's (`defer`): its buffer watched
        recv = self._irecv(recvbuf, source, recvtag, defer)
        both = Request(None, self._me, "sendrecv")
        both.null, both.parts = False, (send, recv)
        return both

    def Sendrecv(self, sendbuf: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Any = None) -> None:
        self._isendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag, False).Wait(status)

    def Isendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                          recvtag: int = ANY_TAG) -> Request:
        return noted(self._isendrecv_replace(buf, dest, sendtag, source, recvtag, True), "Isendrecv_replace")

    def _isendrecv_replace(self, buf: Any, dest: Any, sendtag: Any, source: Any, recvtag: Any,
                           defer: bool) -> Request:
        source, recvtag = _any(source, "source"), _any(recvtag, "recv tag")  # before the send is posted
        if buf is None and dest == source == special("PROC_NULL"):
            buf = [None, 0]  # mpi4py's empty message: None is one only to and from MPI.PROC_NULL
        both = Request(None, self._me, "sendrecv")
        sent = packed(buf) if may_be_derived(buf) else buf
        if sent is not buf:  # a derived datatype's message: sent packed now (a copy), unpacked into `buf` on arrival
            send = post_send(*self._to(dest), sendtag, sent, mode="standard")
            both.null, both.parts = False, (send, self._irecv(buf, source, recvtag, defer))
            return both
        data, count, _ = message(buf, "Sendrecv_replace buffer", readonly=False)
        send = self._isend(data[:count].copy(), dest, sendtag, "standard")  # sent from a copy: `buf` is received into
        both.null, both.parts = False, (send, self._irecv(data[:count], source, recvtag, defer))
        return both

    def Sendrecv_replace(self, buf: Any, dest: int, sendtag: int = 0, source: int = ANY_SOURCE,
                         recvtag: int = ANY_TAG, status: Any = None) -> None:
        self._isendrecv_replace(buf, dest, sendtag, source, recvtag, False).Wait(status)

    def Probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None) -> bool:
        return probe(*self._from(_any(source, "source")), _any(tag, "tag"), status, True)

    def Iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None) -> bool:
        return self._iprobe(source, tag, status, "Iprobe")

    def iprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None) -> bool:
        return self._iprobe(source, tag, status, "iprobe")

    def _iprobe(self, source: Any, tag: Any, status: Any, call: str) -> bool:
        """Iprobe; `call`: the program's call, which a report of a loop polling in vain names."""
        return probe(*self._from(_any(source, "source")), _any(tag, "tag"), status, False, call=call)

    probe = Probe

    def Mprobe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None) -> Any:
        """A matched probe: the message, taken for the returned MPI.Message to receive (SimMessage)."""
        return SimMessage._taken(probe(*self._from(_any(source, "source")), _any(tag, "tag"),
                                       status, True, take=True))

    def Improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None) -> Any:
        """Mprobe if a message waits, else None."""
        return self._improbe(source, tag, status, "Improbe")

    def improbe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, status: Any = None) -> Any:
        return self._improbe(source, tag, status, "improbe")

    def _improbe(self, source: Any, tag: Any, status: Any, call: str) -> Any:
        """Improbe; `call` as _iprobe's (MPI.Message.Iprobe's too)."""
        found = probe(*self._from(_any(source, "source")), _any(tag, "tag"), status, False,
                      take=True, call=call)
        return None if found is None else SimMessage._taken(found)

    mprobe = Mprobe

    # -- objects (pickled) -------------------------------------------------------------------------

    def isend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        return noted(post_send(*self._to(dest), tag, None, obj), "isend")

    def ibsend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        return noted(post_send(*self._to(dest), tag, None, obj, mode="buffered"), "ibsend")

    def issend(self, obj: Any, dest: int, tag: int = 0) -> Request:
        return noted(post_send(*self._to(dest), tag, None, obj, mode="synchronous"), "issend")

    def irecv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """An object's receive into `buf`, into a buffer of its own of `buf` bytes when `buf` is an integer (as
        mpi4py's), or without one into mpi4py's own buffer of mpi4py.rc.irecv_bufsz bytes (32 KiB): a longer
        message is MPI's truncation error when the request completes, as under MPI (recv, which probes the message
        first, takes any size)."""
        source, tag = _any(source, "source"), _any(tag, "tag")
        given = None
        if buf is None:
            import mpi4py

            room = int(getattr(getattr(mpi4py, "rc", None), "irecv_bufsz", 32768))
        elif isinstance(buf, numbers.Integral):  # mpi4py's irecv(100): a buffer of 100 bytes
            room = given = int(buf)
            if room < 0:
                raise ValueError(f"irecv: buffer size {room} is negative (an integer buf is a size in bytes)")
        else:  # the program's buffer, which the message's bytes are written into (as mpi4py's irecv)
            view = memoryview(buf)
            if view.readonly:
                raise BufferError("Object is not writable.")  # mpi4py's words
            if not view.c_contiguous:
                raise BufferError("irecv: the buffer is not one contiguous block")
            given = view.cast("B") if view.ndim != 1 or view.format != "B" else view
            room = given.nbytes
        return noted(post_recv(*self._from(source), tag, None, room=room, given=given, defer=True), "irecv")

    def send(self, obj: Any, dest: int, tag: int = 0) -> None:
        post_send(*self._to(dest), tag, None, obj).wait()

    def bsend(self, obj: Any, dest: int, tag: int = 0) -> None:
        post_send(*self._to(dest), tag, None, obj, mode="buffered").wait()

    def ssend(self, obj: Any, dest: int, tag: int = 0) -> None:
        post_send(*self._to(dest), tag, None, obj, mode="synchronous").wait()

    def recv(self, buf: Any = None, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             status: Any = None) -> Any:
        if buf is not None:  # as mpi4py warns; the message is unpickled from its own bytes
            warnings.warn("the 'buf' argument is deprecated", UserWarning, stacklevel=2)
        return post_recv(*self._from(_any(source, "source")), _any(tag, "tag"), None).wait(status)

    def sendrecv(self, sendobj: Any, dest: int, sendtag: int = 0, recvbuf: Any = None,
                 source: int = ANY_SOURCE, recvtag: int = ANY_TAG, status: Any = None) -> Any:
        source, recvtag = _any(source, "source"), _any(recvtag, "recv tag")  # before the send is posted
        send = post_send(*self._to(dest), sendtag, None, sendobj)
        got = post_recv(*self._from(source), recvtag, None).wait(status)  # any size, as mpi4py's
        send.wait()
        return got
