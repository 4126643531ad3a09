"""How a simulated rank ends the whole run, as MPI_Abort (and an error under a fatal error handler) ends an MPI
job: every process killed at once, the call never returning.

`end_every_rank` notes the failure on the rank's World now, then stops the caller with `Aborted`, a
BaseException: a program's ``except Exception`` around the call cannot keep the rank going (it printed and went
on, exit 0), and from a thread the rank started it ends the run too (Python printed it there, and the ranks went
on). The failure ends the run (`spmdsim_ends_run`): the other ranks stop at their next wait, sleep or collective,
and those computing outside MPI are left after half a second (spmdsim.runtime.sim.engine.World.given_up), where
they ran to their next MPI call, printing as they went.
"""
from __future__ import annotations

import sys
import types
from typing import NoReturn, Optional

from ..base import context as _local
from ..runtime.sim.engine import Aborted

__all__ = ["end_every_rank"]


def end_every_rank(error: BaseException) -> NoReturn:
    """End every simulated rank with `error` (its `abort_code` is the exit code spmdsim mpirun reports), called
    on a simulated rank, from its own thread or one it started."""
    error.spmdsim_ends_run = True  # type: ignore[attr-defined]
    error.with_traceback(_stack(sys._getframe(1)))  # where it was called, as if raised there (the lab's line)
    state = _local.simulated()
    world = state.comm._group.world  # (the rank's World: spmdsim.emulator.rank_threads finds it so too)
    world.fail(state.rank, error)
    raise Aborted(world.failure)


def _stack(frame: Optional[types.FrameType]) -> Optional[types.TracebackType]:
    """A traceback of `frame` and the frames that called it, outermost first, as an exception raised in `frame`
    and caught where the thread started has (without threading's own frames, which start it)."""
    tb = None
    while frame is not None and frame.f_globals.get("__name__") != "threading":
        tb = types.TracebackType(tb, frame, frame.f_lasti, frame.f_lineno)
        frame = frame.f_back
    return tb
