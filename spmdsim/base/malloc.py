"""Keep freed result buffers in the heap for reuse; standard library only.

Every collective and operator returns a fresh array. With glibc's defaults a
multi-MiB array is often a new mmap handed back on free, so the next call pays
one page fault per 4 KiB page again: on the 2-core VM with 8 ranks that doubled
a 16 MiB Allreduce (docs/explanation/performance.md, "Heap reuse for result buffers").

Under an MPI launcher, glibc serves allocations up to 32 MiB (its largest
mmap threshold) from the heap and keeps up to 64 MiB of freed heap top, so a
rank holds at most 64 MiB beyond its live arrays. The same 64 MiB is glibc's top
pad: a thread's arena (a simulated rank's) grows in heaps of 64 MiB, and without
the pad glibc unmaps a heap as soon as its last block is freed, so a rank whose
step holds more than one heap mapped and faulted in a fresh 64 MiB every step
(14,466 page faults and ~32 ms of system time a step for bench_gpt.py's GPT on 1
simulated rank; none with the pad). `spmdsim launch` sets glibc's
variables for its ranks (`glibc_env`); a rank of a plain ``mpiexec`` calls
mallopt when spmdsim's guard is first set up on it (`keep_freed_buffers_under_launcher`,
from runtime.process). A ``--ranks N`` run of spmdsim's programs (the CLI, the
examples: `spmdsim.runtime.sim.launch.run_on_ranks`) and ``spmdsim mpirun`` call mallopt
alike before their ranks start: eager steps, and a program's messages, otherwise fault
their freed heap top in again every step or message (docs/explanation/performance.md);
`spmdsim.simulate` itself does not. Skipped when
the user set any of GLIBC_VARS (to opt out: ``MALLOC_TRIM_THRESHOLD_=131072``,
glibc's default) and without glibc. ``import spmdsim`` changes nothing.
"""
from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

from .threads import launcher_local_ranks

MMAP_THRESHOLD = 32 << 20  # glibc refuses more than half its 64 MiB heap size
TRIM_THRESHOLD = 64 << 20
TOP_PAD = 64 << 20  # a thread arena's freed heap stays while its blocks fit in this much
GLIBC_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")

# mallopt parameter numbers from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3


@functools.lru_cache(maxsize=None)
def _mallopt() -> Any:
    """The C library's mallopt, looked up once a process (a --ranks run asks for it each run); None without."""
    try:
        # The symbols this process already has, libc's among them: find_library("c") ran `ldconfig -p` in a
        # subprocess (~4 ms CPU, 177 times in a run of the pure tests).
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt


def keep_freed_buffers() -> bool:
    """Set the two thresholds and the top pad in this process; False where mallopt is missing or refuses."""
    mallopt = _mallopt()
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
                and mallopt(_M_TOP_PAD, TOP_PAD))


def keep_freed_buffers_unless_set() -> bool:
    """`keep_freed_buffers` for a program's process (a ``--ranks N`` run of the CLI or an example:
    spmdsim.runtime.sim.launch.run_on_ranks), unless the user set any of GLIBC_VARS."""
    if any(var in os.environ for var in GLIBC_VARS):
        return False
    return keep_freed_buffers()


def keep_freed_buffers_under_launcher() -> bool:
    """`keep_freed_buffers_unless_set` for a rank started by an MPI launcher."""
    return launcher_local_ranks() is not None and keep_freed_buffers_unless_set()


def glibc_env(env: dict) -> dict:
    """`env` with glibc's variables for the two thresholds and the top pad, unless it sets any of GLIBC_VARS."""
    if any(var in env for var in GLIBC_VARS):
        return env
    return {**env, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
            "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD), "MALLOC_TOP_PAD_": str(TOP_PAD)}
