"""A simulated communicator's members and the rendezvous of their collective calls (`Group`, `Call`),
and the requests a rank waits for together (`AllOf`); the world they run in is
spmdsim.runtime.sim.engine's World, which builds on this module (a Group keeps the one it is given)."""
from __future__ import annotations

from typing import Any, Callable, Optional

from ...errors import DivergenceError
from .report import program_lines
from .waiting import _Waiting, ranks_text

__all__ = ["Call", "Group", "AllOf"]


class Call(_Waiting):
    """One member's collective call: what it is (`signature`, compared across members) and its data; while
    the member waits in it, what it waits in (a _Waiting of its group and call number, set on arrival)."""

    __slots__ = ("signature", "data", "complete", "finish", "raised", "request")

    def __init__(self, op: str, signature: tuple, data: Any = None,
                 complete: Optional[Callable[[Any], None]] = None,
                 finish: Optional[tuple] = None) -> None:
        self._op, self.group, self.seq, self.token = op, None, None, None
        self.signature = signature  # (op, dtype, count, root, ...): must be equal on every member
        self.data = data
        self.complete = complete  # run once, under the lock, by the last member to arrive
        # Group.enter_all: this member's reads and writes, one function of the slot per phase
        self.finish = finish
        self.raised: Optional[BaseException] = None  # what this member's finish raised
        self.request: Any = None  # a nonblocking collective's request (`Group.post`): its member does not wait here

    def describe(self) -> str:
        """'allreduce float64 x3 sum': the op, then what must match (counts marked with x)."""
        parts = [self.op] + [f"x{p}" if isinstance(p, int) else str(p) for p in self.signature[1:]
                             if p is not None]
        return " ".join(parts)


class _Slot:
    """The rendezvous of one collective call number on one communicator."""

    __slots__ = ("calls", "arrived", "left", "error", "shared", "signature")

    def __init__(self, size: int, signature: tuple) -> None:
        self.calls: list[Optional[Call]] = [None] * size
        self.signature = signature  # the first arrival's: every member's must equal it
        self.arrived = 0
        self.left = 0
        self.error: Optional[str] = None
        self.shared: Any = None  # set by the calls' `complete` hook (a result every member reads)


