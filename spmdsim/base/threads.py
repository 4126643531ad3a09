"""Cores, ranks per node and BLAS thread caps; standard library and the running rank's context only.

A rank started by an MPI launcher should run its BLAS on its share of the
node's cores: with numpy's default pools, 8 ranks on 2 cores ran a measured job
20x slower (docs/explanation/oversubscription.md). `spmdsim launch` sets the thread
variables for its ranks before they start; a rank started by a plain
``mpiexec`` caps the BLAS numpy already loaded when spmdsim's guard is first
set up on it (`cap_blas_threads_under_launcher`, from runtime.process). ``import spmdsim`` changes nothing. A
user's own setting always wins, and reaches the loaded BLAS even when it
was made after numpy loaded.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import time
from typing import Any, Iterator, Mapping, Optional

from .context import MPIRUN, current

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

# Launchers that tell each rank how many ranks share its node.
LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_SIZE",
                   "SLURM_NTASKS_PER_NODE")
#: Where launchers put a process's rank (MPICH/Hydra and Slurm's PMI, Open MPI, PMIx).
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
#: Where they put the job's number of ranks.
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")


def launched() -> bool:
    """Whether an MPI launcher started this process (it set a rank variable); else one plain process."""
    return any(os.environ.get(name, "").isdigit() for name in RANK_VARIABLES)


def launcher_rank() -> int:
    """This process's rank as the MPI launcher set it in the environment (0 when not launched); on a simulated
    rank of `spmdsim mpirun`, a process of its job that shares this process's environment, that rank."""
    context = current()
    if context.launcher == MPIRUN:
        return context.rank
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return 0


#: The longest a rank other than 0 waits under Open MPI's launcher for rank 0 to print an error every rank met.
SAY_WAIT_S = 10.0


def after_rank0_says(code: int) -> int:
    """`code`, returned once rank 0 may have printed the error every process of the job met (each checked the
    same command line; rank 0 alone says it). Open MPI's launcher ends the whole job as soon as a process
    exits non-zero, so a rank that exited first cut rank 0's line (bench.py's usage error: none in 4 runs of
    6, only the launcher's banner): under it a rank other than 0 waits, till the launcher kills it as rank 0
    exits, SAY_WAIT_S at most. MPICH's waits for every process, so no rank waits there."""
    if code and launcher_rank() != 0 and os.environ.get("OMPI_COMM_WORLD_RANK", "").isdigit():
        time.sleep(SAY_WAIT_S)
    return code


