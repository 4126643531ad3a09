"""Requests of simulated ranks, with mpi4py's Request API: Wait/Test and Waitall/any/some, Cancel, Free.

A request is active (truthy, unequal to MPI.REQUEST_NULL) until a Wait or a
successful Test completes it; then it is null, as in mpi4py. The class
methods take lists of these requests; inside `spmdsim mpirun` (and
spmdsim.emulator.mpi4py_world) ``MPI.Request`` is this class, so
``MPI.Request.Waitall(reqs)`` works unchanged.
"""
from __future__ import annotations

import pickle
import sys
from typing import Any, Optional

from ._mpi import mpi_error, mpi_module, special, wildcards
from .groups import Group
from .waiting import _Waiting, ranks_text
from .landing import _SPMDSIM, _land_held, _sent, _world_rank, cancel, let_land, rank_name, sends_wait
from .report import whereabouts
from .unmatched import recv_unmatched, send_unmatched
from .request_sets import ManyRequests, Polled, _empty, fill_status
from ..._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["Request", "REQUEST_NULL", "completed", "fill_status", "rank_name", "noted"]

#: How a pickle of protocol 2 to 5 starts (mpi4py's object messages).
_PICKLES = frozenset(bytes([0x80, v]) for v in range(2, 6))


class Request(ManyRequests):
    """A pending operation of one simulated rank, with mpi4py's Request API
    (Wait/Test and Waitall/any/some, Cancel, Free)."""

    __slots__ = ("group", "me", "kind", "peer", "tag", "buf", "payload", "done", "null", "error",
                 "source", "got_tag", "nbytes", "origin", "parts", "cancelled", "mode", "unpack", "room",
                 "given", "own", "sent", "defer", "held", "noted", "seq", "watch", "__weakref__")

    def __init__(self, group: Any = None, me: int = 0, kind: str = "null", peer: int = 0, tag: int = 0,
                 buf: Optional[np.ndarray] = None, wild: Optional[tuple] = None) -> None:
        if not isinstance(group, (Group, type(None))):  # MPI.Request(request): mpi4py's copy of the handle
            _copy_of(self, group)
            return
        self.group, self.me, self.kind = group, me, kind
        self.peer, self.tag, self.buf = peer, tag, buf
        self.payload: Optional[np.ndarray] = None  # a send's bytes (a receive's, once delivered)
        self.done = group is None
        self.null = kind == "null"
        self.error: Optional[BaseException] = None
        (self.source, self.got_tag), self.nbytes = wild or wildcards(), 0  # `wild`: wildcards(), when known
        self.origin: Optional[Request] = None  # the request this one is a copy of (MPI.Request(req))
        self.parts: tuple = ()
        self.cancelled = False
        self.mode = "standard"
        self.unpack: Optional[Any] = None  # a receive into a derived datatype: unpack(nbytes) once delivered
        self.room: Optional[int] = None  # an object's receive into a buffer (mpi4py's irecv): the most bytes
        # what irecv was given: None (mpi4py's own buffer of rc.irecv_bufsz bytes), a size, or the program's
        # buffer (a byte memoryview over it, which the message's bytes are written into, as mpi4py receives)
        self.given: Any = None
        self.own = False  # a send's payload is its own bytes (an object's pickle), not the program's buffer
        self.sent: Optional[np.dtype] = None  # a buffer send's element type (its payload is the bytes)
        # a program's nonblocking receive into a buffer: the message lands there only when the request completes
        # (Wait, a Test that says done, ...), as a rendezvous receive may, so that a program reading the buffer
        # before that sees what was there before; `held`: its bytes, arrived and waiting to land (`land`); a
        # nonblocking collective's: what writes its result into the receive buffer (spmdsim.emulator.nonblocking)
        self.defer = False
        self.held: Optional[np.ndarray] = None
        self.noted: Optional[dict] = None  # the world's requests of the program not yet completed (`noted`)
        # a program's nonblocking send: (what its buffer held when posted, the buffer), which its completion
        # compares (spmdsim.runtime.sim.landing.rewritten: MPI forbids writing the buffer until then)
        self.watch: Optional[tuple] = None

    # -- identity (mpi4py: a completed request equals MPI.REQUEST_NULL and is falsy) ------------

    def __bool__(self) -> bool:
        return not self.null

    @property
    def active(self) -> bool:
        """Whether Waitany/Testany/... count it: not null (and a persistent one, started)."""
        return not self.null

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, Request):
            if self.null or other.null:  # a copy waited on is null; the request it copies is not
                return self.null and other.null
            return (self.origin or self) is (other.origin or other)
        mpi = mpi_module()
        if mpi is not None and isinstance(other, mpi.__dict__["Request"]):  # the class itself, also swapped
            return self.null and other == mpi.__dict__["REQUEST_NULL"]
        return NotImplemented

    __hash__ = object.__hash__

    def __reduce__(self) -> Any:
        """A null request pickles (a copy, equal to MPI.REQUEST_NULL; a simulated rank's MPI.REQUEST_NULL itself);
        an active one raises ValueError, as mpi4py's."""
        if self is REQUEST_NULL:
            return "REQUEST_NULL"  # this module's constant, as mpi4py pickles its own
        if self.null:
            return (Request, ())
        raise ValueError("cannot serialize 'mpi4py.MPI.Request' instance")

    def __repr__(self) -> str:
        return f"<simulated Request {'null' if self.null else self._what()}>"

    def _what(self) -> str:
        """'recv from group rank 1 (tag 9)'; on a communicator other than the world the peer's world rank too:
        'recv from group rank 1 (world rank 3; tag 9)'. A request of several parts (a Sendrecv, a persistent
        request, a copy): its first pending part's."""
        if self.kind not in ("send", "recv", "probe"):
            shown = self._shown()
            return self.kind if shown is self else shown._what()
        way = "to" if self.kind == "send" else "from"
        tag = "any tag" if self.tag == special("ANY_TAG") else f"tag {self.tag}"
        if self.peer == special("ANY_SOURCE"):
            return f"{self.kind} {way} any rank ({tag})"
        world = _world_rank(self.group, self.peer)
        return f"{self.kind} {way} group rank {self.peer} ({'' if world is None else f'world rank {world}; '}{tag})"

    def _shown(self) -> "Request":
        """The request a report names for this one: itself, or for a request of parts (a Sendrecv, a persistent
        request, a copy) its first part not done (else its first), whose group and peer are the operation's."""
        if self.group is not None or not self.parts:
            return self
        return next((p for p in self.parts if p.group is not None and not p.done), self.parts[0])

    def why_stuck(self, world: Any) -> tuple[str, str]:
        """For a deadlock report (world lock held): what more to say of this waiting request, and a
        hint for the whole report ('' for none). Names the peer when it waits in nothing (finished,
        exited), the messages that do not match a waiting receive or send (spmdsim.runtime.sim.unmatched), and
        sends waiting for each other (which MPI's buffering would let complete)."""
        shown = self._shown()
        if shown is not self:
            return shown.why_stuck(world)
        group = self.group
        if group is None or self.kind not in ("send", "recv", "probe"):
            return "", ""
        more, hint = "", ""
        peer_waits = None
        if self.peer != special("ANY_SOURCE") and 0 <= self.peer < group.size:
            peer = group.members[self.peer]
            peer_waits = world.waiting.get(peer)
            if peer_waits is None:  # a waiting peer has its own clause
                more += f"; {whereabouts(world, peer)}"
        elif self.kind != "send":
            others = [m for i, m in enumerate(group.members) if i != self.me]
            if others and all(m in world.finished for m in others):
                more += f"; {ranks_text(others)} finished"
        if self.kind != "send":  # the messages pending for it (it takes none of them), or that none is
            said, hint = recv_unmatched(world, self)
            return more + said, hint
        said, hint = send_unmatched(world, self)  # its destination waits in a receive that does not take it
        if said:
            return more + said, hint
        peer_sends = peer_waits is not None and getattr(peer_waits.token, "kind", None) == "send"
        if peer_sends and self.payload is not None:
            if self.mode == "synchronous":
                more += "; an Ssend"
                hint = "an Ssend waits until its receive is posted: post the receive first on one side"
            elif self.mode == "standard" and self.payload.nbytes >= world.eager_limit:
                more += f"; a message of {self.payload.nbytes} bytes"
                hint = sends_wait(world.eager_limit)
        return more, hint

    # -- completion ---------------------------------------------------------------------------

    def _ready(self) -> bool:
        return self.done and all(p.done for p in self.parts)

    def _block(self) -> None:
        """Wait (as this rank) until the operation is done."""
        for part in (*self.parts, self):
            if part.group is None or part.done:
                continue
            if part.defer:  # waited for: its message lands as it arrives
                let_land(part)
            world = part.group.world
            rank = part.group.members[part.me]
            with world.lock:
                world.check(rank)
                if not part.done:
                    world.wait(rank, _Waiting(None, part.group, None, token=part))

    def _received(self) -> "Request":
        """The part whose status the request reports: a Sendrecv's receive, a receive from MPI.PROC_NULL
        included (its status names MPI.PROC_NULL, as MPICH's does; the request's own empty one named
        MPI.ANY_SOURCE), else the request itself."""
        return next((p for p in self.parts if p.kind in ("recv", "recv-null")), self) if self.parts else self

    def _finish(self, status: Any) -> Any:
        """Make the request null; fill `status`; return the received object (object receives)."""
        if self.null:
            _empty(status)
            return None
        self.null = True
        if self.noted is not None or self.origin is not None:
            self._completed()
        recv = self._received()
        _land_held(self)  # a deferring receive's message, a nonblocking collective's result, land as it completes
        if recv.error is not None:
            if recv.kind == "recv":  # MPICH fills a failed receive's status too (a truncated one: the bytes it took)
                fill_status(status, recv.source, recv.got_tag, recv.nbytes)
            raise recv.error
        if recv.kind == "recv" or recv.cancelled:
            fill_status(status, recv.source, recv.got_tag, recv.nbytes, recv.cancelled)
        elif recv.kind == "recv-null":  # MPI: a receive from MPI.PROC_NULL
            fill_status(status, special("PROC_NULL"), special("ANY_TAG"), 0)
        elif status is not None and self.kind != "send":
            _empty(status)
        if recv.kind == "recv" and recv.buf is None and recv.payload:  # an empty message is None
            try:
                return pickle.loads(recv.payload)
            except Exception as exc:  # noqa: BLE001 - a buffer's bytes: say so, as the same type
                if bytes(recv.payload[:2]) in _PICKLES and not isinstance(exc, pickle.UnpicklingError):
                    raise  # a pickle's object's own error as it is rebuilt (a __reduce__'s), as mpi4py raises it
                raise pickle.UnpicklingError(
                    f"recv: the message from {rank_name(recv.group, recv.source)} (tag {recv.got_tag}, "
                    f"{recv.nbytes} bytes) is not a pickled object ({exc}); was it sent with Send, a "
                    f"buffer? Receive it with Recv into an array") from None
        return None

    def _pause(self, watch: bool = True, token: Any = None) -> None:
        """Not done yet: let a rank waiting for a run slot compute (it may be the peer); with `watch`,
        a poll of this request (or of `token`: any of several), which World.pause reports if no rank
        left can complete it."""
        owner = self if self.group is not None else next((p for p in self.parts if p.group is not None), None)
        if owner is None:
            return
        if watch and token is None and owner is not self:  # a persistent request, a copy: named by its part
            token = Polled([self], "Test")
        group = owner.group
        group.world.pause(group.members[owner.me], (token or self) if watch else None)

    def never_completes(self, world: Any) -> bool:
        """Whether every rank that could complete this request (its peer; any other member for
        MPI.ANY_SOURCE) has finished (world lock held)."""
        for part in (*self.parts, self):
            if part.group is None or part.done or part.kind not in ("send", "recv", "probe"):
                continue
            members = part.group.members
            if part.peer == special("ANY_SOURCE"):
                others = [m for i, m in enumerate(members) if i != part.me]
            else:
                others = [members[part.peer]]
            if all(m in world.finished for m in others):
                return True
        return False

    def Wait(self, status: Any = None) -> bool:
        """Block until the operation completed (mpi4py returns True)."""
        self._block()
        self._finish(status)
        return True

    def wait(self, status: Any = None) -> Any:
        """Block until done; a receive of an object returns it."""
        self._block()
        return self._finish(status)

    def Test(self, status: Any = None) -> bool:
        if self.null or self._ready():
            self._finish(status)
            return True
        self._pause()
        return False

    def test(self, status: Any = None) -> tuple[bool, Any]:
        if self.null or self._ready():
            return True, self._finish(status)
        self._pause(token=Polled([self], "test"))
        return False, None

    def Get_status(self, status: Any = None) -> bool:
        """Whether done, without completing the request."""
        return self._get_status(status, "Get_status")

    def get_status(self, status: Any = None) -> bool:
        return self._get_status(status, "get_status")

    def _get_status(self, status: Any, call: str) -> bool:
        if self.null:
            _empty(status)
            return True
        if self._ready():
            self._peek(status)
            return True
        self._pause(token=Polled([self], call))
        return False

    def _completed(self, finished: bool = True) -> None:
        """The program completed (`finished`) or freed this request: no longer one it left pending (`noted`); a
        copy's (MPI.Request(req)) completion is its original's. A send completed whose buffer the program wrote
        into since it posted it is noted for a warning (spmdsim.runtime.sim.landing.rewritten; freed, it is not checked:
        the program learns of the send's completion otherwise)."""
        for req in (self, self.origin):
            if req is not None and req.noted is not None:
                entry = req.noted.pop(id(req), None)
                req.noted = None
                if req.watch is not None or req.parts:  # a send, or a request of parts (a receive: neither)
                    _sent(req, finished and entry)

    def _peek(self, status: Any) -> None:
        """Fill `status` for a done request as its completion will (it stays active); a deferring receive's
        message lands (the operation is complete: MPI lets the program read the buffer)."""
        recv = self._received()
        _land_held(self)
        if recv.kind == "recv" or recv.cancelled:
            fill_status(status, recv.source, recv.got_tag, recv.nbytes, recv.cancelled)
        elif recv.kind == "recv-null":
            fill_status(status, special("PROC_NULL"), special("ANY_TAG"), 0)
        elif status is not None and self.kind != "send":
            _empty(status)

    def Cancel(self) -> None:
        """Cancel a receive (or a send) that no message matched yet; MPI's error on a null request."""
        if self.null:
            _null_request("Cancel")
        cancel(self)

    cancel = Cancel

    def Free(self) -> None:
        """Drop the handle; the operation still completes (MPI_Request_free); MPI's error on a null request."""
        if self.null:
            _null_request("Free")
        self.free()

    def free(self) -> None:
        """Free unless null (mpi4py's free: nothing on a null handle)."""
        self.null = True
        if self.noted is not None or self.origin is not None:
            self._completed(False)
        for part in (*self.parts, self):  # a freed receive still completes: its message lands when it arrives
            if part.defer:
                let_land(part)
            elif part is not self and part.held is not None:  # a nonblocking collective's request (a copy's,
                part.free()  # a started persistent one's) freed with it: its result lands once every member posted


