"""A one-sided window's state (spmdsim.emulator.window): what its members share (memory, locks, post and
complete counts), each member's own access epochs, what copies of its handle share, and the locks' rules."""
from __future__ import annotations

import threading
from typing import Any, Optional


def _mpi() -> Any:
    from mpi4py import MPI

    return MPI


class _Shared:
    """What the members of one window share: each member's memory (a flat uint8 view), displacement
    unit and, for a dynamic window, attached regions; the targets' locks and the post/complete counts."""

    def __init__(self, flavor: int, memories: list, units: list) -> None:
        self.flavor = flavor
        self.group: Any = None  # the Group of the communicator it was made on (a warning names it)
        self.memories = memories  # member -> its window's bytes (uint8, 1-d), or None (dynamic)
        self.units = units
        self.attached: list = [[] for _ in memories]  # dynamic: member -> [(address, bytes)]
        self.mutex = threading.Lock()  # one operation at a time on the window's memory
        self.locks: dict = {}  # target -> [exclusive holder or None, {shared holder: count}]
        self.posts: dict = {}  # (target, origin) -> Posts not yet met by a Start
        self.completes: dict = {}  # (target, origin) -> Completes not yet met by a Wait
        self.waiters: dict = {}  # world rank -> the token it waits with (released on any change)
        self.lock_lines: dict = {}  # target -> [member, ...] waiting for a lock on it, in the order they asked


class _Access:
    """One member's synchronization state on its window (its own, not shared)."""

    __slots__ = ("fence", "started", "posted", "locked", "lock_all", "pending")

    def __init__(self) -> None:
        self.fence = False  # inside a fence epoch (a Fence without MODE_NOSUCCEED)
        self.started: Optional[tuple] = None  # Start's targets (window ranks), until Complete
        self.posted: Optional[tuple] = None  # Post's origins, until Wait
        self.locked: dict = {}  # target -> MPI.LOCK_EXCLUSIVE / LOCK_SHARED (None: MODE_NOCHECK)
        self.lock_all = False
        self.pending: list = []  # a fence epoch's operations, done at the Fence that ends it (`fenced`)


class _Handle:
    """What copies of one window share (``MPI.Win(win)``): its name, info, error handler, attributes."""

    __slots__ = ("name", "info", "errhandler", "attrs", "freed")

    def __init__(self) -> None:
        self.name = ""
        self.info: Any = None
        self.errhandler: Any = None  # None: MPI.ERRORS_RETURN (a new window: what mpi4py.rc.errors gives)
        self.attrs: dict = {}
        self.freed = False


def _release_all(world: Any, shared: _Shared) -> None:
    """Let every member waiting on this window look again (world lock held)."""
    for rank, token in list(shared.waiters.items()):
        world.release(rank, token)


def _may_lock(shared: _Shared, rank: int, exclusive: bool) -> bool:
    state = shared.locks.get(rank)
    if state is None:
        return True
    return state[0] is None and (not exclusive or not state[1])


def _take_lock(shared: _Shared, rank: int, me: int, exclusive: bool) -> None:
    state = shared.locks.setdefault(rank, [None, {}])
    if exclusive:
        state[0] = me
    else:
        state[1][me] = state[1].get(me, 0) + 1