def launcher_size() -> int:
    """The number of ranks the MPI launcher started, as its environment says (1 when not launched)."""
    for name in SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def cores_available() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def launcher_local_ranks() -> int | None:
    """Ranks on this node as the MPI launcher's environment says, or None outside a launcher."""
    for var in LOCAL_SIZE_VARS:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def thread_cap(ranks_on_node: int) -> int:
    """BLAS threads per rank so that the node's ranks share its cores: at least 1."""
    return max(1, cores_available() // max(1, ranks_on_node))


def _openblas(function: str) -> list[str]:
    """The names OpenBLAS builds export `function` under (numpy's and scipy's; 64-bit integer builds)."""
    return [f"{p}openblas_{function}{s}" for p in ("", "scipy_") for s in ("", "64_", "_64")]


# Thread setters of the BLAS libraries numpy and scipy ship (as threadpoolctl finds them).
_SETTERS = {"openblas": _openblas("set_num_threads"), "mkl_rt": ["MKL_Set_Num_Threads"]}
_GETTERS = {"openblas": _openblas("get_num_threads"), "mkl_rt": ["MKL_Get_Max_Threads"]}
_CORENAMES = _openblas("get_corename")


def _mapped(maps: str, part: str) -> list[str]:
    """Sorted paths of the files this process maps whose `maps` lines hold `part` ([] if unreadable)."""
    try:
        with open(maps) as f:
            return sorted({line.split()[-1] for line in f if part in line})
    except OSError:
        return []


def _loaded_blas(maps: str, kinds: tuple = ("openblas", "mkl_rt")) -> list[tuple[str, str, Any]]:
    """(path, kind, library) of each OpenBLAS/MKL this process has loaded (Linux only: reads `maps`)."""
    found = []
    for path in _mapped(maps, ".so"):
        kind = next((k for k in kinds if re.search(k, os.path.basename(path))), None)
        if kind is None:
            continue
        try:
            found.append((path, kind, ctypes.CDLL(path)))  # already loaded: the same handle, no second copy
        except OSError:
            continue
    return found


def _function(lib: Any, names: list[str]) -> Any:
    """The first of `names` that `lib` exports, or None."""
    return next((getattr(lib, n) for n in names if hasattr(lib, n)), None)


def cap_loaded_blas(threads: int, maps: str = "/proc/self/maps") -> list[str]:
    """Set the thread count of every OpenBLAS/MKL this process has loaded; the paths set (Linux only).

    Thread variables are read when a BLAS loads, so after numpy loaded the library itself must be called.
    """
    done = []
    for path, kind, lib in _loaded_blas(maps):
        setter = _function(lib, _SETTERS[kind])
        if setter is not None:
            setter.argtypes = (ctypes.c_int,)
            setter(threads)
            done.append(path)
    return done


def loaded_blas_threads(maps: str = "/proc/self/maps") -> int | None:
    """The thread count of the first OpenBLAS/MKL this process has loaded, or None (none found)."""
    for _, kind, lib in _loaded_blas(maps):
        getter = _function(lib, _GETTERS[kind])
        if getter is not None:
            getter.restype = ctypes.c_int
            return int(getter())
    return None


@contextlib.contextmanager
def blas_threads(threads: int, maps: str = "/proc/self/maps") -> Iterator[None]:
    """Every loaded OpenBLAS/MKL on `threads` threads inside the block, each back to its own count after."""
    saved = []
    for _, kind, lib in _loaded_blas(maps):
        getter, setter = _function(lib, _GETTERS[kind]), _function(lib, _SETTERS[kind])
        if getter is None or setter is None:
            continue
        getter.restype, setter.argtypes = ctypes.c_int, (ctypes.c_int,)
        saved.append((setter, getter()))
        setter(threads)
    try:
        yield
    finally:
        for setter, count in saved:
            setter(count)


def blas_kernels(maps: str = "/proc/self/maps") -> str | None:
    """The kernels the loaded OpenBLAS runs ("SkylakeX", "Haswell"), or None (no OpenBLAS, not Linux).

    OpenBLAS picks them for the CPU unless OPENBLAS_CORETYPE names others (on an AVX-512 CPU
    pinned to "Haswell" a float32 matmul takes 1.6x as long); the benchmarks print it.
    """
    for _, _, lib in _loaded_blas(maps, ("openblas",)):
        getter = _function(lib, _CORENAMES)
        if getter is not None:
            getter.restype = ctypes.c_char_p
            name = getter()
            return name.decode(errors="replace").strip() if name else None
    return None


def blas_kernels_text() -> str:
    """One phrase for a benchmark's header: "numpy BLAS kernels SkylakeX" (and the pin, if one is set)."""
    kernels = blas_kernels()
    if kernels is None:
        return "numpy BLAS kernels unknown (not OpenBLAS)"
    pinned = os.environ.get("OPENBLAS_CORETYPE")
    return f"numpy BLAS kernels {kernels}" + (f" (OPENBLAS_CORETYPE={pinned})" if pinned else "")


def threads_set_by_user() -> bool:
    """Whether the user asked for a thread count in THREAD_VARS: then their choice stands. A value that is no
    count (``abc``, ``0``, ``-1``) asks for none: OpenBLAS then starts a thread per core in every rank, the pools
    that made 8 ranks on 2 cores 20x slower, so it is capped as if unset."""
    return user_thread_count() is not None


def thread_count(value: str | None) -> int | None:
    """The count a *_NUM_THREADS value asks for: a positive integer, or the first of OpenMP's list (``4,2``); else
    None."""
    first = (value or "").split(",")[0].strip()
    return int(first) if first.isascii() and first.isdigit() and int(first) > 0 else None  # isdigit alone takes '²'


def user_thread_count(env: Optional[Mapping[str, str]] = None) -> int | None:
    """The BLAS thread count the user's variables (in `env`, default this process's) ask for (OpenBLAS's and MKL's
    own first), or None."""
    env = os.environ if env is None else env
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        count = thread_count(env.get(var))
        if count is not None:
            return count
    return None


def cap_blas_threads_under_launcher() -> int | None:
    """Under an MPI launcher, cap BLAS threads at this rank's share of the cores; the cap or None.

    When the user set a count in any of THREAD_VARS, it goes to the loaded BLAS
    instead and None is returned (a variable set after numpy loaded its BLAS is
    otherwise never read: 8 ranks on 2 cores with two threads each ran a
    training step 15x slower). Else (none set, or only values that are no count:
    `threads_set_by_user`) sets the variables (for BLAS loaded later and child
    processes) and the loaded BLAS libraries.
    """
    ranks = launcher_local_ranks()
    if ranks is None:
        return None
    users = user_thread_count()
    if users is not None:
        cap_loaded_blas(users)
        return None
    threads = thread_cap(ranks)
    for var in THREAD_VARS:
        os.environ[var] = str(threads)
    cap_loaded_blas(threads)
    return threads
