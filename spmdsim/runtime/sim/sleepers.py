"""How a simulated rank sleeps and is woken under the world lock (`_sleep`, `_wake`), is let go from a wait
(`release`), and takes turns for a run slot (`_line_up`, `_give_slot`, `overdraw`): the part of
spmdsim.runtime.sim.engine.World that hands the interpreter from one rank's thread to the next.

A rank gives its slot away only when it enters an MPI call, sleeps or ends, so ranks that compute long
between calls keep the ranks in line from starting: 3 ranks looping 30 s held back a 4th rank's print and
``Abort``, which under mpiexec come at once. When the line has not moved for PATIENCE_S (no rank in it got a
slot), every rank in it gets one anyway, an overdraft (`overdraw`, which simulate()'s thread calls as it
watches the ranks): those ranks compute beside the others, the interpreter sharing the CPU among them, up to
MOST_COMPUTING ranks at once. Each slot a rank gives away while ranks are overdrawn pays one back, so the
count of ranks computing settles back to `slots` as they reach their MPI calls. A rank in line is not
waiting (a deadlock report counts it as one that may yet go on), overdrawn or not.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from typing import Any, Iterator, Optional

from .groups import Group, _lets_go

#: How long the line for a run slot may stand still (no rank in it given a slot) before every rank in it
#: gets one anyway: a program's first lines come this late (and up to a look of simulate()'s thread, every
#: 0.2 s, later), where ranks starting a long computation held every slot until they ended. Above the longest
#: the line stood still in programs that do not starve it: one look, 0.2-0.4 s (docs/howto/simulate.md).
PATIENCE_S = 0.5

#: The most ranks that compute at once, overdrafts included: numpy's OpenBLAS keeps per-caller buffers
#: for 64 threads, and past about 128 callers at once corrupted its memory (spmdsim.runtime.sim.engine).
MOST_COMPUTING = 64


class Sleepers:
    """World's sleeping, waking and run slots (its state: `lock`, `_wakers`, `_asleep`, `waiting`, set by
    World.__init__, and the slots' own, set by `_init_slots`)."""

    def _init_slots(self, slots: int) -> None:
        """`slots` ranks compute at once (spmdsim.runtime.sim.engine.run_slots), none yet."""
        self.slots = slots
        self._free = slots  # how many more ranks may compute now
        self._queue: deque = deque()  # who waits for a slot, in order
        self._granted: set[int] = set()  # given a slot, not yet woken to take it
        self._holding: set[int] = set()
        self._overdrawn = 0  # slots given beyond `slots` (`overdraw`), not yet given back
        self._handed = 0  # slots given to the line so far: whether it moved
        self._stood = (time.monotonic(), 0)  # (since when the line stands still, `_handed` then)

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
        if self._overdrawn:
            self._overdrawn -= 1  # paid back: the count of ranks computing settles back to `slots`
        elif self._queue:
            nxt = self._queue.popleft()
            self._handed += 1
            self._granted.add(nxt)
            self._wake(nxt)
        else:
            self._free += 1

    def overdraw(self, now: float) -> int:
        """Give every rank in line a slot beyond `slots` if the line has stood still for PATIENCE_S (`now`:
        time.monotonic()), up to MOST_COMPUTING ranks computing; return how many got one. Called now and then
        (simulate()'s thread, every few tenths of a second), without the world lock."""
        with self.lock:
            since, handed = self._stood
            if not self._queue or handed != self._handed:  # empty, or moving: it stands still from now on
                self._stood = (now, self._handed)
                return 0
            if now - since < PATIENCE_S:
                return 0
            room = MOST_COMPUTING - (self.slots - self._free + self._overdrawn)
            given = 0
            while self._queue and given < room:
                nxt = self._queue.popleft()
                self._granted.add(nxt)
                self._wake(nxt)
                given += 1
            self._overdrawn += given
            self._stood = (now, self._handed)
            return given

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
