"""Stop a simulation before the machine runs out of memory: one clear error, not the kernel's kill.

Simulated ranks share one process, so a program whose shards are small for
one rank can need the machine's whole memory at 1,024 ranks. Linux then kills
the process with SIGKILL: no message, exit 137, often after minutes of
swapping. While the ranks run, simulate()'s calling thread reads, every
`POLL_S` seconds, the memory this process holds and what the machine (or the
cgroup it runs in, if that is smaller) has left; when less than
`LOW_FRACTION` of it is left (at least `LOW_FLOOR`) and this process holds
`MIN_HELD` or more, it stops every rank at its next wait with
`MemoryLimitError`. A single allocation larger than what is left still meets
the kernel first. Off Linux (no /proc) nothing is read and nothing stops.
"""
from __future__ import annotations

import os
from typing import Optional

from .base import SimulationError

__all__ = ["MemoryLimitError", "POLL_S", "held", "readings", "short", "problem", "gib", "DRY_RUN_HINT"]

POLL_S = 0.2
LOW_FRACTION = 0.08  # stop when less than 8% of the memory is left ...
LOW_FLOOR = 256 << 20  # ... or less than 256 MiB, whichever is more
MIN_HELD = 1 << 30  # ... and this process holds at least 1 GiB: a small run is never blamed


class MemoryLimitError(SimulationError):
    """The simulated ranks were stopped because the machine was nearly out of memory."""


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as fh:
            text = fh.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup() -> Optional[tuple[int, int]]:
    """(limit, used) bytes of this process's cgroup (v2) when it has a limit, else None."""
    try:
        with open("/proc/self/cgroup") as fh:
            path = next((line.split("::", 1)[1].strip() for line in fh if line.startswith("0::")), None)
    except OSError:
        return None
    if path is None:
        return None
    where = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
    limit, used = _read_int(os.path.join(where, "memory.max")), _read_int(os.path.join(where, "memory.current"))
    return None if limit is None or used is None else (limit, used)


def held() -> Optional[int]:
    """The bytes this process holds (resident), or None off Linux: the cheap part of `readings`."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def readings() -> Optional[tuple[int, int, int]]:
    """(bytes this process holds, bytes left, total bytes) of the machine or its smaller cgroup; None off Linux."""
    mine = held()
    if mine is None:
        return None
    try:
        info = {}
        with open("/proc/meminfo") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    info[key] = int(rest.split()[0]) * 1024
        total, left = info["MemTotal"], info["MemAvailable"]
    except (OSError, KeyError, ValueError, IndexError):
        return None
    group = _cgroup()
    if group is not None and group[0] < total:
        total, left = group[0], min(left, max(0, group[0] - group[1]))
    return mine, left, total


def gib(n: int) -> str:
    """`n` bytes as "21.3 GiB"."""
    return f"{n / 2**30:.1f} GiB"


def short(processes: int = 1) -> Optional[tuple[int, int, int]]:
    """`readings()` when the machine is nearly out of memory and this process, counted
    `processes` times (an MPI rank among its node's), holds `MIN_HELD` or more; else None."""
    got = readings()
    if got is None:
        return None
    held, left, total = got
    if held * processes < MIN_HELD or left >= max(LOW_FLOOR, LOW_FRACTION * total):
        return None
    return got


#: The end of `problem`'s hint where the command has a dry run (`run`, `demo`, the examples);
#: `spmdsim mpirun`, which runs a program's own numpy on every rank, has none and drops it.
DRY_RUN_HINT = ", or a dry run (--dry-run: shapes only, each rank's bytes)"


def problem(ranks: int) -> Optional[str]:
    """Why the simulation of `ranks` ranks must stop now for want of memory, or None."""
    got = short()
    if got is None:
        return None
    held, left, total = got
    return (f"the {ranks} simulated ranks were stopped before this machine ran out of memory: "
            f"they hold {gib(held)}, and {gib(left)} of its {gib(total)} are left; run fewer "
            f"ranks or smaller shapes{DRY_RUN_HINT}")
