"""The shared state of one simulation: one lock, who waits where, and the collective rendezvous.

Every simulated rank is a thread. A collective is a rendezvous per
(communicator, call number): each member deposits its call and waits until all
members arrived; the last to arrive runs every member's reads and writes and
lets them go (`enter_all`), or each reads the others' buffers and writes its
own, then waits until all have finished reading (`enter`, `leave`), so that a
sender may reuse its buffer as soon as its call returns, as under MPI.

All waiting goes through `World.wait` under the world lock, each waiter asleep
on a lock of its own that the one letting it go releases (`_sleep`, `_wake`):
a completed rendezvous wakes its own members only, so 1,024 ranks do not wake
each other. The world counts the live ranks
and those waiting on something not yet satisfied; when every live rank waits,
nothing can complete, and every waiter raises a DeadlockError that names the
call, the ranks waiting in it, their program lines and where the others are
(spmdsim.runtime.sim.report); so does a rank that polls (Test) for POLL_STALL_S a
request no rank left can complete, or while every other live rank waits, or polls
idly too (`_all_idle`: every rank spins or sleeps in a poll loop, no message moves).
A rank that raises
ends the simulation: a waiter whose collective can no longer complete (a member
gone, or every live rank waiting) raises `Aborted`, the others go on as MPI ranks
would (so an error every rank raises is reported as every rank's) for GO_ON_S
at most (MPI's guard aborts the job by then), and simulate() reports the lowest
failing rank's error.

At most `World.slots` ranks compute at once (the cores, at least 2, at most
32): a rank holds a run slot from its start, gives it to the next rank in
line while it waits in a collective and takes one back before it goes on.
A line that stood still for PATIENCE_S (the ranks holding the slots compute
on) gets slots beyond these, up to MOST_COMPUTING ranks computing, paid back
as ranks give theirs (spmdsim.runtime.sim.sleepers).
The interpreter runs one thread's Python at a time anyway; the cap bounds how
many ranks are inside numpy's BLAS together. OpenBLAS as numpy ships it keeps
per-caller buffers for 64 threads and past about 128 concurrent callers
corrupts its memory ("BLAS : Bad memory unallocation!", then glibc aborts):
256 simulated ranks multiplying at once crashed the process.
"""
from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Optional

from ...base.context import current as _context
from ...base import threads as _threads  # (cores_available read at each call: tests set it)
from ..engines.base import SimulationError
from ...errors import RuntimeMismatchError, exception_text
from .groups import Group
from .landing import EAGER_BYTES
from .rank_threads import THREAD_KEYS, RankThreads, _held_lock, _Joined
from .rank_sleep import real_sleep
from .sleepers import Sleepers
from .report import explain, timed_out
from .waiting import _Waiting, after_the_end

__all__ = ["World", "Aborted", "DeadlockError", "SimulationError", "run_slots"]

#: After a rank fails, how long the others may go on with collectives that can still complete (an error
#: every rank raises is then reported as every rank's): the MPI guard's grace before it aborts the job,
#: so ranks that never again need the failed one (a loop within their own group) stop too.
GO_ON_S = 3.0
LEFT_AFTER_S = 0.5  # World.given_up: after a refusal that ends the run, how long the ranks still running get


#: A rank that polls (Test, Iprobe) a request no rank left can complete (its peer finished), or polls while
#: every other live rank waits and none is released, or while every live rank waits or polls idly (`idle`
#: below) and no message moves, for this long polls forever: a deadlock, as if it waited.
POLL_STALL_S = 2.0

#: A rank that polls in vain (Test, Iprobe, Testany) again and again, less than SPIN_GAP_S apart, for SPIN_S (in
#: its thread's CPU time), naps NAP_S after each such poll: a `while not req.Test(): pass` loop does not spin a
#: core (and hold the interpreter from the ranks that compute what it waits for) for as long as it waits; a
#: message that arrives meanwhile is seen at most NAP_S late. A loop that computes between its polls (SPIN_GAP_S
#: or more) never naps.
SPIN_S = 0.01
SPIN_GAP_S = 0.0005
NAP_S = 0.001

#: A rank polls idly when it polls in vain again less than SPIN_GAP_S of its thread's CPU time and less than this
#: share of POLL_STALL_S (0.5 s) of wall time after its last poll in vain: it spins or sleeps between polls
#: (``while not req.Test(): time.sleep(0.01)``) and computes nothing that it could send. A rank that computes
#: between its polls, or sleeps longer (``time.sleep(3)``, then a send), is not idle, and no rank is reported then.
IDLE_GAP_SHARE = 0.25

