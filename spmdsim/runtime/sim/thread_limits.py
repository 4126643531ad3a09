"""Whether this process can start one thread per simulated rank: the limits a run meets before any rank runs.

A rank is a thread, and each thread maps its whole stack (8 MiB under the usual ``ulimit -s 8192``) as
address space when it starts, touching only the pages it uses. Under an address-space cap (``ulimit -v``,
as batch schedulers set) 1,024 ranks need 8 GiB of it, and Python's thread start failed part way with a
traceback (``RuntimeError: can't start new thread`` from ``threading.py``, reported as "error on a simulated
rank"). `threads_problem` says in one line, before any thread starts, when the stacks cannot fit or the
thread count is over a limit the process cannot pass (``ulimit -u``, a cgroup's ``pids.max``); `start_failed`
words a start that fails anyway (what the user's other processes hold is not known here).
"""
from __future__ import annotations

import os
import resource
import threading
import warnings
from typing import Optional

from ..engines.base import SimulationError
from ...base.threads import launcher_rank, launcher_size

__all__ = ["ThreadLimitError", "stack_bytes", "threads_problem", "start_failed"]

#: What a thread maps besides its stack (its guard page, glibc's descriptor, Python's thread state): measured
#: about 22 KiB a thread with numpy loaded (8,214 KiB a thread with 8 MiB stacks); counted generously.
THREAD_EXTRA = 64 << 10

MiB = 1 << 20

#: The address space glibc's malloc reserves for each arena it makes for threads (HEAP_MAX_SIZE on 64-bit): a
#: thread that allocates while the others do gets one of its own, up to 8 per core (M_ARENA_MAX). 2 cores, 16
#: arenas: 1 GiB of the cap before any stack (8.2 MiB a thread measured, 598 threads under ulimit -v 6000000).
ARENA = 64 * MiB


class ThreadLimitError(SimulationError):
    """The simulated ranks' threads could not all start: not one rank's error, the whole simulation's."""


def stack_bytes() -> int:
    """The stack a new thread of this process maps: Python's `threading.stack_size()` if set, else the C
    library's default (glibc's: ``ulimit -s`` as the process started, 2 MiB where that is unlimited), else
    ``ulimit -s`` itself (8 MiB where unlimited or unknown)."""
    size = threading.stack_size()
    if size:
        return size
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        attr = ctypes.create_string_buffer(256)  # a pthread_attr_t (56 bytes on 64-bit glibc)
        if libc.pthread_getattr_default_np(attr) == 0:
            found = ctypes.c_size_t()
            ok = libc.pthread_attr_getstacksize(attr, ctypes.byref(found)) == 0
            libc.pthread_attr_destroy(attr)
            if ok and found.value:
                return int(found.value)
    except (OSError, AttributeError, ValueError):  # not glibc (musl, macOS): ulimit -s below
        pass
    soft = resource.getrlimit(resource.RLIMIT_STACK)[0]
    return int(soft) if soft not in (resource.RLIM_INFINITY, 0) and soft > 0 else 8 * MiB


def _mapped_bytes() -> Optional[int]:
    """The address space this process maps now (VmSize), or None where /proc does not say."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_pids_left() -> Optional[tuple[int, str]]:
    """(tasks this process's cgroup may still start, the file that says so), or None where no limit is set."""
    for folder in ("/sys/fs/cgroup", "/sys/fs/cgroup/pids"):  # cgroup v2, v1 (a container's own root)
        try:
            with open(os.path.join(folder, "pids.max")) as f:
                most = f.read().strip()
            with open(os.path.join(folder, "pids.current")) as f:
                now = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if most.isdigit():
            return int(most) - now, os.path.join(folder, "pids.max")
    return None


def _arenas(size: int) -> int:
    """How many malloc arenas `size` rank threads may make: MALLOC_ARENA_MAX if set, else 8 per core."""
    most = os.environ.get("MALLOC_ARENA_MAX", "")
    return min(size, int(most) if most.isascii() and most.isdigit() else 8 * (os.cpu_count() or 1))


def _fit(room: int, each: int) -> int:
    """The most rank threads whose stacks (`each` bytes a thread) and arenas fit in `room` bytes."""
    arenas = _arenas(1 << 62)
    past = (room - arenas * ARENA) // each  # enough ranks to make every arena
    return max(0, past if past >= arenas else min(arenas, room // (each + ARENA)))


def _size(nbytes: float) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB" if nbytes >= 1 << 30 else f"{nbytes / MiB:.0f} MiB"


def threads_problem(size: int) -> Optional[str]:
    """Why this process cannot start `size` rank threads now (one line, without a prefix), or None.

    Refused only where it cannot: the stacks need more address space than ``ulimit -v`` leaves, or the count
    passes ``ulimit -u`` (for a user other than root, which it does not bind) or the cgroup's ``pids.max``.
    """
    stack = stack_bytes()
    each = stack + THREAD_EXTRA
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    mapped = _mapped_bytes()
    if limit != resource.RLIM_INFINITY and mapped is not None:
        room = limit - mapped
        need = size * each + _arenas(size) * ARENA
        if need > room:
            fit = _fit(room, each)
            return (f"{size} simulated ranks need {size} threads, each mapping its stack of {_size(stack)} "
                    f"(ulimit -s), and {_arenas(size)} malloc arenas of 64 MiB: {_size(need)} of address space, "
                    f"but this process may map {_size(limit)} (ulimit -v) and maps {_size(mapped)} already; "
                    f"{fit} ranks fit: fewer ranks, a larger ulimit -v or a smaller ulimit -s, or a dry run "
                    "(one thread)")
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        most = resource.getrlimit(resource.RLIMIT_NPROC)[0]
        if most != resource.RLIM_INFINITY and size > most:
            return (f"{size} simulated ranks need {size} threads, but this user may run {most} processes "
                    "and threads in all (ulimit -u): fewer ranks, a larger ulimit -u, or a dry run (one thread)")
    pids = _cgroup_pids_left()
    if pids is not None and size > pids[0]:
        return (f"{size} simulated ranks need {size} threads, but this process's cgroup may start "
                f"{max(0, pids[0])} more ({pids[1]}): fewer ranks, or a dry run (one thread)")
    return None


def start_failed(started: int, size: int, exc: BaseException) -> ThreadLimitError:
    """The error of a rank thread that did not start (Python's RuntimeError "can't start new thread"), after
    `started` of `size` did: one line naming the limits it may have met."""
    return ThreadLimitError(
        f"only {started} of the {size} simulated ranks' threads could start ({exc}): this process's address "
        f"space (ulimit -v; each thread maps its stack of {_size(stack_bytes())}, ulimit -s) or the threads this "
        "user or cgroup may run (ulimit -u, pids.max) ran out; fewer ranks, or a dry run (one thread)")


def warn_under_launcher(size: int) -> None:
    """A RuntimeWarning (from launcher rank 0 alone) where mpiexec started several processes: each of them runs
    all `size` simulated ranks, its output and work repeated, where the program meant one launcher or the other.
    A warning, not a refusal: comparing the two engines on every process is a use (tests/mpi/test_sim_engines.py)."""
    launched = launcher_size()
    if launched > 1 and launcher_rank() == 0:
        warnings.warn(f"simulate({size}, ...) runs all {size} simulated ranks in each of the {launched} processes "
                      f"mpiexec started ({launched} x {size} ranks, each process its own list); run the program "
                      f"without mpiexec, or let mpiexec -n {size} start the ranks and call fn() without "
                      "simulate", RuntimeWarning, stacklevel=3)