class Group:
    """One communicator's members (world ranks, in group order), shared by its members' SimComms."""

    def __init__(self, world: Any, members: tuple[int, ...], made: Optional[str] = None) -> None:
        self.world = world
        self.members = members
        self.size = len(members)
        self.made = made  # what a report calls it, where its members do not say ('a Dup of the world')
        self.slots: dict[int, _Slot] = {}
        self.sends: list[Any] = []  # point-to-point messages not yet matched (spmdsim.runtime.sim.p2p)
        self.recvs: list[Any] = []  # receives posted and not yet matched
        self.probes: list[Any] = []  # blocking probes waiting for a message to arrive
        # partitioned requests made and not yet matched (spmdsim.emulator.partitioned): (sender, receiver, tag)
        # -> those of that key, oldest first
        self.partitioned: dict = {}
        world.groups.add(self)

    def label(self) -> str:
        """What made it where that was said ('a Dup of the world': spmdsim.emulator's Dup), else 'the world' for
        one of every rank in the world's order, else its ranks ('the group of ranks 0,2')."""
        if self.made is not None:
            return self.made
        if self.members == tuple(range(self.world.size)):
            return "the world"
        return f"the group of {ranks_text(self.members)}"

    def enter(self, me: int, seq: int, call: Call) -> _Slot:
        """Deposit member `me`'s call number `seq`; return the rendezvous once every member is there.

        Raises DivergenceError on every member when the calls differ.
        """
        world = self.world
        with world.lock:
            slot, last = self._arrive(me, seq, call)
            if last:
                world.release_members(self, me)
        return slot

    def _arrive(self, me: int, seq: int, call: Call) -> tuple[_Slot, bool]:
        """Deposit the call (world lock held); wait unless last. (slot, whether this member came last).

        Raises DivergenceError on every member when the calls differ.
        """
        world = self.world
        rank = self.members[me]
        if world.deadlock is not None or world.failure is not None:
            world.check(rank, self)
        slot = self.slots.get(seq)
        if slot is None:
            slot = self.slots[seq] = _Slot(self.size, call.signature)
        slot.calls[me] = call
        slot.arrived += 1
        if slot.error is None and call.signature != slot.signature:  # equal to every earlier arrival's, or not
            slot.error = self._mismatch(slot, me, seq)
        last = slot.error is None and slot.arrived == self.size
        if slot.error is not None:
            self._let_go(slot, me)
            raise DivergenceError(slot.error)
        if last:
            del self.slots[seq]  # every member holds the slot now
            if call.complete is not None:
                call.complete(slot)
        else:
            call.group, call.seq = self, seq  # what it waits in, for a report: no object made per wait
            world.wait(rank, call)
            if slot.error is not None:
                raise DivergenceError(slot.error)
        return slot, last

    def _let_go(self, slot: _Slot, me: int) -> None:
        """Let the other members that arrived in `slot` go on (world lock held): those waiting in it, and the
        requests of those that posted it (`post`: their completion raises the slot's error)."""
        world = self.world
        for i, other in enumerate(slot.calls):
            if other is not None and i != me:
                if other.request is None:
                    world.release(self.members[i], None, self)
                else:
                    other.request.done = True
                    world.release(self.members[i], other.request)

    def post(self, me: int, seq: int, call: Call) -> _Slot:
        """Deposit member `me`'s nonblocking collective call number `seq` without waiting (MPI: posting a
        nonblocking collective does not block); once every member posted it, each member's request
        (`call.request`) is done, and its completion runs that member's `finish` phases
        (spmdsim.emulator.nonblocking). Raises DivergenceError when the calls differ (the members that
        posted before raise it at completion)."""
        world = self.world
        with world.lock:
            if world.deadlock is not None or world.failure is not None:
                world.check(self.members[me], self)
            slot = self.slots.get(seq)
            if slot is None:
                slot = self.slots[seq] = _Slot(self.size, call.signature)
            slot.calls[me] = call
            slot.arrived += 1
            if slot.error is None and call.signature != slot.signature:
                slot.error = self._mismatch(slot, me, seq)
            if slot.error is not None:
                self._let_go(slot, me)
                raise DivergenceError(slot.error)
            if slot.arrived == self.size:
                del self.slots[seq]
                call.request.done = True
                self._let_go(slot, me)
        return slot

    def enter_all(self, me: int, seq: int, call: Call) -> _Slot:
        """`enter`, then every member's `call.finish` phases run by the last member to arrive, in
        phase then member order, before the members go on: no `leave` (nobody reads a buffer after
        the members are released, so they may reuse them at once, as under MPI).

        One wait per member instead of two: each wait is a hand-off between threads. A phase that
        raises in a member's function is raised in that member, as if it had run there.
        """
        world = self.world
        with world.lock:
            slot, last = self._arrive(me, seq, call)
        if last:
            calls = slot.calls
            for phase in range(len(call.finish)):
                for other in calls:
                    if other.raised is None:
                        try:
                            other.finish[phase](slot)
                        except Exception as exc:  # noqa: BLE001 - raised in its member
                            other.raised = exc
            with world.lock:
                if world.deadlock is not None or world.failure is not None:
                    world.check(self.members[me], self)
                for other in calls:
                    # Nobody reads the buffers any more: drop them, and the phases that hold them, before a
                    # member goes on, so that this thread holds none of its buffers once it is released (a
                    # reference dropped here later would free its buffer in this thread while it runs).
                    other.data = other.finish = None
                world.release_members(self, me)
        raised, call.raised = call.raised, None  # its traceback holds this member's buffers: its own only
        if raised is not None:
            raise raised
        return slot

    def leave(self, me: int, slot: _Slot) -> None:
        """Wait until every member has finished reading the others' buffers for this call.

        The caller drops its own references to the others' buffers first: once a member goes on, no
        other thread may hold a view of its buffers (dropped there later, it would release the buffer's
        export, or free it, while its owner runs: a bytearray that cannot be resized, a DLPack
        producer's reference count that changes under it)."""
        world = self.world
        with world.lock:
            world.check(self.members[me], self)
            slot.left += 1
            if slot.left == self.size:
                world.release_members(self, me)
            else:
                world.wait(self.members[me], _Waiting(slot.calls[me].op, self, None))
        # Nobody reads this member's buffers any more: drop them, so they are freed when the
        # member drops them (a dry run's peak bytes held does not depend on the others' timing).
        slot.calls[me].data = None

    def _mismatch(self, slot: _Slot, me: int, seq: int) -> Optional[str]:
        # Compared with one member that arrived before: every earlier arrival was compared
        # the same way, so equal signatures on arrival mean equal on every member.
        first = next((i for i, c in enumerate(slot.calls) if c is not None and i != me), None)
        if first is None:
            return None
        mine, theirs = slot.calls[me], slot.calls[first]
        if mine.signature == theirs.signature:
            return None
        (a, one), (b, other) = sorted([(self.members[me], mine), (self.members[first], theirs)],
                                      key=lambda pair: pair[0])
        text = (f"collectives diverge on {self.label()} (call {seq} on that communicator): "
                f"rank {a} calls {one.describe()} but rank {b} calls {other.describe()}"
                f"{program_lines(self.world, [a, b])}")
        self.world.mismatch = self.world.mismatch or text  # (World.finish: caught, it still ends the run)
        return text


class AllOf:
    """Requests a rank waits for together (Waitall): `World.release` lets it go when the last is done, not at
    each. Woken at each, the rank took the interpreter from its peer while that one still posted the rest
    (a hand-over that waits up to Python's 5 ms switch interval): osu_bw's windows of 64 Irecvs spent
    most of their time there. A report (why_stuck, kind, ...) sees the first request not done."""

    __slots__ = ("requests", "_next")

    def __init__(self, requests: tuple) -> None:
        self.requests, self._next = requests, 0  # requests[:_next] are done

    def all_done(self) -> bool:
        requests, i = self.requests, self._next
        while i < len(requests) and requests[i].done:
            i += 1
        self._next = i
        return i == len(requests)

    def __getattr__(self, name: str) -> Any:
        requests = self.requests
        return getattr(next((r for r in requests if not r.done), requests[-1]), name)


def _lets_go(waited: Any, token: Any) -> bool:
    """Whether the completion of `token` (a request) ends a wait for `waited`: that request, any of a tuple
    (Waitany), or the last of an `AllOf` (Waitall)."""
    return (waited is token or (type(waited) is tuple and any(t is token for t in waited))
            or (type(waited) is AllOf and waited.all_done()))
