"""A window's synchronization (spmdsim.emulator.window): Fence, Start/Complete, Post/Wait/Test, Lock/Unlock,
Lock_all/Unlock_all, Flush and Sync, each wait going through the simulation's engine, and what a rank that
polls a window reports when nothing can end its loop."""
from __future__ import annotations

from typing import Any, Optional

from ..runtime.sim._mpi import mpi_error, special
from ..runtime.sim.engine import _Waiting
from ..runtime.sim.waiting import ranks_text
from .group import _sim as _sim_group
from ..runtime.sim.report import places
from .window_state import _Shared, _may_lock, _mpi, _release_all, _take_lock


class WindowSynchronization:
    """SimWin's synchronization calls (a mixin; `self._shared`, `self._access`: the window's state)."""

    def Fence(self, assertion: int = 0) -> None:
        """End the fence epoch and start the next (collective: a barrier of the window's group);
        MPI.MODE_NOSUCCEED: no epoch follows."""
        self._live()
        assertion = int(assertion)
        self._end_fence_epoch()
        self._access.fence = not assertion & _mpi().MODE_NOSUCCEED

    def _end_fence_epoch(self) -> None:
        """A Fence's barrier, where the last member to arrive does every member's operations kept in the epoch
        it ends, in rank order (no member reads its window meanwhile: each is in this Fence), so that each sees
        them all done when its Fence returns."""
        pending, self._access.pending = tuple(self._access.pending), []

        def complete(slot: Any) -> None:
            for call in slot.calls:
                for operation in call.data or ():
                    operation()
        self._comm._enter("barrier", ("barrier",), pending, complete)

    def Start(self, group: Any, assertion: int = 0) -> None:
        """Open an access epoch to the members of `group`, once each has posted one to this member."""
        shared = self._live()
        targets = self._members_of(group)
        me = self._comm._me
        self.done_fenced()  # (a fence epoch that Start ends)

        def consume() -> None:
            for t in targets:
                shared.posts[(t, me)] -= 1

        self._until(lambda: all(shared.posts.get((t, me), 0) for t in targets), "Win.Start", then=consume)
        self._access.started, self._access.fence = targets, False

    def Complete(self) -> None:
        """End Start's access epoch: its targets' Wait may return."""
        shared = self._live()
        targets = self._access.started
        if targets is None:
            raise mpi_error(_mpi(), _mpi().ERR_RMA_SYNC, "Complete without a Start")
        me = self._comm._me
        world = self._comm._group.world
        with world.lock:
            for t in targets:
                shared.completes[(t, me)] = shared.completes.get((t, me), 0) + 1
            _release_all(world, shared)
        self._access.started = None

    def Post(self, group: Any, assertion: int = 0) -> None:
        """Expose this member's window to the members of `group` (each one's Start may return)."""
        shared = self._live()
        origins = self._members_of(group)
        me = self._comm._me
        world = self._comm._group.world
        self.done_fenced()
        with world.lock:
            for o in origins:
                shared.posts[(me, o)] = shared.posts.get((me, o), 0) + 1
            _release_all(world, shared)
        self._access.posted, self._access.fence = origins, False

    def Wait(self) -> None:
        """End Post's exposure epoch once every origin in its group has called Complete."""
        shared = self._live()
        origins = self._posted()
        me = self._comm._me
        self._until(lambda: all(shared.completes.get((me, o), 0) for o in origins), "Win.Wait",
                    then=lambda: self._met(origins))

    def Test(self) -> bool:
        """Wait's test: True (and the exposure epoch ended) once every origin has called Complete."""
        shared = self._live()
        origins = self._posted()
        me = self._comm._me
        world = self._comm._group.world
        with world.lock:
            missing = [o for o in origins if not shared.completes.get((me, o), 0)]
            if not missing:
                self._met(origins)
        if missing:  # a loop of Tests no origin's Complete can end is a deadlock report (World.pause)
            world.pause(self.world_rank, _WinPoll(self, "Win.Test", tuple(missing)))
        return not missing

    def _posted(self) -> tuple:
        if self._access.posted is None:
            raise mpi_error(_mpi(), _mpi().ERR_RMA_SYNC, "Wait without a Post")
        return self._access.posted

    def _met(self, origins: tuple) -> None:
        """Wait's end: one Complete of each origin met (world lock held)."""
        me = self._comm._me
        for o in origins:
            self._shared.completes[(me, o)] -= 1
        self._access.posted = None

    def Lock(self, rank: int, lock_type: Any = None, assertion: int = 0) -> None:
        """Lock member `rank`'s window: MPI.LOCK_EXCLUSIVE (the default) waits until no other member holds
        a lock on it, MPI.LOCK_SHARED until none holds an exclusive one. MPI.MODE_NOCHECK: no wait."""
        shared = self._live()
        mpi = _mpi()
        rank = int(rank)
        lock_type = mpi.LOCK_EXCLUSIVE if lock_type is None else int(lock_type)
        if lock_type not in (mpi.LOCK_EXCLUSIVE, mpi.LOCK_SHARED):
            raise mpi_error(mpi, mpi.ERR_LOCKTYPE, f"Lock: lock type {lock_type} is not MPI.LOCK_EXCLUSIVE or "
                                                   f"MPI.LOCK_SHARED")
        if rank == special("PROC_NULL"):
            return
        if not 0 <= rank < len(shared.memories):
            raise mpi_error(mpi, mpi.ERR_RANK, f"Lock: rank {rank} is not in the window's group of "
                                               f"{len(shared.memories)}")
        if rank in self._access.locked:
            raise mpi_error(mpi, mpi.ERR_RMA_SYNC, f"Lock: this rank holds a lock on rank {rank} already")
        self.done_fenced()
        self._access.fence = False  # a fence epoch ends where a lock epoch begins (MPICH: no Put after it)
        if int(assertion) & mpi.MODE_NOCHECK:
            self._access.locked[rank] = None
            return
        exclusive = lock_type == mpi.LOCK_EXCLUSIVE
        self._lock_in_turn(shared, rank, exclusive, f"Win.Lock of rank {rank}")
        self._access.locked[rank] = lock_type

    def Unlock(self, rank: int) -> None:
        """Release the lock on member `rank` (its operations are complete already)."""
        shared = self._live()
        rank = int(rank)
        if rank == special("PROC_NULL"):
            return
        if rank not in self._access.locked:
            raise mpi_error(_mpi(), _mpi().ERR_RMA_SYNC, f"Unlock: this rank holds no lock on rank {rank}")
        if self._access.locked.pop(rank) is not None:
            self._drop_lock(shared, rank)
        self._poll("Win.Unlock", nap=False)  # a loop of Lock and Unlock waiting for another rank's update lets
        # that rank run

    def Lock_all(self, assertion: int = 0) -> None:
        """A shared lock on every member's window."""
        shared = self._live()
        if self._access.lock_all:
            raise mpi_error(_mpi(), _mpi().ERR_RMA_SYNC, "Lock_all: this rank holds Lock_all already")
        self.done_fenced()
        self._access.fence = False
        if not int(assertion) & _mpi().MODE_NOCHECK:
            for rank in range(len(shared.memories)):
                self._lock_in_turn(shared, rank, False, f"Win.Lock_all (rank {rank})")
        self._access.lock_all = "checked" if not int(assertion) & _mpi().MODE_NOCHECK else "nocheck"

    def Unlock_all(self) -> None:
        shared = self._live()
        held, self._access.lock_all = self._access.lock_all, False
        if not held:
            raise mpi_error(_mpi(), _mpi().ERR_RMA_SYNC, "Unlock_all without a Lock_all")
        if held == "checked":
            for rank in range(len(shared.memories)):
                self._drop_lock(shared, rank)
        self._poll("Win.Unlock_all", nap=False)

    def _lock_in_turn(self, shared: _Shared, rank: int, exclusive: bool, what: str) -> None:
        """Take a lock on member `rank`'s window once it may be taken and the members that asked before this
        one have theirs: in the order they asked, as a fair lock grants it. A member that unlocks and locks
        again at once does not take the lock before one that waits for it (else mpi4py's nxtval-scalable demo
        can run forever: two ranks' mutex loops, one always locking again first, the other's increment never
        undone)."""
        me = self._comm._me
        world = self._comm._group.world
        with world.lock:
            line = shared.lock_lines.setdefault(rank, [])
            line.append(me)

        def take() -> None:
            _take_lock(shared, rank, me, exclusive)
            line.remove(me)
            _release_all(world, shared)  # the next in line may take a shared lock beside this one

        try:
            self._until(lambda: line[0] == me and _may_lock(shared, rank, exclusive), what, then=take)
        except BaseException:  # stopped while in line (another rank failed): leave the line
            with world.lock:
                if me in line:
                    line.remove(me)
            raise

    def _drop_lock(self, shared: _Shared, rank: int) -> None:
        me = self._comm._me
        world = self._comm._group.world
        with world.lock:
            state = shared.locks[rank]
            if state[0] == me:
                state[0] = None
            else:
                state[1][me] -= 1
                if not state[1][me]:
                    del state[1][me]
            _release_all(world, shared)

    def Flush(self, rank: int) -> None:
        """Complete this member's operations on `rank` (each is complete when its call returns): a poll
        point (a rank in line for a run slot computes first: a loop of Get and Flush waiting for another
        rank's Put lets that rank run)."""
        self._poll("Win.Flush", nap=False)

    def Flush_all(self) -> None:
        self._poll("Win.Flush_all", nap=False)

    def Flush_local(self, rank: int) -> None:
        self._poll("Win.Flush_local", nap=False)

    def Flush_local_all(self) -> None:
        self._poll("Win.Flush_local_all", nap=False)

    def Sync(self) -> None:
        """The public and private copies agree (one copy: MPI.WIN_UNIFIED); a poll point as Test is, where a
        loop that reads its window until another rank writes it (``while mem[0] == 0: win.Sync()``) naps
        after a while (spmdsim.runtime.sim.engine: SPIN_S) instead of spinning a core."""
        self._poll("Win.Sync", nap=True)

    def _poll(self, call: str, nap: bool) -> None:
        """A poll point (`call`: the program's call): a rank in line for a run slot computes first, and a loop of
        these that no write into a window ends, while every other rank waits or polls idly, is a deadlock
        report (World.pause, _WinPoll)."""
        self._live()
        self._comm._group.world.pause(self.world_rank, _WinPoll(self, call), nap=nap)

    def _members_of(self, group: Any) -> tuple:
        """The window ranks of `group`'s members (world ranks)."""
        members = self._comm._group.members
        sim = _sim_group(group)._live()
        out = []
        for w in sim._members:
            if w not in members:
                raise mpi_error(_mpi(), _mpi().ERR_GROUP, f"rank {w} of the group is not in the window's group")
            out.append(members.index(w))
        return tuple(out)

    def _until(self, ready: Any, what: str, then: Any = None) -> None:
        """Wait (through the engine) until `ready()` holds, then run `then()`, both under the world lock."""
        shared = self._shared
        world = self._comm._group.world
        rank = self.world_rank
        token = object()
        with world.lock:
            while True:
                world.check(rank)
                if ready():
                    shared.waiters.pop(rank, None)
                    if then is not None:
                        then()
                    return
                shared.waiters[rank] = token
                world.wait(rank, _Waiting(what, self._comm._group, None, token=token))


