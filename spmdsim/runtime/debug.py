"""Debug mode for collectives: a divergence guard and a watchdog (docs/explanation/reliability.md).

Divergence guard (``SPMDSIM_CHECK=1`` or ``configure(check=True)``): before each
collective the ranks of its group Allgather a fixed-size int64 fingerprint
(sequence number, operation, axes, dtype, shape, extra arguments, group size);
when the rows differ every member raises the same RuntimeMismatchError naming
the first rank that differs from the majority. Alltoallv also compares every
pair's counts; Mesh compares each request for a new axis group.

Watchdog (``SPMDSIM_WATCHDOG=seconds`` or ``configure(watchdog=...)``): every
collective (and fingerprint exchange) is posted nonblocking and polled; past
the deadline the rank asks its group where they are (runtime._roster), prints
who waits where and who is missing, and aborts the job (process.abort_job). A
simulated rank waits as without it (`waiter`): its simulation times each of its
waits, mpi4py's calls included (spmdsim.runtime.sim.engine.World.wait), and raises.

The settings are the running rank's (`Hooks`, ``current().hooks``): an MPI
rank's are its process's (`HOOKS`); a simulated rank starts from a copy of
the process's made when simulate() starts, and configure() on it changes that
rank's alone, so a simulation beside it (another thread's simulate()) and the
process keep theirs.

The sequence number counts the collectives this rank issued (groups of one
rank included), the check's Allgather and DTensor.gather, so a rank that issued
one more or one fewer than its peers is caught at its next collective. That
count must agree only among ranks that run one program: a pipeline's stages
make their own numbers of calls on their own groups, so they agree on the
largest (`agree`) before a collective they share inside a step (the clip's
Allreduce over pp) and after each step (spmdsim.models.gpt.pipeline). mpi4py
is imported only when a watched wait lasts longer than 0.1 s, or to abort.
"""
from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any, Callable, Optional, Sequence

from ..errors import RuntimeMismatchError, SpmdsimError
from ..base.context import PROCESS, current as _context, simulated as _simulated
from . import _roster
from .engines import engine_of
from .engines import wait as waiting
from .fingerprints import FINGERPRINT_FIELDS, _cached_row, describe
from .process import abort_job
from .._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["Hooks", "HOOKS", "configure", "check_enabled", "watchdog_seconds", "quiet", "next_seq", "current_seq",
           "agree", "verify", "verify_counts", "verify_operands", "wait", "begin",
           "waiter", "CHECK_WATCHDOG_S", "add_cli_arguments",
           "configure_from_args", "MIN_WATCHDOG_S", "MAX_WATCHDOG_S", "watchdog_setting"]

#: The shortest watchdog: it reports a collective that never completes, and a healthy one on
#: oversubscribed ranks (8 on 2 cores) can take a good part of a second; a shorter limit would
#: abort correct programs naming a rank as missing that is only on its way.
MIN_WATCHDOG_S = 1.0
#: The longest watchdog: a week (a wait past threading.TIMEOUT_MAX, ~292 years, overflows the platform's time_t).
MAX_WATCHDOG_S = 7 * 24 * 3600.0


