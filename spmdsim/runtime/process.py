"""What the process of a rank started by an MPI launcher gets, once (docs/howto/cluster-mpi.md, "What a process gets").

`tune_mpi_process()` caps the BLAS numpy loaded at this rank's share of the
node's cores (spmdsim.base.threads), asks glibc to keep freed result buffers in
the heap (spmdsim.base.malloc) and starts the memory watch (runtime.memwatch);
outside a launcher it does nothing. The guard calls it when it is first set
up on this rank (runtime.guard: ``install_excepthook()``, ``run_guarded``,
``abort_on_error``), the door every program of spmdsim's goes through under
MPI: the `spmdsim` command, the examples' ``spmdsim.script(__file__)``,
``python -m spmdsim.models.nets``; the MPI test runs call it in tests/conftest.py.
Importing spmdsim, making a Mesh or running a simulation changes no process
setting. `release_segments_once(world)`, at the same first setup, unlinks
MPICH's shared-memory segment once every rank has mapped it, so a rank killed
with SIGKILL leaves nothing in /dev/shm. A user's own ``*_NUM_THREADS`` or glibc variable wins, as always.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, NoReturn, Optional

from ..base.interrupts import keep_ctrl_c
from ..base.malloc import keep_freed_buffers_under_launcher
from ..base.context import simulated as _simulated
from ..base.threads import cap_blas_threads_under_launcher, launcher_local_ranks
from ..errors import SpmdsimError
from .engines import engine_of
from . import memwatch

__all__ = ["tune_mpi_process", "release_segments_once", "release_shared_segments", "end_job",
           "abort_job", "world_channel", "FORWARD_S"]

#: Seconds a rank waits between writing its last words and MPI_Abort: abort at once and the job's
#: whole stderr can be lost when it goes to a pipe (seen: an empty stderr and exit 1 in CI).
FORWARD_S = 0.3

_PRIVATE: dict[int, Any] = {}  # id(comm) -> (comm, the guard's private duplicate: runtime.guard)
_TUNED: list = []  # what the one call did: (BLAS threads or None, heap kept, watch started)


def tune_mpi_process() -> Optional[tuple]:
    """Once per process, under an MPI launcher: BLAS threads to this rank's share, freed heap kept, the
    memory watch started, a Ctrl-C landing in a weakref callback kept (spmdsim.base.interrupts); returns what it
    did, (threads or None, kept, watching), or None outside a launcher.

    Call it from the main thread: mpi4py is imported here (MPI initialized) before the watch's thread asks it.
    """
    if _TUNED:
        return _TUNED[0]
    local = launcher_local_ranks()
    if local is None:
        return None
    from mpi4py import MPI  # noqa: F401 - initialized on this thread, not on the watch's

    keep_ctrl_c()
    _TUNED.append((cap_blas_threads_under_launcher(), keep_freed_buffers_under_launcher(),
                   memwatch.start(local, end_job)))
    return _TUNED[0]


_MPICH_SEGMENT = ("/dev/shm/mpich_shm_",)
_UNLINKED: list = []


def release_segments_once(world: Any) -> None:
    """Once per process, over the whole world (collective): unlink MPICH's /dev/shm segment.

    MPICH keeps one segment (~8 MB at 8 ranks) linked until MPI_Finalize, so a rank killed with
    SIGKILL (or by the OOM killer) left it in /dev/shm until reboot. After a barrier over the
    world every local rank has attached it; unlinked, each keeps its mapping and the memory goes
    when the last one exits, however it exits. Open MPI's segments are left alone. A world of one
    rank (a singleton, as `spmdsim mpirun`'s process is) has nobody to wait for: no barrier.
    """
    if _UNLINKED:
        return
    _UNLINKED.append(True)
    if world.Get_size() > 1:
        engine_of(world).barrier(world, None)  # a job call, as the guard's (no data: not through the door)
    release_shared_segments(prefixes=_MPICH_SEGMENT)


def end_job(comm: Any, text: str) -> NoReturn:
    """Write `text` to stderr, give mpiexec time to forward it, unlink MPI's segment, MPI_Abort (exit 1)."""
    sys.stdout.flush()
    sys.stderr.write(text)
    sys.stderr.flush()
    time.sleep(FORWARD_S)
    release_shared_segments()
    engine_of(comm).abort(comm, 1)
    os._exit(1)  # MPICH's Abort can return before mpiexec ends the job: this rank stops here


_SEGMENT_PREFIXES = ("/dev/shm/mpich_shm_", "/dev/shm/sm_segment.")  # MPICH's, Open MPI's


def release_shared_segments(maps: str = "/proc/self/maps",
                            prefixes: tuple[str, ...] = _SEGMENT_PREFIXES) -> list[str]:
    """Unlink the MPI shared-memory segments this process maps; return their paths (Linux only).

    MPI_Abort kills the ranks before MPICH unlinks its ~8 MB /dev/shm segment,
    so every aborted job would leave one until reboot; each rank keeps its mapping until it dies.
    `prefixes`: which segments (default MPICH's and Open MPI's).
    """
    try:
        with open(maps) as fh:
            paths = {line.split(maxsplit=5)[5].strip() for line in fh if "/dev/shm/" in line}
    except (OSError, IndexError):
        return []
    done = []
    for path in sorted(paths):
        if path.startswith(prefixes) and not path.endswith("(deleted)"):
            try:
                os.unlink(path)
                done.append(path)
            except OSError:  # another rank unlinked it first
                pass
    return done


def abort_job(comm: Any, text: str) -> NoReturn:
    """Write `text` (newline-terminated) to stderr, let mpiexec forward it, then Abort the job."""
    if _simulated() is not None:  # a simulated rank raises; simulate() stops the others
        raise SpmdsimError(text.strip())
    end_job(comm, text + f"spmdsim: aborting the MPI job ({comm.Get_size()} ranks)\n")


def world_channel() -> Any:
    """The private duplicate of COMM_WORLD if a guard set one up on this rank (every rank or none), else None.

    The watchdog's side channel (runtime._roster): its messages match nothing in user code. Never imports mpi4py.
    """
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return None
    entry = _PRIVATE.get(id(mpi.COMM_WORLD))
    return entry[1] if entry is not None and entry[0] is mpi.COMM_WORLD else None
