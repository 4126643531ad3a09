"""How a simulated rank sleeps and is woken under the world lock (`_sleep`, `_wake`), is let go from a wait
(`release`), and takes turns for a run slot (`_line_up`, `_give_slot`): the part of
spmdsim.runtime.sim.engine.World that hands the interpreter from one rank's thread to the next."""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Optional

from .groups import Group, _lets_go


class Sleepers:
    """World's sleeping, waking and run slots (its state: `lock`, `_wakers`, `_asleep`, `waiting`, `_free`,
    `_queue`, `_granted`, `_holding`, set by World.__init__)."""

    def _take_slot(self, rank: int) -> None:
        self._line_up(rank)
        self._await_slot(rank)

    def _line_up(self, rank: int) -> None:
        """Grant `rank` a free run slot, or put it in line for one (`_give_slot` grants it later)."""
        if self._free and not self._queue:
            self._free -= 1
            self._granted.add(rank)
            self._wake(rank)  # for a rank released while it waits in `wait`
        else:
            self._queue.append(rank)

    def _await_slot(self, rank: int) -> None:
        """Block until `rank` holds its granted slot.

        A failure elsewhere does not stop a rank in line: like an MPI rank, it runs on to its
        next wait (a rank that raises what the others raised is reported with them).
        """
        while rank not in self._granted:
            self._sleep(rank)
        self._granted.discard(rank)
        self._holding.add(rank)

    @contextlib.contextmanager
    def stepped_aside(self, rank: int) -> Iterator[None]:
        """Within this block `rank`'s own thread computes nothing (it sleeps: spmdsim.runtime.sim.rank_sleep): the
        next rank in line takes its run slot, and it takes one back, in line, as the block ends."""
        with self.lock:
            gave = rank in self._holding and self.threads.get(rank) == threading.get_ident()
            if gave:
                self._give_slot(rank)
        try:
            yield
        finally:
            if gave:
                with self.lock:
                    self._take_slot(rank)

    def _give_slot(self, rank: int) -> None:
        if rank not in self._holding:
            return
        self._holding.discard(rank)
        if self._queue:
            nxt = self._queue.popleft()
            self._granted.add(nxt)
            self._wake(nxt)
        else:
            self._free += 1

    def release(self, rank: int, token: Any = None, group: Optional[Group] = None) -> None:
        """Let `rank` go on if it waits (for `token`'s request, when given; else in `group`'s collective):
        with a free run slot now, else in line for one, woken only when it gets one.

        Waking every member of a collective at once to queue for the few run slots put 1,024 threads
        through the lock twice per call (docs/howto/simulate.md, "Limits").
        """
        if self._extra:  # ranks run threads of their own: find the one that waits for this
            self._release_matching(rank, token, group)
            return
        what = self.waiting.get(rank)
        if what is not None and (token is None or what.token is token or _lets_go(what.token, token)):
            del self.waiting[rank]
            self.releases += 1
            self._line_up(rank)

    def release_members(self, group: Group, me: int) -> None:
        """`release` every member of `group`'s collective but member `me` (the last to arrive)."""
        members = group.members
        if self._extra:
            for i, rank in enumerate(members):
                if i != me:
                    self._release_matching(rank, None, group)
            return
        waiting = self.waiting
        for i, rank in enumerate(members):
            if i != me and waiting.pop(rank, None) is not None:
                self.releases += 1
                self._line_up(rank)

    _lets_go = staticmethod(_lets_go)  # for RankThreads._release_matching

    def _sleep(self, key: int) -> None:
        """Block the calling thread (waiter `key`, world lock held) until `_wake(key)`; return with the lock held.

        A plain lock per waiter, held until the waker releases it: a threading.Condition allocated a lock and
        went through five Python calls per wait, and each arrival in a rendezvous waits once.
        """
        lock = self.lock
        self._asleep.add(key)
        lock.release()
        try:
            self._wakers[key].acquire()
        except BaseException:  # interrupted (a signal in the main thread): leave the waker held, not asleep
            lock.acquire()
            if key in self._asleep:
                self._asleep.discard(key)
            else:  # woken meanwhile: take the wake back
                self._wakers[key].acquire(False)
            raise
        lock.acquire()

    def _nap(self, key: int, seconds: float) -> None:
        """`_sleep` for at most `seconds` (the watchdog's wait): woken or not, return with the lock held and the
        waker held again."""
        lock = self.lock
        self._asleep.add(key)
        lock.release()
        try:
            woken = self._wakers[key].acquire(True, seconds)
        except BaseException:
            woken = False
            raise
        finally:
            lock.acquire()
            if not woken:
                if key in self._asleep:
                    self._asleep.discard(key)
                else:  # woken after the timeout, before the lock: take the wake back
                    self._wakers[key].acquire(False)

    def _wake(self, key: int) -> None:
        """Let waiter `key` return from `_sleep` (world lock held); nothing if it does not sleep."""
        if key in self._asleep:
            self._asleep.discard(key)
            self._wakers[key].release()

    def _wake_all(self) -> None:
        for key in list(self._asleep):
            self._wake(key)