class Hooks:
    """One rank's debug settings: whether the divergence guard and the watchdog are on.

    The process has its own (`HOOKS`, the settings of an MPI rank or of a plain
    process); each simulated rank gets a copy of the process's when simulate()
    starts (spmdsim.runtime.sim.run), so configure() on a simulated rank changes that
    rank's and nothing beside it, as configure() on an MPI rank changes that
    process's. The running rank's are ``current().hooks`` (spmdsim.base.context).

    ``quiet``: True when neither hook is on, one attribute read for hot paths
    (worked out on first read and after configure()); the rest are the
    settings (None: read the environment on first use). The collectives' call
    counter is the running rank's (``current().seq``).
    """

    __slots__ = ("check", "watchdog", "watchdog_read", "watchdog_set", "quiet", "world")

    def __init__(self, like: Optional["Hooks"] = None) -> None:
        """Settings read from the environment on first use, or, given `like`, a copy of its settings."""
        self.check: Optional[bool] = None if like is None else like.check
        self.watchdog: Optional[float] = None if like is None else like.watchdog
        self.watchdog_read = False if like is None else like.watchdog_read
        # configure() chose the watchdog: the environment and the default step aside
        self.watchdog_set = False if like is None else like.watchdog_set
        # A simulated rank's: its simulation's World (spmdsim.runtime.sim.engine), whose waits the watchdog then
        # times (`World.watched`, set by configure()); None for the process's and a copy (_reset keeps it)
        self.world: Any = getattr(self, "world", None) if like is None else None
        # `quiet` stays unset until first read (__getattr__)

    def __getattr__(self, name: str) -> Any:
        # Reached only for an unset slot: `quiet` is worked out once, then a plain read.
        if name != "quiet":
            raise AttributeError(name)
        self.quiet = not self.check_enabled() and self.watchdog_seconds() is None
        return self.quiet

    def check_enabled(self) -> bool:
        """Whether collectives compare fingerprints first (SPMDSIM_CHECK)."""
        if self.check is None:
            self.check = _flag("SPMDSIM_CHECK")
        return self.check

    def watchdog_seconds(self) -> Optional[float]:
        """The watchdog's timeout in seconds, or None when it is off (SPMDSIM_WATCHDOG)."""
        if not self.watchdog_read:
            raw = os.environ.get("SPMDSIM_WATCHDOG")
            if raw is None or not raw.strip():
                self.watchdog = CHECK_WATCHDOG_S if self.check_enabled() else None
            else:
                self.watchdog = watchdog_setting(raw, "SPMDSIM_WATCHDOG")
            self.watchdog_read = True
        return self.watchdog

    def configure(self, check: Optional[bool], watchdog: Any) -> None:
        """configure()'s work on these settings (its arguments as it takes them)."""
        if check is not None:
            self.check = bool(check)
            if not self.watchdog_set:
                self.watchdog_read = False  # its default follows the guard
        if watchdog != "keep":
            self.watchdog = watchdog_setting(watchdog, "watchdog")
            self.watchdog_read = self.watchdog_set = True
        if self.world is not None:
            self.world.watched = True  # its waits read this rank's watchdog from now on
        self.forget_quiet()

    def forget_quiet(self) -> None:
        """Work `quiet` out again on its next read (the settings changed)."""
        try:
            del self.quiet
        except AttributeError:
            pass


#: The process's settings (an MPI rank's, or a plain process's); a simulated rank has its own.
HOOKS = PROCESS.hooks = Hooks()


def _reset() -> None:
    """The running rank's settings back to 'read the environment on first use', its counter to 0 (tests)."""
    context = _context()
    context.hooks.__init__()
    context.seq = 0
    context.hooks.forget_quiet()


#: The watchdog the divergence guard turns on when SPMDSIM_WATCHDOG is unset (a rank that skips a
#: call would leave the others waiting forever); long enough for a slow local step on a loaded laptop.
CHECK_WATCHDOG_S = 300.0


def _flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise SpmdsimError(f"{name}={value!r} is not a switch; expected 1/0, true/false, yes/no or on/off")


def watchdog_setting(value: Any, what: str) -> Optional[float]:
    """The watchdog's seconds from a setting named `what` (None, "", "0" and "off": no watchdog).

    Raises SpmdsimError for anything else that is not a number of seconds from MIN_WATCHDOG_S to
    MAX_WATCHDOG_S.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "off", "none")):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise SpmdsimError(f"{what} {value!r} is not a number of seconds") from None
    if seconds == 0:
        return None
    if not 0 < seconds < float("inf"):
        raise SpmdsimError(f"{what} {value!r} must be a positive, finite number of seconds (0 = off)")
    if seconds < MIN_WATCHDOG_S:
        raise SpmdsimError(f"{what} {value!r} is below the watchdog's minimum of {MIN_WATCHDOG_S:g} s (a healthy "
                           "collective on oversubscribed ranks can take most of a second); expected seconds "
                           f">= {MIN_WATCHDOG_S:g}, or 0 for off")
    if seconds > MAX_WATCHDOG_S:
        raise SpmdsimError(f"{what} {value!r} is above the watchdog's maximum of {MAX_WATCHDOG_S:,.0f} s (a week); "
                           f"expected seconds from {MIN_WATCHDOG_S:g} to {MAX_WATCHDOG_S:,.0f}, or 0 for off")
    return seconds


def configure(check: Optional[bool] = None, watchdog: Any = "keep") -> None:
    """Turn the divergence guard on/off and set the watchdog (seconds; None or 0 = off), on every rank alike.

    Arguments left out keep the current setting (the environment's until first changed).
    Called on a simulated rank it sets that rank's settings (every rank of the
    simulation calls it, as every MPI rank would), else the process's: a
    simulation beside it, or started later from its copy, is not changed.
    """
    _context().hooks.configure(check, watchdog)


def add_cli_arguments(parser: Any) -> None:
    """Add ``--check`` and ``--watchdog SECONDS`` to an argparse parser (MPI subcommands)."""
    parser.add_argument("--check", action="store_true",
                        help="before each collective, compare the call across its group and stop "
                             "with a message naming the rank that differs (SPMDSIM_CHECK=1)")
    parser.add_argument("--watchdog", metavar="SECONDS", default=None,
                        help="abort the job when a collective has not completed after SECONDS "
                             "(SPMDSIM_WATCHDOG; default off, 300 with --check; 0 = off)")


def configure_from_args(args: Any) -> None:
    """Apply ``--check``/``--watchdog``; call it on every rank inside the guard (a bad value
    then raises the same SpmdsimError everywhere and prints once)."""
    watchdog = getattr(args, "watchdog", None)
    configure(check=True if getattr(args, "check", False) else None,
              watchdog="keep" if watchdog is None else watchdog_setting(watchdog, "--watchdog"))


def check_enabled() -> bool:
    """Whether the running rank's collectives compare fingerprints first (SPMDSIM_CHECK)."""
    return _context().hooks.check_enabled()


