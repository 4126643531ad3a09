"""The nonblocking buffer collectives of SimComm (Iallreduce, Ibarrier, ..., a started Allreduce_init).

They return at once, as MPI's posting must: the member's checks run and its
call is deposited with a copy of its data (engine.Group.post, `_kept`), without
waiting for the others. Its request is done once every member has posted the
collective (in the same order on every member, as MPI requires), and its
completion (Wait, Waitall, a Test that returns true, ..., or Free once done)
runs the member's own phases, reading the others' copies and writing its own
receive buffer, and what the call does after them (a derived datatype's
unpacking), as MPICH's progress completes it (CollectiveRequest): a program
reading the buffer before then sees what was there before, as on MPI, where it
is undefined until completion. A Wait for a collective some member never posts
is a deadlock that names the call (Ibarrier on the world, call 1). The blocking
forms are in spmdsim.emulator.collectives.
"""
from __future__ import annotations

from typing import Any, Callable

import threading

from ..errors import DivergenceError
from .._lazy import numpy_on_first_use
from ..runtime.sim.bodies import _nothing
from ..runtime.sim.engine import _Waiting
from ..runtime.sim.report import places
from ..runtime.sim.requests import noted, Request
from ..runtime.sim.landing import land

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["NonblockingCollectives", "CollectiveRequest", "posting", "landed_freed"]

_SUM = "sum"


class _Posting(threading.local):
    """The nonblocking collective request the calling thread posts now (`NonblockingCollectives._posted`), if any:
    its method's rendezvous deposits the call without waiting, and what the method does after it waits for
    completion. None in a thread that posts none (a class default: every collective asks, and a thread-local
    attribute never set would raise and catch AttributeError each time)."""

    req: Any = None


_POSTING = _Posting()
#: Held while a member of a nonblocking collective runs its phases (one at a time: they share the slot).
_PHASES = threading.Lock()


def posting() -> Any:
    """The request of the nonblocking collective the calling thread is posting now and has not deposited yet
    (SimComm._enter_all), else None."""
    req = _POSTING.req
    return req if req is not None and req.deposited is None else None


def _kept(data: Any) -> Any:
    """A copy of a member's posted data (its arrays; lists and tuples of them): what the other members read, each
    as it completes (this one may have completed and written its buffers again by then). Read when posted, as
    MPI may (the program must not write a buffer of a pending collective), and so no other thread ever touches
    this member's buffers, nor holds a view of them (a DLPack producer's reference count, a bytearray's export,
    stay this rank's own)."""
    if isinstance(data, np.ndarray):
        return data.copy()
    if type(data) in (tuple, list):
        return type(data)(_kept(d) for d in data)
    return data


class CollectiveRequest(Request):
    """The request of a nonblocking collective (Iallreduce, Ibarrier, ..., a started Allreduce_init): posting
    deposits the member's call (engine.Group.post) and returns at once, as MPI's posting does; the request is
    done once every member posted it, and its completion (Wait, a Test that returns true, ...: sim.landing.land
    runs `held`) runs this member's phases of the collective (its reads of the others' data, its writes of its
    own receive buffer) and what its call does after them (a derived datatype's unpacking), in its own thread:
    the result lands then, in any buffer. The others read a copy of its data, taken when posted (`_kept`)."""

    __slots__ = ("slot", "deposited", "after", "number", "writes")

    def __init__(self, group: Any, me: int, kind: str) -> None:
        super().__init__(group, me, kind)
        self.slot: Any = None  # the rendezvous, once deposited
        self.deposited: Any = None  # this member's call in it (engine.Call; not `call`, which names a poll)
        self.after: list = []  # what the method does after its rendezvous, run at completion
        self.number = 0  # its call number on its communicator (a report names it)
        self.writes = False  # whether its completion writes into a buffer of the program (a warning says so)
        self.held = self._complete

    def _block(self) -> None:
        """Wait (as this rank) until every member posted the collective; the members waiting for one
        collective are one clause of a deadlock report (`_InCollective`)."""
        if self.done:
            return
        group = self.group
        world, rank = group.world, group.members[self.me]
        with world.lock:
            world.check(rank)
            if not self.done:
                world.wait(rank, _InCollective(self))

    def _complete(self) -> None:
        slot, call, after = self.slot, self.deposited, self.after
        self.slot, self.after = None, []
        if slot is None:
            return
        phases, call.finish = call.finish or (), None  # they hold this rank's buffers: dropped in its thread
        if slot.error is not None:
            raise DivergenceError(slot.error)
        with _PHASES:
            for phase in phases:
                phase(slot)
        for step in after:
            step()

    def free(self) -> None:
        """MPI forbids freeing a collective's request; MPICH lets the operation go on: a request done already
        completes now, one not done yet when the last member posts the collective (`landed_freed`)."""
        world = self.group.world
        with world.lock:  # against the last member's post (`landed_freed`): one of the two lands it
            done, self.null = self.done, True
        super().free()
        if done:
            _land(self)

    def why_stuck(self, world: Any) -> tuple[str, str]:
        """Where the members that have not posted the collective are (world lock held)."""
        slot = self.slot
        if slot is None or self.done:
            return "", ""
        missing = [m for i, m in enumerate(self.group.members) if slot.calls[i] is None]
        return places(world, missing), ""

    def never_completes(self, world: Any) -> bool:
        """Whether a member that has not posted the collective finished (world lock held)."""
        slot = self.slot
        return (slot is not None and not self.done
                and any(slot.calls[i] is None and m in world.finished for i, m in enumerate(self.group.members)))


