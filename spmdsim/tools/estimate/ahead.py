"""Dry runs ahead of a search, in worker processes (`spmdsim autoshard --jobs N`).

spmdsim.tools.estimate.search takes its candidates one at a time in the order of their bounds, and each one it
bounds by its layer cells or prices costs dry runs (spmdsim.tools.estimate.ledger.gpt_ledger), one after the
other on one core. `LookAhead` keeps N worker processes running the dry runs of the candidates next in that
order and gives each finished ledger to the search's process (ledger.remember), where gpt_ledger finds it
instead of running it. The search itself does not change: it takes the same steps in the same order, and
chooses, counts and prints the same; what the workers ran that it never asks for is dropped. A dry run that
fails in a worker is left to the search, which runs it again and says what went wrong as it would alone; if a
worker dies, the look-ahead stops and the search goes on alone.

The workers are started fresh (multiprocessing's "spawn"), so a program that searches with `jobs` must start
from a module whose work is under ``if __name__ == "__main__":`` (Python's rule for any process pool).
"""
from __future__ import annotations

import contextlib
import heapq
import os
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any, Callable, Iterable, Iterator, Optional

from ...base.collector import collect_less
from .ledger import dry_run, known_ledgers, remember

__all__ = ["LookAhead"]

#: The heap's head that `LookAhead` orders to find the next candidates: a heap's k least entries lie in its first
#: 2^k - 1, so its first 1,023 hold the 10 least (beyond 10, nearly the least: the next steps are a guess anyway).
HEAD = 1023
#: Candidates looked at for each worker: many share a layer cell, and each one the bounds prune is skipped
#: (the 1T search of docs/howto/choose-configuration.md on 2 workers: 4 a worker left one idle for 29 of 98 s,
#: 16 for 16 of 97 s).
WINDOW = 16


class LookAhead:
    """`jobs` worker processes running a search's next dry runs (module docstring); `close()` ends them."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self._pool: Optional[ProcessPoolExecutor] = ProcessPoolExecutor(jobs, mp_context=get_context("spawn"),
                                                                         initializer=_worker_start,
                                                                         initargs=(os.getpid(),))
        self._running: dict[tuple, Future] = {}
        self._failed: set = set()  # dry runs that raised in a worker: the search's own process runs them
        self.given = 0  # ledgers the workers gave the search
        self._terminate = False  # SIGTERM handled here (`__enter__`)

    def before(self, heap: list, best: Optional[float], keys_of: Callable[[tuple], list]) -> None:
        """Before the search takes `heap[0]`: the dry runs it needs made by the workers (waited for), the workers
        free meanwhile given those of the entries next in order whose bound is under `best`. `keys_of(entry)`:
        the spmdsim.tools.estimate.ledger.dry_key of each dry run the search needs to take heap entry `entry`."""
        if self._pool is None:
            return
        self._collect()
        need = [key for key in _keys(keys_of, heap[0]) if self._missing(key)]
        if self._submit(need):
            for entry in heapq.nsmallest(WINDOW * self.jobs, heap[:HEAD])[1:]:
                if best is not None and entry[0] >= best or not self._submit(_keys(keys_of, entry)):
                    break
        while self._pool is not None and self._running and any(self._missing(key) for key in need):
            wait(self._running.values(), return_when=FIRST_COMPLETED)
            self._collect()
            self._submit(need)

    def _submit(self, keys: Iterable[tuple]) -> bool:
        """`keys` not yet run given to the workers while one is free; whether one still is."""
        for key in keys:
            if self._pool is None or len(self._running) >= self.jobs:
                return False
            if key not in self._running and self._missing(key):
                try:
                    with _born_ignoring_ctrl_c():  # (a submit may start a worker)
                        self._running[key] = self._pool.submit(dry_run, key)
                except BrokenProcessPool:  # a worker died (killed, out of memory): the search goes on alone
                    self.close()
                    return False
        return len(self._running) < self.jobs

    def _missing(self, key: tuple) -> bool:
        """Whether the dry run `key` is neither made nor left to the search (it failed in a worker)."""
        return key not in self._failed and known_ledgers(key) is None

    def _collect(self) -> None:
        """The finished dry runs' ledgers kept for the search."""
        for key, future in list(self._running.items()):
            if not future.done():
                continue
            del self._running[key]
            try:
                ledgers = future.result()
            except BrokenProcessPool:  # a worker died (killed, out of memory): the search goes on alone
                self.close()
                return
            except Exception:  # noqa: BLE001 the search runs it again and says what went wrong, as alone
                self._failed.add(key)
                continue
            remember(key, ledgers)
            self.given += 1

    def close(self) -> None:
        """The workers ended at once, the dry runs they were running dropped."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # ProcessPoolExecutor lets a running task finish before it exits (Python 3.14 adds kill_workers)
        processes = list((getattr(pool, "_processes", None) or {}).values())
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.kill()
        for process in processes:
            process.join(5)
        if manager is not None:  # it closes its wake-up pipe: racing Python's exit, which writes there (3.11),
            manager.join(5)      # that printed "OSError: [Errno 9] Bad file descriptor" after Ctrl-C
        self._running.clear()

    def __enter__(self) -> "LookAhead":
        """Where SIGTERM would end the process at once (Python's default, in the main thread), it ends the
        workers first and exits with 143 (128 + SIGTERM): killed at once, the process left its pool's semaphores
        to multiprocessing's resource tracker, which warned about them on stderr."""
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _terminated)
            self._terminate = True
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        self.close()
        if self._terminate:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            self._terminate = False
            if kind is _Terminated:  # the process ends, its workers first, with a shell's code for SIGTERM
                raise SystemExit(128 + signal.SIGTERM)


