"""``time.sleep`` on a simulated rank gives the rank's run slot to the next rank in line while it sleeps.

`World.slots` ranks compute at once (spmdsim.runtime.sim.engine: the cores, at least 2), more only while a
line that stood still is overdrawn (spmdsim.runtime.sim.sleepers). A rank that sleeps computes nothing, but
held its slot: 8 ranks each sleeping 1 s took 4 s on 2 cores, where 8 MPI processes sleep side by side (1 s).
While a simulation runs (spmdsim.runtime.sim.run's `_simulating`), ``time.sleep`` is `sleep` below: on a
rank's own thread it gives the slot away (`World.stepped_aside`), sleeps, and takes one back in line before it
returns; on any other thread (the caller's, a thread a rank started, which holds no slot) it is Python's own.
The rank stops in its sleep, as at a wait, at once when the caller is interrupted (Ctrl-C in a notebook's
cell), and once GO_ON_S have passed after another rank failed (`World.sleep_ends`): no rank sleeps on in a
thread of the process after simulate() raised, and simulate() does not wait out a failed run's sleeps (a dry
run's rank stops in its sleep too: `_dry_sleep`). Modules that took ``from time import sleep`` before the
simulation started keep Python's own.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from ...base import context as _local

__all__ = ["sleep", "real_sleep"]

real_sleep = time.sleep  # Python's own, as this module is first imported (spmdsim's own waits use it)
STOP_POLL_S = 0.05  # after another rank's failure: how often a sleeping rank looks whether it stops


def sleep(seconds: float) -> None:
    """time.sleep(seconds); a simulated rank's own thread sleeps without its run slot."""
    state = _local.simulated()
    world = _world_of(state)
    if world is None:
        meter = getattr(state, "meter", None) if state is not None and state.dry_run else None
        return real_sleep(seconds) if meter is None else _dry_sleep(meter, seconds)
    with world.stepped_aside(state.rank):
        if not _positive(seconds):  # 0 (a yield), or what Python's own refuses in its own words
            return real_sleep(seconds)
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            if not world.stopping.is_set():
                world.stopping.wait(min(left, threading.TIMEOUT_MAX))
            elif world.sleep_ends():
                break
            else:  # another rank failed: this one may still reach a collective that completes (GO_ON_S)
                real_sleep(min(left, STOP_POLL_S))
    if world.stopping.is_set() and world.sleep_ends():
        world.check(state.rank)  # Aborted
    return None


def _dry_sleep(meter: Any, seconds: float) -> None:
    """A dry run's rank sleeps, and stops in its sleep (Aborted) at once when the caller is interrupted
    (spmdsim.runtime.sim.dry_meter.Meter.go_on): the dry run's thread does not sleep on, then run on."""
    if not _positive(seconds):
        return real_sleep(seconds)
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        meter.go_on()
        real_sleep(min(left, STOP_POLL_S))
    meter.go_on()
    return None


def _positive(seconds: Any) -> bool:
    try:
        return seconds > 0
    except TypeError:
        return False


def _world_of(state: Any) -> Any:
    """The thread engine's World of the running rank (None outside one, and in a dry run)."""
    if state is None or state.dry_run:
        return None
    group = getattr(state.comm, "_group", None)
    return getattr(group, "world", None)