def landed_freed(slot: Any) -> None:
    """Every member posted the collective of `slot` (the last member to post calls this): the requests the
    program freed before then complete now, in this thread, as MPICH's progress completes them."""
    if slot.error is None:
        for call in slot.calls:
            req = call.request
            if req.null and req.held is not None:
                _land(req)


class _InCollective(_Waiting):
    """A Wait for a nonblocking collective's request, for a report: 'Ibarrier on the world (call 2)', one key
    for every member waiting for it (released as a wait for the request: World.release)."""

    __slots__ = ()

    def __init__(self, req: CollectiveRequest) -> None:
        super().__init__(req.kind, req.group, req.number, token=req)

    def key(self) -> tuple:
        return (self._op, id(self.group), self.seq, "posted")


def _land(req: Request) -> None:
    land(req)


class NonblockingCollectives:
    """The nonblocking forms of the buffer collectives (a mixin of SimComm, under BufferCollectives)."""

    def _posted(self, method: Callable, *args: Any) -> Any:
        """The nonblocking form of `method` (Allreduce: Iallreduce): its checks now, its call deposited at its
        rendezvous without waiting (SimComm._enter_all), the rest at completion (CollectiveRequest), its request
        noted until the program completes it (a warning names one it never completes: requests.noted)."""
        name = method.__name__
        req = CollectiveRequest(self._group, self._me, f"I{name[:1].lower()}{name[1:]}")
        _POSTING.req = req
        try:
            method(*args)
        finally:
            _POSTING.req = None
        if req.deposited is None:  # no rendezvous: nothing to wait for
            req.done = True
        else:
            req.writes = bool(req.after) or any(phase is not _nothing for phase in req.deposited.finish)
        return noted(req, req.kind, self._group, self._me)

    def _then(self, step: Callable, *args: Any) -> None:
        """What a collective does after its rendezvous (a derived datatype's unpacking): now, or, for a
        nonblocking one being posted, at its completion."""
        req = _POSTING.req
        if req is None or req.deposited is None:  # (before the rendezvous: a collective the post makes first)
            step(*args)
        else:
            req.after.append(lambda: step(*args))

    def Ialltoallw(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Alltoallw, sendbuf, recvbuf)

    def Iallreduce(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> Any:
        return self._posted(self.Allreduce, sendbuf, recvbuf, op)

    def Ireduce(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM, root: int = 0) -> Any:
        return self._posted(self.Reduce, sendbuf, recvbuf, op, root)

    def Iscan(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> Any:
        return self._posted(self.Scan, sendbuf, recvbuf, op)

    def Iexscan(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> Any:
        return self._posted(self.Exscan, sendbuf, recvbuf, op)

    def Ireduce_scatter_block(self, sendbuf: Any, recvbuf: Any, op: Any = _SUM) -> Any:
        return self._posted(self.Reduce_scatter_block, sendbuf, recvbuf, op)

    def Ireduce_scatter(self, sendbuf: Any, recvbuf: Any, recvcounts: Any = None, op: Any = _SUM) -> Any:
        return self._posted(self.Reduce_scatter, sendbuf, recvbuf, recvcounts, op)

    def Iallgather(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Allgather, sendbuf, recvbuf)

    def Iallgatherv(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Allgatherv, sendbuf, recvbuf)

    def Igather(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Any:
        return self._posted(self.Gather, sendbuf, recvbuf, root)

    def Igatherv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Any:
        return self._posted(self.Gatherv, sendbuf, recvbuf, root)

    def Iscatter(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Any:
        return self._posted(self.Scatter, sendbuf, recvbuf, root)

    def Iscatterv(self, sendbuf: Any, recvbuf: Any, root: int = 0) -> Any:
        return self._posted(self.Scatterv, sendbuf, recvbuf, root)

    def Ialltoall(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Alltoall, sendbuf, recvbuf)

    def Ialltoallv(self, sendbuf: Any, recvbuf: Any) -> Any:
        return self._posted(self.Alltoallv, sendbuf, recvbuf)

    def Ibcast(self, buf: Any, root: int = 0) -> Any:
        return self._posted(self.Bcast, buf, root)

    def Ibarrier(self) -> Any:
        return self._posted(self.Barrier)
