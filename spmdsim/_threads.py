"""Cores, ranks per node and BLAS thread caps; standard library only.

Imported by `spmdsim/__init__.py` before numpy, so that a rank started by an
MPI launcher caps its BLAS thread pool to its share of the node's cores. With
numpy's default pools, 8 ranks on 2 cores ran a measured job 20x slower
(docs/oversubscription.md); a user's own setting always wins.
"""
from __future__ import annotations

import os

__all__ = ["THREAD_VARS", "LOCAL_SIZE_VARS", "cores_available", "launcher_local_ranks",
           "thread_cap", "cap_blas_threads_under_launcher"]

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

# Launchers that tell each rank how many ranks share its node.
LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_SIZE",
                   "SLURM_NTASKS_PER_NODE")


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


def cap_blas_threads_under_launcher() -> None:
    """Under an MPI launcher, default every unset BLAS thread variable to this rank's share."""
    ranks = launcher_local_ranks()
    if ranks is None or any(var in os.environ for var in THREAD_VARS):
        return
    threads = str(thread_cap(ranks))
    for var in THREAD_VARS:
        os.environ[var] = threads