def watchdog_seconds() -> Optional[float]:
    """The running rank's watchdog timeout in seconds, or None when it is off (SPMDSIM_WATCHDOG).

    Unset: off, or CHECK_WATCHDOG_S with the divergence guard; 0 turns it off even then.
    """
    return _context().hooks.watchdog_seconds()


def quiet() -> bool:
    """True when neither the divergence guard nor the watchdog is on for the running rank (its ``hooks.quiet``)."""
    return _context().hooks.quiet


def next_seq() -> int:
    """Count one more collective and return its sequence number (1-based)."""
    context = _context()
    context.seq += 1
    return context.seq


def current_seq() -> int:
    return _context().seq


def agree(comm: Any, axes: Sequence[str], polite: bool, always: bool = False) -> None:
    """With SPMDSIM_CHECK or the watchdog on, before a collective on `comm` whose members ran different programs
    since they last shared one (a pipeline's stages, each making its own number of collectives on its own
    groups, before the clip's Allreduce over pp, and after a pipelined step): their call counters become the
    largest of them.

    The guard compares the call number, a count of every collective the rank issued, which must agree only
    among ranks that run one program; without this the stages' counts differ on `comm` and the guard
    refuses a correct call (a false alarm), or they agree by chance. The watchdog's report (`wait`) groups
    the ranks waiting in one call by its number too. One int64 Allreduce (max), neither numbered nor traced,
    waited as the mesh's calls are (the watchdog's too); nothing on a group of one, or with neither hook on
    unless `always` (a pipelined step's end: the counters stay even for a hook turned on later). A kernel where
    a step is captured (spmdsim.nn.optim's clipping), so each replay agrees.
    """
    context = _context()
    if context.hooks.quiet and not always or comm.Get_size() == 1:
        return
    counter = np.array([context.seq], np.int64)
    engine_of(comm).all_reduce(comm, counter, counter, "max", waiter("agree", axes, context.seq, polite, comm))
    context.seq = int(counter[0])


def _world_rank() -> int:
    state = _simulated()
    if state is not None:
        return state.rank
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


def verify(comm: Any, op: str, axes: Sequence[str], dtype: Any, shape: Optional[Sequence[int]],
           extra: Sequence[Any], seq: int, polite: bool) -> None:
    """Compare this call's fingerprint with every member of `comm`; raise on all of them if any differs."""
    g = comm.Get_size()
    mine = _cached_row(op, tuple(axes), np.dtype(dtype).str,
                       None if shape is None else tuple(shape), tuple(extra), g).copy()
    mine[1] = seq
    table = np.empty((g, FINGERPRINT_FIELDS), np.int64)
    engine = engine_of(comm)
    engine.all_gather(comm, mine, table, waiter(op, axes, seq, polite, comm))
    if (table == mine).all():
        return
    rows = [tuple(r) for r in table.tolist()]
    # The majority call is taken as intended; ties go to the lowest group rank (most_common keeps row order).
    expected, best = Counter(rows).most_common(1)[0]
    bad = next(i for i, r in enumerate(rows) if r != expected)
    good = rows.index(expected)
    # Every member saw the same table, so all of them take this extra exchange.
    notes = engine.all_gather_object(comm, (_world_rank(), describe(seq, op, axes, dtype, shape, extra)))
    raise RuntimeMismatchError(f"collectives diverge: rank {notes[bad][0]} calls {notes[bad][1]} but rank "
                               f"{notes[good][0]} calls {notes[good][1]}"
                               + (f" ({best} of {g} ranks of the group agree)" if g > 2 else ""))


def verify_operands(mesh: Any, op: str, operands: Sequence[tuple[str, Any, Any, Any]]) -> None:
    """With SPMDSIM_CHECK, compare an operation's operands, (name, global shape, layout, dtype) each, across the mesh.

    A global shape or layout computed differently on some rank can leave every
    collective's buffer the same size, so their fingerprints match and the
    result is silently wrong. Without the guard it returns at once.
    """
    if not check_enabled() or mesh.comm.Get_size() == 1:
        return
    extra = tuple(f"{name} {tuple(int(n) for n in shape)!r} {layout} {np.dtype(dtype).name}"
                  for name, shape, layout, dtype in operands)
    verify(mesh.comm, f"{op} operands", (), operands[0][3], None, extra, next_seq(), mesh.polite)


