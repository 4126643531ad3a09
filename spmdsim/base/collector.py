"""Python's cyclic garbage collector run less often while a search or an estimate builds many long-lived
objects; standard library only.

CPython collects its youngest objects after every 700 allocations and walks every object it tracks at a full
collection. A search (spmdsim.tools.estimate.search) keeps hundreds of thousands of them alive (the pipeline
schedules it built, its candidates, each dry run's graph). The `spmdsim estimate` and `spmdsim autoshard`
commands raise the thresholds to `THRESHOLDS` at their start (spmdsim.tools.cli.console); `fewer_collections`
gives the same to `search` and to `gpt_ledger` called from Python (a notebook, a test), and `collect_less` to a
search's `--jobs` worker processes, which start as fresh interpreters. Called from Python with Python's
thresholds, the collector took 19.5 s of 111 s of the 1T model's search on 3,072 GPUs
(docs/howto/choose-configuration.md) and 5.5 of 38 s of the 22B model's on 8; with `THRESHOLDS` 5.1 and 1.5
s, the same peak memory; one dry run of the 1T model's chosen configuration 2.1 of 10.8 s, 1.0 with them. The
22B search with `--jobs 2` took 23.2 s with its workers at Python's thresholds, 16.7-17.5 s at these. Cycles
are still collected, later. Nothing changes at import: `fewer_collections` sets the thresholds for its block
only.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["THRESHOLDS", "fewer_collections", "collect_less"]

#: The collector's thresholds (generation 0, 1, 2) inside `fewer_collections`: a young collection every 20,000
#: allocations, an older one every 20 young ones, a full one every 20 older ones (the dry-run commands' own,
#: spmdsim.tools.cli.console, and the test processes', tests/conftest.py).
THRESHOLDS = (20000, 20, 20)


def collect_less() -> None:
    """From now on in this process each of the collector's thresholds at least `THRESHOLDS`' (a search's
    worker process, spmdsim.tools.estimate.ahead, which runs dry runs until it ends). A collector turned off
    (threshold 0) stays off."""
    now = gc.get_threshold()
    if now[0] != 0:
        gc.set_threshold(*(max(a, b) for a, b in zip(now, THRESHOLDS)))


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """`collect_less` inside the block, the thresholds as they were after it."""
    saved = gc.get_threshold()
    collect_less()
    try:
        yield
    finally:
        gc.set_threshold(*saved)
