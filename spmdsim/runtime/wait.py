"""How a rank waits inside a collective: "busy" (MPI's own blocking call) or "polite".

Under oversubscription (more ranks than cores) MPICH ranks blocked in a
collective spin and steal the cores the computing ranks need (DESIGN.md
section 6). The polite wait posts the nonblocking collective, spins on
``Test()`` for a few tens of microseconds (so small collectives among ranks
that are all running stay fast), then sleeps between polls with a growing
delay, handing the core to the ranks that still compute.

``SPMDSIM_WAIT=busy|polite|auto`` picks the mode (default auto: polite when
the ranks on this node outnumber the cores this process may run on).
``SPMDSIM_WAIT_SPIN_US`` and ``SPMDSIM_WAIT_SLEEP_US`` tune the spin length and
the longest sleep (0 polls with sched_yield instead of sleeping);
docs/oversubscription.md has the measurements.
"""
from __future__ import annotations

import os
import time
from typing import Any

from ..errors import SpmdsimError

__all__ = ["WAIT_MODES", "resolve_wait_mode", "polite_wait", "cores_available", "local_ranks"]

WAIT_MODES = ("busy", "polite", "auto")

_SPIN_S = float(os.environ.get("SPMDSIM_WAIT_SPIN_US", "50")) * 1e-6
_SLEEP_MAX_S = float(os.environ.get("SPMDSIM_WAIT_SLEEP_US", "100")) * 1e-6
_SLEEP_MIN_S = min(20e-6, _SLEEP_MAX_S)

# Launchers that tell each rank how many ranks share its node.
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")


def cores_available() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def local_ranks(comm: Any) -> int:
    """Ranks of `comm` on this node: from the launcher's environment, else one Split_type.

    The fallback is a collective over `comm`; every rank takes the same path
    because they all see the same launcher environment.
    """
    for var in _LOCAL_SIZE_VARS:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    from mpi4py import MPI

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size()
    finally:
        node.Free()


def resolve_wait_mode(mode: str | None, comm: Any) -> str:
    """Turn "busy"/"polite"/"auto"/None (= $SPMDSIM_WAIT, default auto) into busy or polite."""
    if mode is None:
        mode = os.environ.get("SPMDSIM_WAIT", "auto").strip().lower() or "auto"
    if mode not in WAIT_MODES:
        raise SpmdsimError(f"wait mode {mode!r} is not known; expected one of {WAIT_MODES!r}")
    if mode != "auto":
        return mode
    if comm.Get_size() == 1:
        return "busy"
    return "polite" if local_ranks(comm) > cores_available() else "busy"


def polite_wait(request: Any) -> None:
    """Complete `request` by polling Test(): spin briefly, then sleep with backoff."""
    test = request.Test
    if test():
        return
    clock = time.perf_counter
    deadline = clock() + _SPIN_S
    while clock() < deadline:
        if test():
            return
    if _SLEEP_MAX_S <= 0:
        yield_ = os.sched_yield
        while not test():
            yield_()
        return
    delay = _SLEEP_MIN_S
    sleep = time.sleep
    while not test():
        sleep(delay)
        if delay < _SLEEP_MAX_S:
            delay = min(2.0 * delay, _SLEEP_MAX_S)