MAX_SLOTS = 32  # well inside the 64 callers numpy's OpenBLAS keeps buffers for


def run_slots(size: int) -> int:
    """How many of `size` simulated ranks may compute at once: the cores, at least 2, at most 32."""
    return max(1, min(size, max(2, min(_threads.cores_available(), MAX_SLOTS))))


class DeadlockError(RuntimeMismatchError):
    """Every live simulated rank waits and none can go on (a skipped or mismatched call)."""


class Aborted(BaseException):
    """Raised in a simulated rank when another rank failed: it stops (simulate reports the failure).

    A BaseException so that an ``except Exception`` in user code cannot keep
    the rank running after its peers are gone.
    """


class World(Sleepers, RankThreads):
    """The lock, wakers and live/waiting bookkeeping of one simulation's ranks and their threads (rank_threads)."""

    def __init__(self, size: int, eager_limit: int = EAGER_BYTES) -> None:
        self.size = size
        # A standard Send of fewer bytes is copied and completes at once (spmdsim.runtime.sim.p2p.post_send);
        # a larger one waits for its receive. 0: every one waits, as MPI lets a safe program's (never buffered)
        self.eager_limit = eager_limit
        self.lock = threading.Lock()
        self._wakers = {rank: _held_lock() for rank in range(size)}  # key -> held till woken (`_wake`, `_sleep`)
        self._asleep: set[int] = set()  # keys blocked (or about to block) on their waker, not yet woken
        self.waiting: dict[int, _Waiting] = {}  # rank (or a rank's thread's key) -> what it waits for, until released
        self.live = size  # ranks and the threads they started, until they end
        self.finished: set[int] = set()
        self.failed: dict[int, BaseException] = {}  # rank -> its own (first) exception
        self.failure: Optional[str] = None  # set once: why every waiter stops
        self.failed_at = 0.0  # when (time.monotonic()): the others go on for GO_ON_S at most
        self.stopping = threading.Event()  # set with `failure`: wakes a rank in time.sleep (rank_sleep)
        # when a failure that ends the run came (spmdsim.emulator.unsupported.not_simulated): `given_up`
        self.ends_run_at: Optional[float] = None
        self.deadlock: Optional[str] = None
        self.runs: Any = None  # its ranks, spawned ones too (spmdsim.runtime.sim.rank_runs)
        self.ports: Any = None  # its open ports and published names (spmdsim.emulator.ports)
        self.mismatch: Optional[str] = None  # the first collectives that diverged (groups.Group._mismatch)
        # Whether a rank may have the watchdog on (SPMDSIM_WATCHDOG, or configure() on a rank: Hooks.world):
        # `wait` then reads the waiting rank's setting; False, as most runs, it reads nothing
        self.watched = False
        # every communicator's Group (spmdsim.runtime.sim.p2p.unreceived)
        self.groups: weakref.WeakSet = weakref.WeakSet()
        # id -> (request, call, file, line, group, rank): the program's nonblocking requests not yet completed, in
        # the order posted (requests.noted; group and rank: a nonblocking collective's)
        self.posted: dict[int, tuple] = {}
        # (world rank, post number, text): the program's nonblocking sends whose buffer it wrote into before the
        # send completed (spmdsim.runtime.sim.landing.rewritten)
        self.rewritten: list[tuple] = []
        self.root = Group(self, tuple(range(size)))
        self._init_slots(run_slots(size))  # run slots (spmdsim.runtime.sim.sleepers)
        self.threads: dict[int, int] = {}  # rank -> its thread's ident: its program line (spmdsim.runtime.sim.report)
        self._rank_of_thread: dict[int, int] = {}  # and back
        # rank -> how it exited: "sys.exit(3)" (spmdsim mpirun: a non-zero code), "SystemExit(0)" (simulate)
        self.exits: dict[int, str] = {}
        # rank -> (since when it polls in vain, releases then, the call it polls with: Test, Iprobe, ...)
        self._polls: dict[int, tuple[float, int, str]] = {}
        self.releases = 0  # ranks let go from a wait so far: a poll that sees them rise is not stuck
        # messages queued or matched so far (spmdsim.runtime.sim.p2p): a poll that sees them rise neither
        self.moves = 0
        # rank -> (when it last polled in vain, its thread's CPU time then, whether it polled idly, the request,
        # the call): who polls in a loop that computes nothing (`_all_idle`)
        self._vain: dict[int, tuple[float, float, bool, Any, str]] = {}
        self._spins: dict[int, list] = {}  # rank -> [since when it polls in vain, when its last such poll returned]
        self._init_threads()

    # -- run slots (all with the lock held) --------------------------------------------------

    def start(self, rank: int) -> None:
        """Block `rank`'s thread until it may compute (a run slot), even after another rank failed; after the
        caller's own failure (Ctrl-C, memory: rank -1) raise Aborted: the rank does not begin its program."""
        with self.lock:
            self.threads[rank] = threading.get_ident()
            self._rank_of_thread[self.threads[rank]] = rank
            self._take_slot(rank)
            if -1 in self.failed:
                raise Aborted(self.failure)

    def pause(self, rank: int, token: Any = None, nap: bool = True) -> None:
        """`rank` polls a request that is not done (Test): a rank in line for a slot computes first.

        Without this, ranks spinning on Test for a message from a rank that
        stands in line would hold every slot and never let it in. With the
        request polled (`token`): one that no rank left can complete, polled for
        POLL_STALL_S, is a deadlock (a Test loop for a message never sent). A tight loop of polls in vain
        naps (SPIN_S, NAP_S), unless `nap` is False (a call that is a poll point but mostly not polled in a
        loop: a window's Flush and Unlock).
        """
        with self.lock:
            self.check(rank)
            key = self._key_waiting(rank) if self._extra else rank  # a thread the rank started: its own key
            if token is not None:
                self._watch_poll(key, token)
            if self._queue and rank in self._holding and key == rank:
                self._give_slot(rank)
                self._take_slot(rank)
        if not nap:
            return
        # The thread's own CPU time: a thread the system (or another thread holding the interpreter) keeps
        # waiting a few ms, as on a loaded machine, still polls in a tight loop.
        now = time.thread_time()
        spin = self._spins.get(key)
        if spin is None or now - spin[1] >= SPIN_GAP_S:  # the first poll in vain, or one after other work
            self._spins[key] = [now, now]
            return
        if now - spin[0] >= SPIN_S:  # a tight loop of polls: give the interpreter to the other ranks a while
            real_sleep(NAP_S)
        spin[1] = now

    def _watch_poll(self, key: int, token: Any) -> None:
        """A poll in vain for POLL_STALL_S is a deadlock: of a request no rank left can complete (its peer
        finished), or while every other live rank waits, or while every live rank waits or polls idly
        (`_all_idle`), and no rank has been let go and no message moved since the poll began (the poller's own
        sends, or anything else that moves, start the clock again). `key`: the polling thread's waiter key (its
        rank, or the key of a thread the rank started). A poll whose token is not `definite` (a window's Sync,
        Flush or Unlock: what it waits for is the program's to say) counts only while every live rank waits or
        polls idly."""
        never = getattr(token, "never_completes", None)  # a point-to-point request (spmdsim.runtime.sim.requests)
        if never is None:
            self._polls.pop(key, None)
            self._vain.pop(key, None)
            return
        call = getattr(token, "call", None) or ("Iprobe" if token.kind == "probe" else "Test")
        now, cpu = time.monotonic(), time.thread_time()
        last = self._vain.get(key)
        idle = last is not None and cpu - last[1] < SPIN_GAP_S and now - last[0] < POLL_STALL_S * IDLE_GAP_SHARE
        self._vain[key] = (now, cpu, idle, token, call)
        alone = key not in self.waiting and len(self.waiting) >= self.live - 1 and getattr(token, "definite", True)
        gone = never(self)
        if not (alone or gone or (idle and self._all_idle(now))):
            self._polls.pop(key, None)
            return
        moved = self.releases + self.moves
        since, seen, _ = self._polls.get(key, (now, moved, call))
        if seen != moved:  # a rank was let go or a message moved meanwhile: progress, start again
            since, seen = now, moved
        self._polls[key] = (since, seen, call)  # the call it polls with last (a loop may make several)
        if now - since < POLL_STALL_S:
            return
        if self.deadlock is None and self.failure is None:
            why = ("" if gone else "while every other live rank waits" if alone else
                   "while every other live rank waits or polls in vain")
            self.deadlock = explain(self, (key, token, why, call))
        self._wake_all()
        self.check(self.rank_of(key))

    def _all_idle(self, now: float) -> bool:
        """Whether every live rank (and thread a rank started) waits or polls idly now (world lock held): each poller's
        last poll in vain came after no computing (SPIN_GAP_S of CPU time) and less than the idle share of POLL_STALL_S
        ago. A rank that computes, sleeps long, or stands in line for a run slot counts as one that may yet send."""
        waiting = self.waiting
        idle = 0
        for key, (last, _, was_idle, _, _) in self._vain.items():
            if key in waiting or not self._lives(key):
                continue
            if not was_idle or now - last >= POLL_STALL_S * IDLE_GAP_SHARE:
                return False
            idle += 1
        return len(waiting) + idle >= self.live

    def _lives(self, key: int) -> bool:
        """Whether waiter `key` (a rank, or a thread a rank started) has not ended (world lock held)."""
        return key not in self.finished if key < THREAD_KEYS else key in self._extra

    def idle_polls(self) -> list[tuple[int, Any, str]]:
        """(key, request, call) of the ranks (and threads ranks started, by their keys) that poll idly now, but
        for those that wait (world lock held): the others a report of every rank polling names."""
        now = time.monotonic()
        return [(key, token, call) for key, (last, _, idle, token, call) in sorted(self._vain.items())
                if idle and key not in self.waiting and self._lives(key)
                and now - last < POLL_STALL_S * IDLE_GAP_SHARE]

    def polling(self) -> dict[int, str]:
        """The ranks that poll a request in vain now (themselves or a thread they started), each with its call
        (Test, Iprobe, Testany) (world lock held), for the deadlock report."""
        found = {self.rank_of(key): call for key, _, call in self.idle_polls()}
        found.update((self.rank_of(key), call) for key, (_, _, call) in self._polls.items() if self._lives(key))
        return found

    # -- waiting (all with the lock held) --------------------------------------------------

    def check(self, rank: int, group: Optional[Group] = None) -> None:
        """Raise in `rank` if the simulation is over (another rank failed, or a deadlock).

        With `group`, the communicator of the collective `rank` is in: after a failure it goes
        on while the collective can still complete (`_may_go_on`).
        """
        if self.deadlock is not None:
            raise DeadlockError(self.deadlock)
        if self.failure is not None and not self._may_go_on(group):
            raise Aborted(self.failure)

    def _may_go_on(self, group: Optional[Group]) -> bool:
        """After a failure, may a rank in `group`'s collective go on? While every member lives and
        not every live rank waits: as MPI ranks do, so that an error every rank raises (a check after
        an Allreduce) is reported as every rank's, not as the first one's. A failure of the caller's
        own (Ctrl-C, memory: rank -1) stops every rank.
        """
        if group is None or -1 in self.failed or self.ends_run_at is not None or len(self.waiting) >= self.live:
            return False  # (a failure that ends the run, MPI_Abort's: at once, as MPI kills every process)
        if time.monotonic() - self.failed_at > GO_ON_S:  # as MPI's guard, which aborts the job by then
            return False
        return not any(m in self.failed or m in self.finished for m in group.members)

    def sleep_ends(self) -> bool:
        """After a failure, whether a rank in time.sleep stops now (rank_sleep): at once on the caller's own
        (Ctrl-C, memory: rank -1) or one that ends the run (MPI_Abort), else once GO_ON_S have passed, as a rank
        on its way to a collective goes on."""
        return -1 in self.failed or self.ends_run_at is not None or time.monotonic() - self.failed_at > GO_ON_S

    def wait(self, rank: int, what: _Waiting) -> None:
        """Block `rank` until another rank releases it; raise when nothing can release it, or, with the
        waiting rank's watchdog on (SPMDSIM_WATCHDOG), when nothing released it within its limit (`_watch`)."""
        if self.live <= 0:  # every rank ended: simulate returned their communicator, used after it
            raise SimulationError(after_the_end(what, rank))
        key = self._rank_of_thread.get(threading.get_ident(), rank)  # a thread the rank started: its own key
        if key != rank and self.rank_of(key) != rank:
            # Another rank's thread waits as `rank`: it holds rank `rank`'s communicator (one made where the
            # ranks share it, as a module every rank imports once), and the two would wait as one forever.
            raise SimulationError(f"simulated rank {self.rank_of(key)} waits in {what.text()} as rank {rank}, on "
                                  f"rank {rank}'s communicator: each rank must use its own (MPI.COMM_WORLD read "
                                  f"in the rank, not kept where the ranks share it)")
        # The rank's watchdog, read before it counts as waiting (a bad SPMDSIM_WATCHDOG raises here); a join of a
        # thread is the program's own wait, not MPI's, and is never timed
        limit = None if not self.watched or type(what.token) is _Joined else _context().hooks.watchdog_seconds()
        waiting = self.waiting
        waiting[key] = what
        if len(waiting) >= self.live:
            self._declare_deadlock()
        if key in self._holding:
            self._give_slot(key)  # another rank computes while this one waits (a rank's other threads hold none)
        if limit is None:
            while (key in waiting and self.deadlock is None
                   and (self.failure is None or self._may_go_on(what.group))):
                self._sleep(key)
        else:
            self._watch(rank, key, what, limit)
        if waiting.pop(key, None) is not None:  # woken by a failure, not released
            self.check(rank)
        if key == rank:
            self._await_slot(rank)  # `release` lined it up

    def _watch(self, rank: int, key: int, what: _Waiting, limit: float) -> None:
        """`wait`'s sleep with the watchdog on: past `limit` seconds still waiting (no deadlock, no failure)
        the rank fails with a RuntimeMismatchError naming what it waits in and where the others are, and the
        run ends as MPI's watchdog ends the job: the other ranks stop at their next wait, and simulate() leaves
        those that never reach one after LEFT_AFTER_S (a rank stuck in a loop)."""
        waiting = self.waiting
        deadline = time.monotonic() + limit
        while key in waiting and self.deadlock is None and (self.failure is None or self._may_go_on(what.group)):
            left = deadline - time.monotonic()
            if left > 0:
                self._nap(key, left)
                continue
            if self.failure is not None:
                return  # another rank failed meanwhile: `wait` stops this one (Aborted)
            exc = RuntimeMismatchError(timed_out(self, key, what, limit))
            exc.spmdsim_ends_run = True  # type: ignore[attr-defined]
            del waiting[key]
            self._fail(rank, exc)  # now, not where it is caught: a thread a rank started ends quietly
            raise exc

    # -- the end of a rank -------------------------------------------------------------------

    def fail(self, rank: int, exc: BaseException) -> None:
        """Rank `rank` raised `exc`: every other rank stops at its next wait."""
        with self.lock:
            self._fail(rank, exc)

    def _fail(self, rank: int, exc: BaseException) -> None:
        """`fail` with the world lock held."""
        self.failed.setdefault(rank, exc)
        if self.ends_run_at is None and getattr(exc, "spmdsim_ends_run", False):
            self.ends_run_at = time.monotonic()
        if self.failure is None:
            self.failure = f"simulated rank {rank} failed: {type(exc).__name__}: {exception_text(exc)}"
            self.failed_at = time.monotonic()
            self.stopping.set()
        self._wake_all()

    def given_up(self) -> bool:
        """Whether LEFT_AFTER_S have passed since a failure that ends the run (a call spmdsim does not simulate:
        the ranks still running then wait outside MPI, for what the refused call would have done; the watchdog,
        which ends the job under MPI: a rank stuck in a loop never reaches a wait): those still running are left
        (those in a call of MPI's stop at once, as after any failure)."""
        return self.ends_run_at is not None and time.monotonic() - self.ends_run_at > LEFT_AFTER_S

    def finish(self, rank: int) -> None:
        """Rank `rank` returned (or raised); if all the others wait, none of them can go on. A rank that returns
        after a deadlock or diverging collectives (its program caught the error) fails with it: the run ends so,
        as MPI hangs there."""
        with self.lock:
            ended = self.deadlock or self.mismatch
            if ended is not None and self.failure is None:
                self._fail(rank, (DeadlockError if self.deadlock else RuntimeMismatchError)(ended))
            self.live -= 1
            self.finished.add(rank)
            self._vain.pop(rank, None)
            self._give_slot(rank)
            if self.waiting and len(self.waiting) >= self.live:
                self._declare_deadlock()
            elif self.failure is not None:
                self._wake_all()  # a waiter whose collective needed this rank stops

    def _declare_deadlock(self) -> None:
        if self.deadlock is None and self.failure is None:
            self.deadlock = explain(self)
        self._wake_all()
