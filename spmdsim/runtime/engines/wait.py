"""How a rank waits inside a collective: "busy" (MPI's own blocking call) or "polite".

Under oversubscription MPICH ranks blocked in a collective spin and steal the
cores the computing ranks need (docs/explanation/oversubscription.md). The polite wait posts the
nonblocking collective and polls ``Test()``, first with ``sched_yield`` between
polls (a plain Test spin is ~100x slower than the blocking call when
oversubscribed: the spinning rank keeps the core its peers need), then with
sleeps of growing length, under a 1 us timer slack so short sleeps stay short.
``SPMDSIM_WAIT=busy|polite|auto`` picks the mode. The constants below were
measured on a 2-core VM with 8 ranks (docs/explanation/oversubscription.md).
"""
from __future__ import annotations

import os
import time
from typing import Any

from ...base.threads import cores_available, launcher_local_ranks
from ...errors import SpmdsimError
from . import engine_of

__all__ = ["WAIT_MODES", "resolve_wait_mode", "polite_wait", "wait_until", "cores_available",
           "local_ranks"]

WAIT_MODES = ("busy", "polite", "auto")

# No plain Test() spin (a spinning rank keeps the core its peers need): first Test() with
# sched_yield between polls for _YIELD_S, then sleeps growing from _SLEEP_MIN_S to _SLEEP_MAX_S (and on to
# _LONG_SLEEP_MAX_S once the sleeps have lasted _LONG_S).
_YIELD_S = 1000e-6
_SLEEP_MAX_S = 100e-6
_SLEEP_MIN_S = 20e-6
# A wait past _LONG_S is another rank's work (rank 0 computing a reference for all), not a message in flight: its
# sleeps grow on to _LONG_SLEEP_MAX_S, at most a tenth more of a wait that long. Six 2-step GPT runs in one job of
# 8 ranks on 2 cores took 29-31 CPU-s so against 32-33 with 100 us sleeps throughout (their wake-ups), in as long.
_LONG_S = 10e-3
_LONG_SLEEP_MAX_S = 1000e-6


def _next_sleep(delay: float, long: bool) -> float:
    """A polite wait's sleep after `delay`: twice it, up to _SLEEP_MAX_S, or to _LONG_SLEEP_MAX_S in a `long` wait."""
    return min(2.0 * delay, _LONG_SLEEP_MAX_S if long else _SLEEP_MAX_S)


def local_ranks(comm: Any) -> int:
    """Ranks of `comm` on this node: from the launcher's environment, else one Split_type (collective;
    every rank takes the same path, as all see the same environment)."""
    from_launcher = launcher_local_ranks()
    if from_launcher is not None:
        return from_launcher
    return engine_of(comm).node_size(comm)


def resolve_wait_mode(mode: str | None, comm: Any, check_only: bool = False) -> str:
    """Turn "busy"/"polite"/"auto"/None (= $SPMDSIM_WAIT, default auto) into busy or polite.

    `check_only`: only refuse an unknown mode, and return it as given (no communicator needed).
    """
    what = f"{mode!r}"
    if mode is None:
        raw = os.environ.get("SPMDSIM_WAIT", "auto")
        mode, what = raw.strip().lower() or "auto", f"SPMDSIM_WAIT={raw!r}"
    if mode not in WAIT_MODES:
        raise SpmdsimError(f"{what} is not a known wait mode; expected one of {WAIT_MODES!r}")
    if check_only or mode != "auto":
        return mode
    if comm.Get_size() == 1:
        return "busy"
    return "polite" if local_ranks(comm) > cores_available() else "busy"


_SLACK_SET = False


def _tight_timer_slack() -> None:
    """Ask Linux for 1 us timer slack so 20-100 us sleeps are not stretched by the 50 us default."""
    global _SLACK_SET
    _SLACK_SET = True
    try:
        import ctypes

        ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, in ns
    except (OSError, AttributeError):
        pass


def polite_wait(request: Any) -> None:
    """Complete `request` by polling Test(): yielding the core between polls, then sleeping with backoff."""
    test = request.Test
    if test():
        return
    if not _SLACK_SET:
        _tight_timer_slack()
    clock = time.perf_counter
    yield_ = os.sched_yield
    deadline = clock() + _YIELD_S
    while clock() < deadline:
        if test():
            return
        yield_()
    delay = _SLEEP_MIN_S
    sleep = time.sleep
    long_after = clock() + _LONG_S
    while not test():
        sleep(delay)
        if delay < _LONG_SLEEP_MAX_S:
            delay = _next_sleep(delay, clock() > long_after)


def wait_until(request: Any, deadline: float, polite: bool) -> bool:
    """Poll `request` until it completes (True) or time.monotonic() passes `deadline` (False: left pending).

    The watchdog's wait: polite polling as polite_wait polls, busy polling a Test() spin.
    """
    test = request.Test
    if test():
        return True
    if polite and not _SLACK_SET:
        _tight_timer_slack()
    clock = time.monotonic
    yield_until = clock() + _YIELD_S
    long_after = yield_until + _LONG_S
    delay = _SLEEP_MIN_S
    while not test():
        now = clock()
        if now > deadline:
            return False
        if not polite:
            continue
        if now < yield_until:
            os.sched_yield()
        else:
            time.sleep(delay)
            delay = _next_sleep(delay, now > long_after)
    return True
