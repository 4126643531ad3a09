"""Which rank the running code is, and on which engine: the one question the runtime asks of where it runs.

An MPI rank is a process: its code runs in `PROCESS`, the process's own
context. A simulated rank is a thread of a simulation (spmdsim.runtime.sim): the
thread that runs it enters that rank's `RankContext` and leaves it when the
rank ends, so two simulations (two threads calling ``spmdsim.simulate``) keep
their ranks apart. The runtime keeps nothing per rank anywhere else: the open
trace collectors, the collective counter, the debug settings, a dry run's byte
meter, the open FLOP counters and the phase they count in (spmdsim.base.flops), and
the table of work done once for all ranks are the context's.

Imports nothing of spmdsim: every layer may ask (datagen included, which the engines sit above).
"""
from __future__ import annotations

import threading
from typing import Any, Optional

__all__ = ["RankContext", "PROCESS", "current", "simulated", "enter", "leave", "SIMULATE", "MPIRUN", "MPIEXEC",
           "ONE_PROCESS"]

#: How a world was started (`RankContext.launcher`; spmdsim.runtime.engines.launcher): simulated ranks of
#: spmdsim.simulate or --ranks, or of `spmdsim mpirun`; MPI processes of mpiexec, or one plain process.
SIMULATE, MPIRUN, MPIEXEC, ONE_PROCESS = "simulate", "spmdsim mpirun", "mpiexec", "one process"


class RankContext:
    """One rank's own state: who it is, its world communicator and engine, its traces, counter and settings."""

    __slots__ = ("rank", "size", "comm", "engine", "traces", "seq", "hooks", "meter", "shared",
                 "self_comm", "world_comm", "dry_run", "launcher", "guarded", "flops", "phase",
                 "streams", "file_null", "argv", "parent", "appnum", "programs", "home", "__weakref__")

    def __init__(self, rank: Optional[int] = None, size: Optional[int] = None, comm: Any = None,
                 engine: Any = None, dry_run: bool = False, shared: Optional[dict] = None,
                 hooks: Any = None, launcher: Optional[str] = None) -> None:
        self.rank, self.size = rank, size
        self.comm = comm  # the world communicator (None in PROCESS: mpi4py's COMM_WORLD)
        self.engine = engine  # the engine this rank's meshes run on (None in PROCESS: MPI)
        self.traces: list = []  # spmdsim.runtime.trace's open collectors, innermost last
        self.seq = 0  # spmdsim.runtime.debug's collective counter
        # spmdsim.runtime.debug's settings (a Hooks): PROCESS gets its own when debug loads, a
        # simulated rank a copy of PROCESS's when simulate() starts; hot paths read `hooks.quiet`
        self.hooks = hooks
        self.dry_run = dry_run
        # How this rank's world was started: SIMULATE or MPIRUN (`spmdsim mpirun` sets it as each rank starts);
        # None in PROCESS, an MPI process: mpiexec's, or one plain process (its world's size says which)
        self.launcher = launcher
        # Whether its program installed spmdsim's excepthook (spmdsim.runtime.guard.install_excepthook): under
        # `spmdsim mpirun` its uncaught SpmdsimError then ends the run as that hook ends an mpiexec job
        self.guarded = False
        self.meter: Any = None  # a dry run's byte meter (spmdsim.runtime.sim.dry_meter.Meter)
        self.shared = {} if shared is None else shared  # spmdsim.base.once's results, one table per run
        self.self_comm: Any = None  # MPI.COMM_SELF of a simulated rank, made on first use
        self.world_comm: Any = None  # its MPI.COMM_WORLD with mpi4py's methods (spmdsim.emulator), likewise
        self.flops: list = []  # spmdsim.base.flops' open counters, innermost last
        # What the rank's products are part of (spmdsim.base.flop_counts.PHASES): autograd's backward walk sets
        # "backward", a recomputed forward inside it "recompute"
        self.phase = "forward"
        self.streams: Optional[dict] = None  # "stdout"/"stderr" -> the stream the rank set (emulator.rank_streams)
        self.file_null: Any = None  # its MPI.FILE_NULL (spmdsim.emulator.file: new files' error handler), likewise
        # A rank a Spawn started (spmdsim.emulator.spawn): its sys.argv (emulator.rank_streams) and its
        # MPI.Comm.Get_parent(), the intercommunicator to the ranks that spawned it; None for the others
        self.argv: Optional[list] = None
        self.parent: Any = None
        self.appnum = 0  # its MPI.APPNUM: the index of its command in a Spawn_multiple (0: mpiexec's, a Spawn's)
        # The folder its program's own modules are found in first, as `python prog.py` puts prog.py's folder first on
        # sys.path (spmdsim.emulator.rank_modules): a spawned script's or folder's; None for the others
        self.home: Optional[str] = None
        # How a program this rank spawns runs (kind, what): spmdsim mpirun's way of running a rank, else None
        self.programs: Any = None


#: The context of code that no simulation runs: an MPI rank's (or a plain process's).
PROCESS = RankContext()


class _Running(threading.local):
    """Per thread: the context it runs in. A class default, not getattr's: a missing attribute
    raises inside getattr (0.4 us); the class attribute is found in 0.04 us, on every collective."""

    context = PROCESS


_THREAD = _Running()


def current() -> RankContext:
    """The running code's context: its simulated rank's, else `PROCESS`."""
    return _THREAD.context


def simulated() -> Optional[RankContext]:
    """The running simulated rank's context, or None outside a simulation."""
    context = _THREAD.context
    return None if context is PROCESS else context


def enter(context: RankContext) -> None:
    """Make `context` the running thread's (a simulation starts one of its ranks)."""
    _THREAD.context = context


def leave() -> None:
    """The running thread leaves its context (a simulated rank ends)."""
    try:
        del _THREAD.context
    except AttributeError:
        pass
