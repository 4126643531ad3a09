"""What the debug hooks do at each collective (their settings: spmdsim.runtime.debug; docs/explanation/reliability.md).

Divergence guard (``SPMDSIM_CHECK=1``): before each collective the ranks of its group Allgather a
fixed-size int64 fingerprint (sequence number, operation, axes, dtype, shape, extra arguments, group
size); when the rows differ every member raises the same RuntimeMismatchError naming the first rank
that differs from the majority (`begin`, `verify`). Alltoallv also compares every pair's counts
(`verify_counts`); Mesh compares each request for a new axis group.

Watchdog (``SPMDSIM_WATCHDOG=seconds``): every collective (and fingerprint exchange) is posted
nonblocking and polled; past the deadline the rank asks its group where they are (runtime._roster),
prints who waits where and who is missing, and aborts the job (process.abort_job: `wait`). A
simulated rank waits as without it (`waiter`): its simulation times each of its waits, mpi4py's calls
included (spmdsim.runtime.sim.engine.World.wait), and raises.

The sequence number (spmdsim.runtime.debug's `next_seq`) counts the collectives this rank issued
(groups of one rank included), the check's Allgather and DTensor.gather, so a rank that issued one
more or one fewer than its peers is caught at its next collective. That count must agree only among
ranks that run one program: a pipeline's stages make their own numbers of calls on their own groups,
so they agree on the largest (`agree`) before a collective they share inside a step (the clip's
Allreduce over pp) and after each step (spmdsim.models.gpt.pipeline). mpi4py is imported only when a
watched wait lasts longer than 0.1 s, or to abort.
"""
from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Optional, Sequence

from ..errors import DivergenceError, RuntimeMismatchError
from ..base.context import current as _context, simulated as _simulated
from . import _roster
from .debug import check_enabled, next_seq, watchdog_seconds
from .engines import engine_of
from .engines import wait as waiting
from .fingerprints import FINGERPRINT_FIELDS, _cached_row, describe
from .process import abort_job
from .._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["agree", "verify", "verify_counts", "verify_operands", "wait", "begin", "waiter"]


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
    raise DivergenceError(f"collectives diverge: rank {notes[bad][0]} calls {notes[bad][1]} but rank "
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
        raise DivergenceError(f"alltoallv counts disagree (seq {seq}): rank {i} sends {int(sent[i, j])} "
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
