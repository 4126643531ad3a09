"""Partitioned point-to-point on simulated ranks (MPI 4.0; mpi4py's ``Psend_init``, ``Precv_init``,
``Prequest.Pready``, ``Pready_range``, ``Pready_list``, ``Parrived``).

A partitioned send and receive are persistent requests matched once, when both are made: the n-th
``Psend_init`` from rank a to rank b with a tag meets the n-th ``Precv_init`` of rank b from rank a with that
tag (MPI's order of initialization), each side cutting the same bytes into its own number of equal
partitions. Each round both sides ``Start`` their request; the sender marks partitions ready (any order,
any time after its Start) and each ready partition's bytes go straight into the receive buffer once the
receiver has started the same round (a partition readied before that goes when the receiver starts). A
receive partition has arrived (``Parrived``) when every send partition covering its bytes is there; Wait
completes either side when the whole message is through. MPICH sends a partitioned message when all its
partitions are ready (its ``Parrived`` stays False until then); here each partition goes when it is
ready, which the standard allows and which shows a receiver's early use of what arrived. Errors are
MPICH's classes: a partition out of range is MPI.ERR_OTHER, ``Pready`` on a receive or an inactive
request and ``Parrived`` on a send MPI.ERR_REQUEST, a wildcard source or tag MPI.ERR_RANK / ERR_TAG, zero
partitions MPI.ERR_ARG, buffers of different sizes MPI.ERR_OTHER at the receive's Wait; a partition
marked ready twice in one round is MPI.ERR_OTHER (MPICH asserts and aborts, or takes a partition listed
twice in one ``Pready_list``), and MPI.PROC_NULL as the peer is MPI.ERR_RANK (MPICH crashes).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from ..runtime.sim._mpi import mpi_error, mpi_module, special
from ..runtime.sim.engine import Group
from ..runtime.sim.p2p import _check_peer, _check_tag, _remove
from .typemap import message
from ..runtime.sim.request_sets import Polled
from ..runtime.sim.requests import Request, noted, rank_name
from .wildcards import ANY_SOURCE, ANY_TAG, _any
from .persistent import Prequest
from .._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["PartitionedCalls", "Partitioned"]


class _Channel:
    """A matched partitioned send and receive (world lock held for every change)."""

    __slots__ = ("send", "recv", "error")

    def __init__(self, send: "Partitioned", recv: "Partitioned") -> None:
        self.send, self.recv = send, recv
        self.error: Optional[str] = None
        if send.view.nbytes != recv.view.nbytes:  # MPICH: at the receive's Wait, ERR_OTHER
            self.error = (f"partitioned send and receive buffers are not the same size: "
                          f"{rank_name(send.group, send.me)} sends {send.view.nbytes} bytes, "
                          f"{rank_name(recv.group, recv.me)} receives into {recv.view.nbytes}")
        if recv.parts:  # the receive started before the send was made: its round's partitions, none yet
            recv.delivered = [False] * send.partitions

    def deliver(self, i: int) -> None:
        """Copy send partition `i` into the receive buffer, and complete both when all are there."""
        send, recv = self.send, self.recv
        if self.error is None:
            size = send.view.nbytes // send.partitions
            recv.view[i * size:(i + 1) * size] = send.view[i * size:(i + 1) * size]
        recv.delivered[i] = True
        send.left -= 1
        if send.left == 0:
            self.complete()

    def complete(self) -> None:
        """The round's message is through: both requests complete (their owners woken)."""
        send, recv = self.send, self.recv
        got = recv.token
        got.source, got.got_tag, got.nbytes = recv.peer, recv.tag, 0 if self.error else recv.view.nbytes
        if self.error is not None:
            mpi = mpi_module()
            got.error = mpi_error(mpi, mpi.ERR_OTHER, self.error)
        world = send.group.world
        for side in (send, recv):
            side.token.done = True
            world.release(side.group.members[side.me], side.token)

    def started(self) -> None:
        """The receiver started the round the sender is in: the partitions readied so far go now."""
        send = self.send
        for i, ready in enumerate(send.ready):
            if ready and not self.recv.delivered[i]:
                self.deliver(i)


