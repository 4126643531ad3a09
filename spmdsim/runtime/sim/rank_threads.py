"""Threads a simulated rank starts, waiting in MPI calls beside it (MPI_THREAD_MULTIPLE, which MPICH gives).

A World (spmdsim.runtime.sim.engine) keys its waiters by rank: the rank's own thread
waits as its rank number. A thread the rank starts (spmdsim.emulator.rank_threads
registers it) gets a key of its own, from THREAD_KEYS up (above every rank, spawned ones too), owned by that rank: it is
live from its start to its end, waits under its key with a waker of its
own (a held lock), holds no run slot (it computes beside its rank), and is released by what
it waits for (its request, or the collective of its communicator). So every
live thread is counted, and a deadlock is still every live thread waiting.
A rank's thread that joins another of its threads waits as well (`join`), and
a rank's end waits for its threads that are no daemons (`join_all`), as
Python's exit does; so a join that cannot end is named in the report.

Mixed into World; every method here runs with the world lock held unless it says
otherwise. Without threads of their own (`_extra` empty) the World's paths are
the ones of one thread per rank.
"""
from __future__ import annotations

import threading
from typing import Any

from .waiting import _Waiting

__all__ = ["RankThreads", "THREAD_KEYS"]

#: The first waiter key of a thread a rank starts: every key below it is a rank's (the world's, then those spawned).
THREAD_KEYS = 1 << 24


class _Joined:
    """What a join waits for: the thread of key `key` (the deadlock report says which rank's)."""

    __slots__ = ("key", "rank", "at_end", "kind", "group")

    def __init__(self, key: int, rank: int, at_end: bool) -> None:
        self.key, self.rank, self.at_end = key, rank, at_end
        self.kind, self.group = "join", None

    def _what(self) -> str:
        if self.at_end:
            return f"the end of rank {self.rank}, which waits for a thread it started (as Python's exit does)"
        return f"join of a thread of rank {self.rank}"


def _held_lock() -> Any:
    """A waiter's waker (spmdsim.runtime.sim.engine.World._sleep): a lock held until the waiter is woken."""
    lock = threading.Lock()
    lock.acquire()
    return lock


class RankThreads:
    """A World's bookkeeping of the threads its ranks start (see the module docstring)."""

    def _init_threads(self) -> None:
        self._extra: dict[int, int] = {}  # key -> the rank that started the thread, while it lives
        self._extra_of: dict[int, list] = {}  # rank -> its live threads' keys
        self._next_key = THREAD_KEYS
        self._daemons: set = set()  # keys of daemon threads (a rank's end does not wait for them)
        self._ended: dict[int, int] = {}  # key -> rank of the threads that ended (a late report names them)

    def rank_of(self, key: int) -> int:
        """The rank a waiter key belongs to (its own number for a rank's thread)."""
        return key if key < THREAD_KEYS else self._extra.get(key, self._ended.get(key, -1))

    # -- a thread's life -------------------------------------------------------------------------

    def add_thread(self, rank: int, daemon: bool = False) -> int:
        """Count a thread rank `rank` is starting as live (before it starts: its rank may wait at once);
        return its key."""
        with self.lock:
            key = self._next_key
            self._next_key += 1
            self._extra[key] = rank
            self._extra_of.setdefault(rank, []).append(key)
            self._wakers[key] = _held_lock()
            if daemon:
                self._daemons.add(key)
            self.live += 1
            return key

    def enter_thread(self, key: int) -> None:
        """The thread of `key` runs: its frames are its program line in a report."""
        with self.lock:
            ident = threading.get_ident()
            self.threads[key] = ident
            self._rank_of_thread[ident] = key

    def end_thread(self, key: int) -> None:
        """The thread of `key` ended (or never started): no longer live; its joiners go on."""
        with self.lock:
            rank = self._extra.pop(key, None)
            if rank is None:
                return
            self._ended[key] = rank
            self._extra_of[rank].remove(key)
            self._daemons.discard(key)
            self._rank_of_thread.pop(self.threads.pop(key, None), None)
            self._wakers.pop(key, None)
            self._asleep.discard(key)
            for polls in (self._vain, self._polls, self._spins):  # its polls in vain (World.pause)
                polls.pop(key, None)
            self.live -= 1
            stopped = self.deadlock is not None or self.failure is not None  # it ended because of that:
            for waiter, what in list(self.waiting.items()):  # its joiners stop too, as they wake
                if isinstance(what.token, _Joined) and what.token.key == key and not stopped:
                    self._let_go(waiter)
            if self.waiting and len(self.waiting) >= self.live:
                self._declare_deadlock()

    def join(self, key: int, at_end: bool = False) -> None:
        """Wait (as the calling thread) until the thread of `key` ended: a wait the deadlock report names."""
        with self.lock:
            rank = self._extra.get(key)
            if rank is None:
                return
            me = self._rank_of_thread.get(threading.get_ident())
            if me is None:
                return
            self.check(self.rank_of(me))
            self.wait(self.rank_of(me), _waiting_for(_Joined(key, rank, at_end)))

    def join_all(self, rank: int) -> None:
        """At the end of `rank`'s own thread: wait for the threads it started that are no daemons."""
        while self._extra:
            with self.lock:
                keys = [k for k in self._extra_of.get(rank, ()) if k not in self._daemons]
            if not keys:
                return
            self.join(keys[0], at_end=True)

    # -- waiting and releasing with threads of their own --------------------------------------------

    def _key_waiting(self, rank: int) -> int:
        """The waiter key of the calling thread, which waits as `rank` (its own rank's number, or the key
        of a thread that rank started)."""
        key = self._rank_of_thread.get(threading.get_ident())
        return rank if key is None else key

    def _release_matching(self, rank: int, token: Any, group: Any) -> None:
        """`release` when ranks have threads of their own: let go the one of `rank`'s threads that waits
        for `token` (a request), or without a token in `group`'s collective."""
        for key in (rank, *self._extra_of.get(rank, ())):
            what = self.waiting.get(key)
            if what is None:
                continue
            if token is None:
                found = what.token is None and (group is None or what.group is group)
            else:
                found = self._lets_go(what.token, token)
            if found:
                self._let_go(key)
                return

    def _let_go(self, key: int) -> None:
        del self.waiting[key]
        self.releases += 1
        if key < THREAD_KEYS:
            self._line_up(key)
        else:
            self._wake(key)


def _waiting_for(joined: _Joined) -> Any:
    return _Waiting(joined._what(), None, None, token=joined)