class _WinPoll:
    """What a rank polls a window with, for World.pause (spmdsim.runtime.sim.engine), which reports a loop of polls in
    vain as a request's: ``Win.Test`` waits for the Complete of the origins in `missing` (window ranks), and no
    rank left completes it once they all finished (`definite`: reported too while every other rank waits, as a
    request's Test); ``Sync``, ``Flush*`` and ``Unlock*`` wait for what the program's loop reads, which only a
    write into a window can change (`SimWin._moved`): reported only while every live rank waits or polls idly."""

    __slots__ = ("group", "me", "call", "missing", "definite")
    kind = "window"

    def __init__(self, win: WindowSynchronization, call: str, missing: Optional[tuple] = None) -> None:
        self.group, self.me, self.call = win._comm._group, win._comm._me, call
        self.missing, self.definite = missing, missing is not None

    def _what(self) -> str:
        if self.missing is None:
            return "a window's memory"
        return f"a window's exposure epoch (the Complete of {_names(self.group, self.missing)})"

    def why_stuck(self, world: Any) -> tuple[str, str]:
        """Where the origins whose Complete a Win.Test waits for are (those that wait have their own clause)."""
        if self.missing is None:
            return "", ""
        ranks = [self.group.members[o] for o in self.missing]
        return places(world, [r for r in ranks if r not in world.waiting]), ""

    def never_completes(self, world: Any) -> bool:
        """Whether every origin a Win.Test waits for has finished (world lock held)."""
        return self.missing is not None and all(self.group.members[o] in world.finished for o in self.missing)


def _names(group: Any, ranks: tuple) -> str:
    """'rank 1', 'ranks 1-3', or on a communicator other than the world 'group ranks 0-2 (world ranks 4-6)'."""
    if group.members == tuple(range(group.world.size)):
        return ranks_text(ranks)
    return f"group {ranks_text(ranks)} (world {ranks_text([group.members[r] for r in ranks])})"
