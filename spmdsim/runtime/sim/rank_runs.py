"""The threads of one simulation's ranks (spmdsim.runtime.sim.run's `simulate`): the world's, and those a rank
spawns while the run goes on (MPI_Comm_spawn on simulated ranks: spmdsim.emulator.spawn).

Each rank runs its function in a thread of its own under its own RankContext, holding a run slot of the World
while it computes, and ends as an MPI process ends: a SystemExit ends it alone, any other exception stops the
run. A spawned rank is one more rank of the same World, numbered after those before it (the first child of a
4-rank run is world rank 4), with a world communicator of its own; it counts as live from its spawn, so a
deadlock is still every live rank waiting, and the run ends once every rank, spawned ones too, has ended.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

from ...base import context as _local
from ...base.context import SIMULATE, RankContext
from ..engines import advised
from ..debug import Hooks
from .engine import Aborted, SimulationError, World
from .groups import Group
from .os_exit import OsExit, exit_text
from .rank_threads import _held_lock
from .simulating import end_lines
from .thread_engine import THREADS, Member

__all__ = ["RankRuns", "RankThread"]


class RankThread(threading.Thread):
    """A simulated rank's own thread: one a rank spawns is no thread of that rank's (spmdsim.emulator.rank_threads
    leaves it be), but a rank of its own."""


class RankRuns:
    """The ranks of one run of `World` `engine`: their threads, whose end each sets its Event, their results and
    the SystemExit of each that exited. `settings`: the debug settings each rank starts from a copy of;
    `shared`: the run's table of spmdsim.base.once's results."""

    def __init__(self, engine: World, settings: Any, shared: dict) -> None:
        self.engine, self.settings, self.shared = engine, settings, shared
        self.threads: list[threading.Thread] = []  # RankThreads
        self.ended: list[threading.Event] = []
        self.results: dict[int, Any] = {}  # rank -> what its function returned
        self.exited: dict[int, SystemExit] = {}  # rank -> the SystemExit that ended it
        self.ranks = engine.size  # ranks so far: the world's, then the spawned ones
        engine.runs = self

    def add(self, group: Group, calls: Sequence[tuple]) -> list[threading.Thread]:
        """The threads (not started) of the members of `group`, each calling its (fn, args, kwargs) of `calls`
        with MPI.COMM_WORLD its member of `group`."""
        made = []
        for me, (fn, args, kwargs) in enumerate(calls):
            end = threading.Event()
            thread = RankThread(target=self._body, args=(group, me, fn, args, kwargs, end),
                                name=f"spmdsim rank {group.members[me]}", daemon=True)
            self.threads.append(thread)
            self.ended.append(end)
            made.append(thread)
        return made

    def _body(self, group: Group, me: int, fn: Callable[..., Any], args: tuple, kwargs: dict,
              end: threading.Event) -> None:
        engine, rank = self.engine, group.members[me]
        hooks = Hooks(self.settings)
        hooks.world = engine  # configure() on the rank may turn its watchdog on
        _local.enter(RankContext(rank, group.size, Member(group, me), THREADS, shared=self.shared,
                                 hooks=hooks, launcher=SIMULATE))
        try:
            engine.start(rank)  # a run slot: at most engine.slots ranks compute at once
            if engine.watched:  # a bad setting is every rank's error now, not the one that waits first's
                hooks.watchdog_seconds()
            try:
                self.results[rank] = fn(*args, **kwargs)
            except (SystemExit, OsExit) as exc:
                # The rank's process exits: it ends, and the others go on, as MPI ranks do (those that wait
                # for it deadlock, naming it). Taken as a failure, it would stop them and simulate() raise the
                # SystemExit: `python prog.py` would exit 0 without a word while three ranks wait for it.
                self.exited[rank] = exc if isinstance(exc, SystemExit) else SystemExit(exc.code)
                with engine.lock:
                    engine.exits[rank] = exit_text(exc)
            engine.join_all(rank)  # as a process's exit waits for its threads (spmdsim.runtime.sim.rank_threads)
        except Aborted:
            pass  # stopped because another rank failed; that rank's error is the one reported
        except BaseException as exc:  # noqa: BLE001 - reported in the caller
            engine.fail(rank, advised(exc, group.size))
        finally:
            try:
                end_lines()  # its unended line, a line of its own: not run together with another rank's
            except Exception as exc:  # noqa: BLE001 - a full disk under `> file`: the rank's, one line (launch)
                engine.fail(rank, exc)
            _local.leave()
            engine.finish(rank)
            end.set()

    def spawn(self, count: int, calls_of: Callable[[tuple], Sequence[tuple]], made: str) -> Group:
        """Start `count` new ranks, the members of a new world that `made` names, each calling its (fn, args,
        kwargs) of `calls_of(their world ranks)`; return that world's group. With the world lock held (a
        collective's last member spawns: spmdsim.emulator.spawn); live before it returns, so that no deadlock
        is declared while they start."""
        engine = self.engine
        if engine.failure is not None or engine.deadlock is not None:
            engine.check(-1)
        ranks = tuple(range(self.ranks, self.ranks + count))
        calls = calls_of(ranks)
        self.ranks += count
        for rank in ranks:
            engine._wakers[rank] = _held_lock()
        engine.live += count
        group = Group(engine, ranks, made)
        threads = self.add(group, calls)
        for started, thread in enumerate(threads):
            try:
                thread.start()
            except RuntimeError as exc:  # no thread to be had: the ones not started end now, never live
                for rank in ranks[started:]:
                    engine.live -= 1
                    engine.finished.add(rank)
                raise SimulationError(f"could not start spawned simulated rank {ranks[started]}: {exc}") from None
        return group