def _keys(keys_of: Callable[[tuple], list], entry: tuple) -> list:
    """`keys_of(entry)`, or none where it raises: the search meets that error itself if it takes the entry, and
    only then (an entry the bounds prune never raises it)."""
    try:
        return keys_of(entry)
    except Exception:  # noqa: BLE001 (the search's own step says what went wrong, as alone)
        return []


class _Terminated(BaseException):
    """SIGTERM while a `LookAhead` runs."""


def _terminated(signum: int, frame: Any) -> None:
    raise _Terminated()


@contextlib.contextmanager
def _born_ignoring_ctrl_c() -> Iterator[None]:
    """A worker started within is born with Ctrl-C blocked (a thread's signal mask survives fork and exec; Python
    keeps it) until `_worker_start` ignores it: else a Ctrl-C while a worker still imports would print that
    worker's KeyboardInterrupt traceback. This process's own Ctrl-C is held meanwhile and raised once the block
    ends, not lost: blocked in this thread, the kernel hands it to another thread of the process (the pool's,
    the progress line's), whose handler the main thread then runs, here the one that holds it. (Ignoring it here
    meanwhile, SIG_IGN, lost it so: that thread took it and dropped it, and a search ran on to its end.) Only in
    the main thread, where Python sets handlers."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    held: list = []
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # (one sent while no other thread could take it: now)
    if held:  # given again to the handler there was before (Python's: KeyboardInterrupt here)
        signal.raise_signal(signal.SIGINT)


def _worker_start(parent: int) -> None:
    """A worker leaves Ctrl-C to the search's process, which ends it (no worker's traceback on the terminal), and
    ends itself within `ORPHAN_S` of that process's end, however it ended (an idle worker of a process pool
    waits on a lock forever once the pool's process is killed)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    collect_less()  # as the search's process collects while searching (spmdsim.base.collector)
    threading.Thread(target=_end_with, args=(parent,), name="spmdsim-orphan-check", daemon=True).start()


#: How often a worker checks that the search's process is still its parent.
ORPHAN_S = 0.5


def _end_with(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(ORPHAN_S)
    os._exit(1)
