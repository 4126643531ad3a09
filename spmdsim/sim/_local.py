"""Which simulated rank the running thread is (spmdsim.sim); imports nothing.

The runtime reads `current()` where its behaviour differs in one process
(guards, the default communicator); the hot paths of runtime.collectives never do.
"""
from __future__ import annotations

import threading
from typing import Any, Optional

_THREAD = threading.local()


def current() -> Optional[Any]:
    """The running thread's simulated-rank state (spmdsim.sim.run.RankState), or None outside simulate()."""
    return getattr(_THREAD, "state", None)


def enter(state: Any) -> None:
    _THREAD.state = state


def leave() -> None:
    _THREAD.state = None