class Partitioned(Prequest):
    """One side of a partitioned send or receive (mpi4py's MPI.Prequest; see the module docstring)."""

    __slots__ = ("side", "partitions", "view", "channel", "rounds", "token", "ready", "left", "delivered")

    def __init__(self, group: Group, me: int, side: str, view: Any, partitions: int, peer: int, tag: int) -> None:
        Prequest.__init__(self)
        self.null, self.kind = False, "partitioned " + side
        self.group, self.me, self.peer, self.tag = group, me, peer, tag
        self.side, self.view, self.partitions = side, view, partitions
        self.channel: Optional[_Channel] = None
        self.rounds = 0  # rounds started
        self.token: Optional[Request] = None  # this round's operation, done when the message is through
        self.ready: list = []  # a send's partitions readied this round
        self.left = 0  # a send's partitions not yet delivered this round
        self.delivered: list = []  # a receive's: which send partitions arrived this round

    def Start(self) -> None:
        mpi = mpi_module()
        if self.null:
            raise mpi_error(mpi, mpi.ERR_REQUEST, "Start: the request is MPI.REQUEST_NULL")
        if self.parts:
            raise mpi_error(mpi, mpi.ERR_REQUEST, "Start: the partitioned request is active (started and not "
                                                  "completed by a Wait or Test)")
        world = self.group.world
        with world.lock:
            world.check(self.group.members[self.me])
            self.rounds += 1
            self.token = Request(self.group, self.me, self.side, self.peer, self.tag)
            self.parts = (self.token,)
            channel = self.channel
            if self.side == "send":
                self.ready = [False] * self.partitions
                self.left = self.partitions
            elif channel is None:  # no send made yet: nothing arrives before it is
                self.delivered = []
            else:
                send = channel.send
                self.delivered = [False] * send.partitions
                if send.rounds == self.rounds and send.parts:
                    channel.started()
        # until a Wait or Test completes it (a warning if never)
        noted(self, f"{'Psend_init' if self.side == 'send' else 'Precv_init'} (started)")

    start = Start

    def _sending(self, call: str) -> None:
        if self.side != "send" or self.null or not self.parts:
            mpi = mpi_module()
            raise mpi_error(mpi, mpi.ERR_REQUEST, f"{call}: not an active partitioned send (started and not "
                                                  f"completed): {self!r}")

    def _partition(self, call: str, i: Any) -> int:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.partitions:
            mpi = mpi_module()
            raise mpi_error(mpi, mpi.ERR_OTHER, f"{call}: partition {i!r} is not one of this request's "
                                                f"{self.partitions} (0 to {self.partitions - 1})")
        return int(i)

    def Pready(self, partition: int) -> None:
        """Mark send partition `partition` ready: its bytes go to the receiver (now, or when it starts)."""
        self._mark("Pready", (self._partition("Pready", partition),))

    def Pready_range(self, partition_low: int, partition_high: int) -> None:
        """Mark send partitions `partition_low` to `partition_high` (both included) ready."""
        low = self._partition("Pready_range", partition_low)
        high = self._partition("Pready_range", partition_high)
        self._mark("Pready_range", tuple(range(low, high + 1)))

    def Pready_list(self, partitions: Sequence[int]) -> None:
        """Mark each of `partitions` ready."""
        self._mark("Pready_list", tuple(self._partition("Pready_list", i) for i in partitions))

    def _mark(self, call: str, which: tuple) -> None:
        self._sending(call)
        world = self.group.world
        with world.lock:
            world.check(self.group.members[self.me])
            for k, i in enumerate(which):
                if self.ready[i] or i in which[:k]:
                    mpi = mpi_module()
                    raise mpi_error(mpi, mpi.ERR_OTHER, f"{call}: partition {i} was marked ready already in "
                                                        f"this round (MPI: once a Start)")
            recv = None if self.channel is None else self.channel.recv  # none yet: it takes them when it starts
            now = recv is not None and recv.rounds == self.rounds and bool(recv.parts) and not recv.token.done
            for i in which:
                self.ready[i] = True
                if now:
                    self.channel.deliver(i)

    pready = Pready
    pready_range = Pready_range
    pready_list = Pready_list

    def Parrived(self, partition: int) -> bool:
        """Whether receive partition `partition` has arrived this round (True on an inactive request)."""
        if self.side != "recv" or self.null:
            mpi = mpi_module()
            raise mpi_error(mpi, mpi.ERR_REQUEST, f"Parrived: not a partitioned receive: {self!r}")
        i = self._partition("Parrived", partition)
        if not self.parts:
            return True
        world = self.group.world
        with world.lock:
            delivered = self.delivered
            # Both sides cut the same bytes into equal parts: receive partition i of r is the fraction
            # [i / r, (i + 1) / r) of the message, which send partitions first to last of s cover.
            s, r = len(delivered), self.partitions
            first, last = i * s // r, -(-(i + 1) * s // r) - 1
            arrived = self.token.done or bool(delivered) and all(delivered[first:last + 1])
        if not arrived:
            self._pause(token=Polled([self.token], "Parrived"))
        return arrived

    parrived = Parrived

    def Free(self) -> None:
        Prequest.Free(self)
        group = self.group
        with group.world.lock:  # never matched: a later one of the other side must not meet it
            _remove(group.partitioned.get(self._key(), []), self)

    def _key(self) -> tuple:
        return (self.me, self.peer, self.tag) if self.side == "send" else (self.peer, self.me, self.tag)

    def __repr__(self) -> str:
        state = "null" if self.null else "active" if self.parts else "inactive"
        way = f"to group rank {self.peer}" if self.side == "send" else f"from group rank {self.peer}"
        return f"<simulated partitioned {self.side} {way} (tag {self.tag}, {self.partitions} partitions) {state}>"


