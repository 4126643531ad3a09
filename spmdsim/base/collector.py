"""Python's cyclic garbage collector run less often while a search builds many long-lived objects; standard
library only.

CPython collects its youngest objects after every 700 allocations and walks every object it tracks at a full
collection. A search (spmdsim.tools.estimate.search) keeps hundreds of thousands of them alive (the pipeline
schedules it built, its candidates, each dry run's graph), so with the defaults the collector took 19.5 s of the
111 s that `spmdsim autoshard` spent on the 1T model's 3,072 GPUs (docs/howto/choose-configuration.md), and 5.5
of 38 s on the 22B model's 8; with `THRESHOLDS` 5.1 and 1.5 s, the same peak memory. One dry run of the 1T
model's chosen configuration (`spmdsim estimate`, spmdsim.tools.estimate.ledger.gpt_ledger) 2.1 of 10.8 s,
1.0 with them. Cycles are still collected, later. Nothing changes at import: `fewer_collections` sets the
thresholds for its block only.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["THRESHOLDS", "fewer_collections", "collect_less"]

#: The collector's thresholds (generation 0, 1, 2) inside `fewer_collections`: a young collection every 20,000
#: allocations, an older one every 20 young ones, a full one every 20 older ones (the test processes' own,
#: tests/conftest.py).
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
