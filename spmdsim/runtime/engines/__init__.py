"""Engines: what a mesh's transfers and local work run on (docs/explanation/architecture.md, "Engines").

Three engines answer one interface (`Engine`, engines/base.py: one method per
kind of transfer, each taking buffers): `MPI` (engines/mpi.py: ranks are
processes, groups are mpi4py sub-communicators; the one module that calls
mpi4py's communicator methods), the thread engine of spmdsim.runtime.sim.thread_engine
(simulated ranks in one process, groups are `Member`s meeting in a
rendezvous) and the dry engine of spmdsim.runtime.sim.dry (one rank stands for all:
groups are sized, nothing moves, local work makes shape-only zeros). A
communicator names its engine (``comm.spmdsim_engine``; mpi4py's have none:
MPI); the running rank's context (`spmdsim.base.context`) names the engine of the
code that runs now.

Imports numpy (on first use), spmdsim.base.context, spmdsim.errors, spmdsim.base.flops and spmdsim.base.precision
(when a block is first multiplied: each local product is counted there while a FLOP counter is open;
their dataclasses are not on `spmdsim mpirun`'s start) and spmdsim.base.threads (how many
cores a rank has, for the polite wait of engines/wait.py); mpi4py only when
the MPI engine makes its first transfer or a wait mode is resolved; to read a
trace, the step kinds' byte formulas; never the runtime or spmdsim.runtime.sim.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from ..._lazy import modules_by_name
from .base import DONE, DRY_VALUES_BYTES, Engine, SimulationError
from .mpi import MPI, MpiEngine
from ...base.context import MPIEXEC, MPIRUN, ONE_PROCESS, PROCESS, SIMULATE, RankContext, current, enter, leave
from ...base.context import simulated
from ...base.context import _THREAD  # the running thread's context (current()'s read, without its call)
from ...base.once import once
from ...base.ranks import is_ranks_flag
from ...errors import RankCountError

__all__ = ["Engine", "MpiEngine", "MPI", "DONE", "SimulationError", "engine_of", "RankContext", "PROCESS",
           "current", "simulated", "enter", "leave", "local", "c_order", "matmul", "once", "world", "launcher",
           "ways_out", "advised"]


def launcher(size: int) -> str:
    """How the running rank's world, of `size` ranks, was started: its simulation's (SIMULATE, MPIRUN), else an MPI
    process's: MPIEXEC, or ONE_PROCESS where the world is one rank (spmdsim.base.context)."""
    started = _THREAD.context.launcher
    return started if started is not None else MPIEXEC if size > 1 else ONE_PROCESS


def ways_out(n: int, size: int = 1, started: Optional[str] = None) -> str:
    """What a run of `size` ranks (default one process) that needs `n` says after its error: how to get `n`.

    `started`: how the run was started (launcher(size), by default), whose way comes first: simulated ranks'
    --ranks, `spmdsim mpirun -n`'s, or mpiexec's."""
    started = launcher(size) if started is None else started
    if started == MPIRUN:  # mpirun reads neither --ranks nor spmdsim.simulate
        return f" (run {n} ranks: spmdsim mpirun -n {n} ..., or mpiexec -n {n} ...)"
    if started == ONE_PROCESS and _ranks_given():  # `python prog.py --ranks 8` with no script(__file__)
        return (f" (one process: --ranks is read by spmdsim.script(__file__), which this program does not call "
                f"before its work; call it first under `if __name__ == \"__main__\":`, or launch {n} ranks with "
                f"`mpiexec -n {n} ...`)")
    if size == 1:
        return (f" (one process: launch {n} ranks with `mpiexec -n {n} ...`, or simulate them in this "
                f"process with `--ranks {n}` / spmdsim.simulate({n}, main))")
    if started == SIMULATE:
        return (f" (simulate {n} ranks with `--ranks {n}` / spmdsim.simulate({n}, main), or launch them with "
                f"`mpiexec -n {n} ...`)")
    return (f" (launch {n} ranks with `mpiexec -n {n} ...`, or simulate them in one process with `--ranks {n}` / "
            f"spmdsim.simulate({n}, main))")


def advised(exc: BaseException, size: int) -> BaseException:
    """A RankCountError over the whole world as its report shows it: with how to get its ranks as it was started.

    `exc` (a RankCountError of a world of `size` ranks that does not yet say how to get the ranks it needs) gains
    that advice, ways_out's, after its message, in place; any other exception (one over part of the world: the
    program's own split) is returned as it is. The reporters call it (an MPI rank's excepthook, a simulated rank's
    end), so a program raises ``RankCountError(text, needed, comm.size)`` and its user reads the way that fits."""
    if isinstance(exc, RankCountError) and not exc.ways and exc.needed > 0 and exc.size == size:
        exc.advise(ways_out(exc.needed, size, launcher(size)))
    return exc


def _ranks_given() -> bool:
    """Whether this process's command line names --ranks (as spmdsim.script reads it)."""
    return any(map(is_ranks_flag, sys.argv[1:]))


def engine_of(comm: Any) -> Engine:
    """The engine a communicator belongs to: its ``spmdsim_engine``, else (an mpi4py one) MPI."""
    return getattr(comm, "spmdsim_engine", MPI)


def world() -> Any:
    """The running rank's world communicator: its simulation's, else mpi4py's ``COMM_WORLD``."""
    comm = current().comm
    if comm is not None:
        return comm
    from ..mpi_library import SIMULATE_INSTEAD, load_mpi

    return load_mpi(SIMULATE_INSTEAD).COMM_WORLD


def local(fn: Callable[..., Any], like: Any, *args: Any) -> Any:
    """``fn(*args)``, a local kernel whose result is shaped and typed like `like`, on the running engine.

    The dry engine's `local` gives its zeros; any other engine's is Engine.local's ``fn(*args)``, called here."""
    engine = _THREAD.context.engine
    return engine.local(fn, like, *args) if engine.dry else fn(*args)


def c_order(a: Any) -> Any:
    """``a.copy()`` in C order on the running engine: a dry run's of DRY_VALUES_BYTES or more is the dry engine's zeros.

    `a`: a strided view (a slice of an inner dim, a transpose) that a result or a gradient needs in C order. The
    dry zeros have no page written (the real run's copy is as large, and as new a block); a smaller copy keeps
    its values, as the dry engine's small results do. ``a.copy()``, not np.ascontiguousarray: a captured step
    records a traced block's copy (spmdsim.runtime.replay)."""
    if a.nbytes >= DRY_VALUES_BYTES:  # (a smaller block, most an eager step moves: no engine asked)
        engine = current().engine
        if engine.dry:
            return engine.local(_copy, a, a)
    return a.copy()


def _copy(a: Any) -> Any:
    return a.copy()


def matmul(a: Any, b: Any) -> Any:
    """``np.matmul(a, b)`` on the running engine (the dry engine's zeros of its shape, not multiplied);
    counted by spmdsim.base.flops either way."""
    out = _THREAD.context.engine.matmul(a, b)
    (_GEMM[0] or _bind_gemm())(a.shape, b.shape, out.dtype, (a, b, out))
    return out


#: spmdsim.base.flops.gemm, bound by the first `matmul` (not at the top: spmdsim mpirun's start loads no
#: dataclasses; not per call: an import statement inside a function runs importlib's Python each time).
_GEMM: list = [None]


def _bind_gemm() -> Callable[..., None]:
    from ...base.flops import gemm

    _GEMM[0] = gemm
    return gemm


# Its modules by name, loaded on first use: spmdsim.runtime.engines.<module> after a bare `import spmdsim`.
__getattr__ = modules_by_name(__name__)