def _made(group: Group, me: int, side: str, buf: Any, partitions: Any, peer: Any, tag: Any) -> Partitioned:
    mpi = mpi_module()
    call = "Psend_init" if side == "send" else "Precv_init"
    if isinstance(partitions, bool) or not isinstance(partitions, (int, np.integer)) or partitions < 1:
        raise mpi_error(mpi, mpi.ERR_ARG, f"{call}: partitions {partitions!r} must be a positive number")
    if side == "recv" and peer == special("ANY_SOURCE"):
        raise mpi_error(mpi, mpi.ERR_RANK, f"{call}: a partitioned receive names its source (not "
                                           f"MPI.ANY_SOURCE): 0 to {group.size - 1}")
    if side == "recv" and tag == special("ANY_TAG"):
        raise mpi_error(mpi, mpi.ERR_TAG, f"{call}: a partitioned receive names its tag (not MPI.ANY_TAG)")
    _check_peer(group, peer, "dest" if side == "send" else "source")
    if peer == special("PROC_NULL"):
        raise mpi_error(mpi, mpi.ERR_RANK, f"{call}: MPI.PROC_NULL is not a partitioned peer")
    _check_tag(tag, f"{call} tag")
    data, count, _ = message(buf, f"{call} buffer", blocks=int(partitions), readonly=side == "send")
    whole = data[:count * int(partitions)]
    view = whole if whole.dtype.char == "B" else whole.view(np.uint8)
    made = Partitioned(group, me, side, view, int(partitions), int(peer), int(tag))
    key = made._key()
    world = group.world
    with world.lock:
        waiting = group.partitioned.setdefault(key, [])
        other = next((w for w in waiting if w.side != side), None)
        if other is None:
            waiting.append(made)
        else:
            waiting.remove(other)
            if not waiting:
                del group.partitioned[key]
            send, recv = (made, other) if side == "send" else (other, made)
            send.channel = recv.channel = _Channel(send, recv)
    return made


class PartitionedCalls:
    """SimComm's ``Psend_init`` and ``Precv_init`` (a mixin; `self._group`, `self._me`)."""

    def Psend_init(self, buf: Any, partitions: int, dest: int, tag: int = 0, info: Any = None) -> Partitioned:
        """A partitioned send of `buf` cut into `partitions` equal parts to `dest` (MPI 4.0)."""
        return _made(self._group, self._me, "send", buf, partitions, dest, tag)

    def Precv_init(self, buf: Any, partitions: int, source: int = ANY_SOURCE, tag: int = ANY_TAG,
                   info: Any = None) -> Partitioned:
        """A partitioned receive into `buf` cut into `partitions` equal parts from `source` (MPI 4.0)."""
        source, tag = _any(source, "source"), _any(tag, "tag")
        return _made(self._group, self._me, "recv", buf, partitions, source, tag)
