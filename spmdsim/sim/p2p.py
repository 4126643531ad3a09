"""Point-to-point messages between simulated ranks: Isend/Irecv matching and requests.

A send is matched with the first posted receive of its destination that takes
its source and tag, and a receive with the oldest pending send that fits, so
messages between two ranks never overtake each other (MPI's rule). No message
is buffered: the rank that completes the match copies straight from the
sender's buffer into the receiver's, and the send completes then (MPI's
synchronous mode). A program that needs MPI to buffer its sends (both ranks
Send, then Recv) is reported as a deadlock, which is what it does at large
sizes under MPI too; Sendrecv, or Isend/Irecv and Wait, never need it.
"""
from __future__ import annotations

import pickle
from typing import Any, Optional, Sequence

import numpy as np

from ..errors import ShapeError
from ._buffers import flat, special
from .engine import Group, _Waiting

__all__ = ["Request", "post_send", "post_recv", "completed"]


class Request:
    """A pending point-to-point operation (mpi4py's Request subset: Wait, Test, Waitall, Testall)."""

    __slots__ = ("group", "me", "peer", "tag", "buf", "obj", "done", "error", "source", "got_tag",
                 "count", "kind")

    def __init__(self, group: Optional[Group], me: int, kind: str, peer: int, tag: int,
                 buf: Optional[np.ndarray], obj: Any = None) -> None:
        self.group, self.me, self.kind = group, me, kind
        self.peer, self.tag, self.buf, self.obj = peer, tag, buf, obj
        self.done = group is None
        self.error: Optional[str] = None
        self.source, self.got_tag, self.count = peer, tag, 0

    def _what(self) -> str:
        peer = "any rank" if self.peer == special("ANY_SOURCE") else f"group rank {self.peer}"
        way = "to" if self.kind == "send" else "from"
        return f"{self.kind} {way} {peer} (tag {self.tag})"

    def Wait(self, status: Any = None) -> Any:
        """Block until the operation completed; a receive of an object returns it."""
        if not self.done:
            group = self.group
            world = group.world
            rank = group.members[self.me]
            with world.lock:
                world.check(rank)
                if not self.done:
                    world.wait(rank, _Waiting(self._what(), group, None, token=self))
        if self.error is not None:
            raise ShapeError(self.error)
        _fill(status, self)
        if self.kind == "recv" and self.buf is None:
            return pickle.loads(self.obj)
        return None

    wait = Wait

    def Test(self, status: Any = None) -> bool:
        if self.done:
            _fill(status, self)
        else:
            self._pause()
        return self.done

    def _pause(self) -> None:
        """Not done yet: let a rank waiting for a run slot compute (it may be the peer)."""
        if self.group is not None:
            self.group.world.pause(self.group.members[self.me])

    def Free(self) -> None:
        pass

    @classmethod
    def Waitall(cls, requests: Sequence["Request"], statuses: Any = None) -> list:
        return [r.Wait(None if statuses is None else statuses[i]) for i, r in enumerate(requests)]

    waitall = Waitall

    @classmethod
    def Testall(cls, requests: Sequence["Request"]) -> bool:
        pending = next((r for r in requests if not r.done), None)
        if pending is not None:
            pending._pause()
        return pending is None


def completed() -> Request:
    """A request that is already complete (a send or receive with MPI.PROC_NULL, an eager collective)."""
    return Request(None, 0, "done", 0, 0, None)


def _fill(status: Any, request: Request) -> None:
    if status is not None and request.kind == "recv" and hasattr(status, "Set_source"):
        status.Set_source(request.source)
        status.Set_tag(request.got_tag)


def _fits(recv: Request, source: int, tag: int) -> bool:
    return (recv.peer in (source, special("ANY_SOURCE"))) and (recv.tag in (tag, special("ANY_TAG")))


def post_send(group: Group, me: int, dest: int, tag: int, buf: Any, obj: Any = None) -> Request:
    """Isend from group rank `me` to group rank `dest`: matched now if the receive is posted."""
    _check_peer(group, dest, "dest")
    if dest == special("PROC_NULL"):
        return completed()
    send = Request(group, me, "send", dest, tag, None if buf is None else flat(buf, "send buffer"),
                   None if buf is not None else pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
    return _post(send, group.recvs, lambda r: r.me == dest and _fits(r, me, tag), group.sends)


def post_recv(group: Group, me: int, source: int, tag: int, buf: Any) -> Request:
    """Irecv into group rank `me`'s `buf` (None: an object): matched now if a send is pending."""
    if source != special("ANY_SOURCE"):
        _check_peer(group, source, "source")
    if source == special("PROC_NULL"):
        return completed()
    recv = Request(group, me, "recv", source, tag, None if buf is None else flat(buf, "receive buffer"))
    return _post(recv, group.sends, lambda s: s.peer == me and _fits(recv, s.me, s.tag), group.recvs)


def _post(mine: Request, pending: list, matches: Any, queue: list) -> Request:
    """Match `mine` with the oldest fitting request in `pending` and deliver, or queue it."""
    group = mine.group
    world = group.world
    with world.lock:
        world.check(group.members[mine.me])
        other = next((r for r in pending if matches(r)), None)
        if other is None:
            queue.append(mine)
            return mine
        pending.remove(other)
    if mine.kind == "send":
        _deliver(mine, other)
    else:
        _deliver(other, mine)
    return mine


def _deliver(send: Request, recv: Request) -> None:
    """Copy the message (outside the lock), then complete both requests and wake their owners."""
    recv.source, recv.got_tag = send.me, send.tag
    if recv.buf is None:
        recv.obj = send.obj if send.obj is not None else pickle.dumps(np.array(send.buf))
    elif send.buf is None:
        recv.error = "an object was sent where a buffer receive was posted (use recv/Recv alike)"
    elif send.buf.nbytes > recv.buf.nbytes:
        recv.error = (f"message truncated: group rank {send.me} sends {send.buf.nbytes} bytes (tag "
                      f"{send.tag}) but group rank {recv.me} receives into {recv.buf.nbytes}")
    else:
        n = send.buf.nbytes
        recv.buf.view(np.uint8)[:n] = send.buf.view(np.uint8)
        recv.count = n
    group = send.group
    world = group.world
    with world.lock:
        send.done = recv.done = True
        world.release(group.members[send.me], send)
        world.release(group.members[recv.me], recv)


def _check_peer(group: Group, peer: Any, what: str) -> None:
    if type(peer) is not int and not isinstance(peer, (int, np.integer)):
        raise ShapeError(f"{what} {peer!r} must be an integer rank of the communicator")
    if not (0 <= peer < group.size or peer == special("PROC_NULL")):
        raise ShapeError(f"{what} rank {peer!r} is outside the communicator of {group.size} ranks")