def _null_request(call: str) -> None:
    """MPI.Exception (ERR_REQUEST) for `call` on MPI.REQUEST_NULL, as MPI raises it (nothing without mpi4py)."""
    mpi = mpi_module()
    if mpi is not None:
        raise mpi_error(mpi, mpi.ERR_REQUEST, f"{call}: the request is MPI.REQUEST_NULL")


def _copy_of(req: Request, other: Any) -> None:
    """Make `req` mpi4py's ``MPI.Request(other)``: the same operation (equal to it; waiting on either
    completes it), or a null request for MPI.REQUEST_NULL."""
    Request.__init__(req)
    if isinstance(other, Request):
        req.me, req.kind, req.null = other.me, "copy", other.null
        req.parts = other.parts or (other,)
        req.origin = other.origin or other
        return
    mpi = mpi_module()
    if mpi is None or not isinstance(other, mpi.__dict__["Request"]) or other != mpi.__dict__["REQUEST_NULL"]:
        raise TypeError(f"expected a Request, got {type(other).__name__}")


def noted(req: Request, call: str, group: Optional[Group] = None, me: int = 0) -> Request:
    """`req`, which the program's nonblocking `call` (Isend, Irecv, Start, ...) made, kept in its world's
    `posted` with the program line that made it until a Wait, Test, ... completes it or Free frees it: one
    never completed is a warning when the ranks end (spmdsim.runtime.sim.p2p.uncompleted). `group` and `me`: the
    communicator and rank of a collective's nonblocking call, which its warning names (an Idup's or a window's
    request, complete at once, has none of its own)."""
    if group is None:
        owner = req if req.group is not None else next((p for p in req.parts if p.group is not None), None)
        if owner is None:  # MPI.PROC_NULL's: complete already
            return req
        posted = req.noted = owner.group.world.posted
    else:
        posted = req.noted = group.world.posted
    frame = sys._getframe(2)  # the call's caller: the program's line (or, past spmdsim's frames, the first)
    while frame is not None and frame.f_code.co_filename.startswith(_SPMDSIM):
        frame = frame.f_back
    # the instruction, not its line: reading f_lineno scans the code's line table at every post (`program_line`)
    posted[id(req)] = (req, call, frame and frame.f_code, frame and frame.f_lasti, group, me)
    return req


def completed(me: int = 0, kind: str = "done") -> Request:
    """An active request of no communicator whose operation is already complete: a send or receive with
    MPI.PROC_NULL, an Idup, an Iflush_buffer, a window's request (a nonblocking collective's is
    spmdsim.emulator.nonblocking.CollectiveRequest, done once every member posted it)."""
    req = Request(None, me, kind)
    req.null = False
    return req


for _name, _value in vars(ManyRequests).items():  # Python's errors name mpi4py's class: "Request.Testall() ..."
    if isinstance(_value, classmethod):
        _value.__func__.__qualname__ = f"Request.{_name}"
del _name, _value

#: A simulated rank's MPI.REQUEST_NULL (spmdsim.emulator.mpi4py_world swaps it in).
REQUEST_NULL = Request()