def verify_counts(comm: Any, sends: Any, receives: Any, seq: int, polite: bool) -> None:
    """Alltoallv: what each rank sends to rank j must be what j expects from it (MPI would truncate).

    One Allgather of both count vectors; every rank raises the same error for the first pair that disagrees.
    """
    g = comm.Get_size()
    mine = np.concatenate([np.asarray(sends, np.int64), np.asarray(receives, np.int64)])
    table = np.empty((g, 2 * g), np.int64)
    engine_of(comm).all_gather(comm, mine, table, waiter("alltoallv", (), seq, polite, comm))
    sent, expected = table[:, :g], table[:, g:]
    bad = np.argwhere(sent != expected.T)  # sent[i, j]: i -> j; expected[j, i]: j expects from i
    if bad.size:
        i, j = (int(v) for v in bad[0])
        raise RuntimeMismatchError(f"alltoallv counts disagree (seq {seq}): rank {i} sends {int(sent[i, j])} "
                                   f"elements to rank {j}, which expects {int(expected[j, i])}"
                                   + (f" ({len(bad)} pairs disagree)" if len(bad) > 1 else ""))


def wait(request: Any, op: str, axes: Sequence[str], seq: int, polite: bool,
         on_timeout: Optional[Callable[[str], None]] = None, comm: Any = None) -> None:
    """Complete `request`; past the watchdog deadline report and abort the job.

    `comm`: the communicator the request is on (None: unknown, the world is
    asked). A wait longer than _roster.SERVE_S answers the other ranks'
    watchdogs between polls. `on_timeout(text)` replaces the abort (tests); the
    request is then left pending.
    """
    limit = watchdog_seconds()
    if limit is None:
        if polite:
            waiting.polite_wait(request)
        else:
            request.Wait()
        return
    now = time.monotonic()
    deadline = now + limit
    # Sliced only past the first SERVE_S: a call that completes sooner polls exactly as before.
    if waiting.wait_until(request, min(deadline, now + _roster.SERVE_S), polite):
        return
    state = (op, tuple(axes), seq)
    side = _roster.channel(comm)
    while (now := time.monotonic()) < deadline:
        if side is not None:
            _roster.serve(side[0], state)
        if waiting.wait_until(request, min(deadline, now + _roster.SERVE_S), polite):
            return
    me = _world_rank()
    answers = _roster.survey(comm, state, min(1.0, max(0.25, limit / 2)))
    shown = f"{limit:.1f}" if limit >= 1 else f"{limit:g}"
    text = (f"[rank {me}] spmdsim: collective {op} {_roster.on_axes(axes)} (seq {seq}) did not "
            f"complete within {shown} s" + _roster.explain(state, answers, comm is not None,
                                                       check_enabled()))
    if on_timeout is not None:
        on_timeout(text)
        return
    same = [r for r, where in (answers or {}).items() if where == state]
    if same and me != min(same):
        _roster.linger(comm, state, 1.0)  # the lowest waiting rank reports: one message, not g
    _abort(text)


def begin(comm: Any, op: str, axes: Sequence[str], dtype: Any, shape: Optional[Sequence[int]],
          extra: Sequence[Any], polite: bool, counts: Optional[tuple] = None) -> int:
    """Number one collective on `comm` and return its sequence number; with SPMDSIM_CHECK compare it first.

    `shape` None is left out of the comparison; `counts` (an Alltoallv's send and receive counts) are compared too.
    """
    seq = next_seq()
    if check_enabled() and comm.Get_size() > 1:
        verify(comm, op, axes, dtype, shape, extra, seq, polite)
        if counts is not None:
            verify_counts(comm, counts[0], counts[1], seq, polite)
    return seq


def waiter(op: str, axes: Sequence[str], seq: int, polite: bool, comm: Any = None) -> Optional[Callable[[Any], None]]:
    """How to wait for call `seq` (an engine's `wait`, engines/base.py): None for the blocking call; the
    polite wait; with SPMDSIM_WATCHDOG, `wait` above (a rank left waiting reports and ends the job). A
    simulated rank waits as without it: its simulation times every wait of its own (spmdsim.runtime.sim.engine's
    World.wait), and reports a deadlock at once, where polling would see one only after POLL_STALL_S."""
    if watchdog_seconds() is None or _simulated() is not None:
        return waiting.polite_wait if polite else None
    return lambda request: wait(request, op, axes, seq, polite, comm=comm)


def _abort(text: str) -> None:
    if _simulated() is not None:  # a simulated rank raises; simulate() ends the others
        raise RuntimeMismatchError(text)
    from mpi4py import MPI

    abort_job(MPI.COMM_WORLD, text + "\n")
