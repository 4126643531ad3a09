"""The one door: where the runtime hands bytes to an engine (docs/explanation/architecture.md, "The path of a byte").

`issue` runs one collective of runtime.collectives, runtime.exchange or
runtime.prepared: the mesh's engine's transfer (spmdsim.runtime.engines.base: one
method per kind, taking buffers), by a plain way (the engine's call, nothing
before it), a watched way (the watchdog alone: numbered, waited by its wait)
or through the layers of runtime/layers.py (the divergence check or an
emulated algorithm), then one trace row. `repeat` runs again a collective
whose first call went through `issue` (what it worked out kept per mesh by
`keep`): the engine's call alone on the plain way with no trace open, else `issue`. The plain way is kept bare because
with 8 ranks on 2 cores each rank runs its pre-MPI Python on cold caches, in
turn, while the group waits. `transfer` runs a transfer outside a mesh (the
divergence check's tables, DTensor's gather), with the debug layers but no
trace; `untraced` runs one bare (a pipeline's loss over its stages); the
``*_object`` functions carry the runtime's control
traffic (gathered report lines and traces, the agreed memory budget). Besides
the door, the layers around a transfer hand an engine their own traffic: the
divergence check its fingerprint tables (runtime.debug_calls) and an emulated
algorithm its point-to-point messages (runtime.algorithms); the guard and the
watchdog's side channel use the engines' job methods (`dup`, `abort`,
`post_object`, ...), and the front ends outside the runtime (CLI, autoshard,
nets) call the engines' object methods themselves. The argument checks the
callers share live in runtime.arguments.
"""
from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from .engines import engine_of
from .engines.wait import polite_wait
from ..errors import SpmdsimError
from . import debug_calls
from .arguments import _TAKEN, _ndarray, _take
from . import layers
from .layers import Collective
from .axes import normalize_axes
from .replay import CAPTURES, capturing, kernel, unrecorded
from ..base.context import current as _context
from ..base.tables import put
from .trace import fold_to, record, record_call, record_to

if TYPE_CHECKING:
    from .mesh import Mesh


def issue(mesh: Mesh, comm: Any, g: int, op: str, axes: Any, label: str | None, run: Callable[..., None],
          args: tuple, result: Any, x: Any, extra: tuple, nbytes: Any, copied: int = 0, t0: float | None = None,
          then: Callable[[], Any] | None = None, counts: tuple | None = None, emulate: bool = True) -> Any:
    """Run one collective over `comm` (g > 1 members) and return `result` (or `then()`).

    Plain (no debug hook on, no ``algorithms=``): the mesh's engine runs the
    transfer; with the watchdog alone on, the same numbered and waited by the
    watchdog (as the layers' Checked and Watched would, without their frames);
    else the layers of runtime/layers.py do (check, emulated algorithm, watchdog).
    Either way one trace row follows for the rank's open traces.

    Args:
        run, args: the transfer, called ``run(comm, *args, wait)``: the mesh's engine's method
            (``mesh.engine.all_reduce``, engines/base.py) or what stands for it (a prepared
            collective's persistent request); its arguments after the communicator and before the
            wait (``(send, recv, "sum")``).
        x, extra: what SPMDSIM_CHECK compares: the array (its dtype and shape;
            a dtype alone where shapes differ by rank) and the call's other arguments.
        nbytes: an int n (the trace records moved_bytes(op, g, n) both ways) or (sent, received).
        copied: the bytes packed and unpacked around the transfer (the trace's bytes_copied).
        t0: when the traced time began (before packing); default: now.
        then: run after the transfer, inside the traced time (unpacking); its value is returned.
        counts: an Alltoallv's (send, receive) counts: compared with SPMDSIM_CHECK, peers for the trace.
        emulate: False keeps the engine's transfer on a mesh made with ``algorithms=`` (prepared collectives).
    """
    # The dtype first, on every engine alike: the thread and dry engines take what MPI refuses (a bool
    # "sum" would be its inputs' OR, a str "sum" its input). One set lookup a call once the dtype was taken.
    dtype = x.dtype if type(x) is _ndarray else x
    if dtype not in _TAKEN[op]:
        _take(op, dtype)
    context = mesh.context  # the running rank's (the mesh's maker's): its open traces and call counter
    traces = context.traces
    hooks = context.hooks
    if (hooks.quiet or hooks.watched) and mesh.algorithms is None:
        if t0 is None and traces:
            t0 = perf_counter()
        context.seq = seq = context.seq + 1
        # the mesh's wait, or with the watchdog alone its wait (the layers' Checked + Watched, without their frames)
        run(comm, *args, (polite_wait if mesh.polite else None) if hooks.quiet else
            debug_calls.waiter(op, normalize_axes(axes), seq, mesh.polite, comm))
        if then is None and not traces:
            return result
        name = op
    else:
        name, moved, t0 = layers.run(Collective(mesh, comm, op, axes, run, args, x, extra, counts), emulate, t0)
        nbytes = nbytes if moved is None else moved
    if then is not None:
        result = then()
    if traces:
        now = perf_counter()
        record_call(traces, name, axes, g, nbytes, now - t0, label, copied, now, counts, dtype)
    return result


class KeptCall(NamedTuple):
    """A collective call `keep` holds for `repeat`: what `issue` was handed, and the result's shape."""

    comm: Any  #: the group's communicator
    group_size: int
    out_shape: tuple  #: the result's shape (the caller makes its buffer)
    op: str  #: the trace's name ("allgather", ...)
    extra: tuple  #: the call's other arguments, as SPMDSIM_CHECK compares them
    nbytes: Any  #: as `issue` takes it
    run: Callable[..., None]  #: the mesh's engine's transfer (``mesh.engine.all_gather``)
    #: `run` on `comm` with the mesh's wait, as a function of the buffers (and op) alone (Engine.direct)
    direct: Callable[..., None]


def repeat(mesh: Mesh, plan: KeptCall, axes: Any, label: str | None, args: tuple, result: Any, x: Any) -> Any:
    """`issue` of a collective whose every check passed at an earlier call with the same group, shape, dtype
    and dims (spmdsim.runtime.collectives keeps `plan`, what `keep` made of it, per mesh): with no debug hook
    on and no algorithm, the engine's transfer alone (`plan.direct`) and, where a trace is open, its row;
    else `issue` with what the plan holds."""
    context = mesh.context  # the rank's that made the mesh and calls it (no thread-local lookup)
    if context.hooks.quiet and mesh.algorithms is None:
        traces = context.traces
        if not traces:
            plan.direct(*args)
            context.seq += 1
            return result
        t0 = perf_counter()
        plan.direct(*args)
        context.seq += 1
        now = perf_counter()
        record_call(traces, plan.op, axes, plan.group_size, plan.nbytes, now - t0, label, 0, now, None, x.dtype)
        return result
    return issue(mesh, plan.comm, plan.group_size, plan.op, axes, label, plan.run, args, result, x, plan.extra,
                 plan.nbytes)


def keep(mesh: Mesh, key: tuple, comm: Any, g: int, out_shape: tuple, op: str, run: Callable[..., None],
         extra: tuple, nbytes: Any) -> None:
    """Keep, for `repeat`, a collective call that just ran through `issue` without packing or unpacking:
    its group, the result's shape, what `issue` was handed and the engine's transfer (`run`: the mesh's
    engine's method), under `key` (the collective's name, `axes` as spelled, the array's shape and dtype
    and the call's dims; the dtype, `key[3]`, tells the engine what `direct` may leave out). Held by `mesh`,
    freed when it closes."""
    put(mesh._plans, key, KeptCall(comm, g, out_shape, op, extra, nbytes, run,
                                   mesh.engine.direct(run, comm, polite_wait if mesh.polite else None, key[3])), 256)


def transfer(comm: Any, op: str, axes: Any, array: Any, extra: Any, polite: bool, run: Callable[..., None],
             *args: Any) -> None:
    """Run one transfer outside a mesh (not traced) with the debug layers: `run`, `comm`'s engine's method
    (``engine_of(comm).all_gather``), on `args`, numbered and compared with SPMDSIM_CHECK, its wait watched
    with SPMDSIM_WATCHDOG. `array`: this rank's send buffer (what the check compares)."""
    unrecorded(f"{op} on {axes!r}" if axes else op)  # DTensor.gather, DTensor.check: no kernel records them
    seq = debug_calls.begin(comm, op, axes, array.dtype, array.shape, extra, polite)
    run(comm, *args, debug_calls.waiter(op, axes, seq, polite, comm))


def barrier(comm: Any, wait: Any = None) -> None:
    """Every member of `comm` has arrived (`wait`: how to wait, engines/base.py)."""
    engine_of(comm).barrier(comm, wait)


def messages(comm: Any, axes: Any, receives: list, sends: list) -> tuple:
    """What `point_to_point`'s trace row says of a group of messages besides its times and label: (op:
    "send", "recv" or "sendrecv"; `axes` as a tuple; `comm`'s size; bytes sent; bytes received; how many
    peers; each peer's (rank in `comm`, bytes sent to it, bytes received from it), by peer), counted from the
    buffers. A caller that posts groups of the same sizes to the same peers again (a pipeline's schedule, step
    after step) works each out once and passes it to `point_to_point`
    (spmdsim.programs.plan.messages.Messages.described)."""
    partners: dict = {}
    for way, posted in enumerate((sends, receives)):
        for buf, peer, _ in posted:
            partners.setdefault(peer, [0, 0])[way] += buf.nbytes
    sent = sum(way[0] for way in partners.values())
    received = sum(way[1] for way in partners.values())
    op = "sendrecv" if receives and sends else ("recv" if receives else "send")
    return (op, axes if type(axes) is tuple else normalize_axes(axes), comm.Get_size(), sent, received,
            len(partners), tuple((peer, out, got) for peer, (out, got) in sorted(partners.items())))


def point_to_point(mesh: Mesh, comm: Any, axes: Any, receives: list, sends: list, label: str | None,
                   known: tuple | None = None, bound: Any = None) -> None:
    """Messages between members of `comm` (a group of `mesh` over `axes`), posted together and all waited
    for: `receives` as (buffer, source, tag), `sends` as (buffer, dest, tag), receives posted first. A
    pipeline's activations and gradients between stages (spmdsim.models.gpt.pipeline). Waited politely on a
    polite mesh, watched with SPMDSIM_WATCHDOG (a schedule that deadlocks anyway ends the job with the
    watchdog's report); one trace row ("send", "recv" or "sendrecv") with the bytes each way (on a dry
    engine, one more count of an earlier group's row that differs in its times alone: Trace.fold). Not
    numbered as a collective: the stages of a pipeline make different numbers of them. One recorded call
    when a rank captures a step (spmdsim.runtime.replay): a replay posts the same messages on the same
    buffers again, bound to them at the capture where the engine can (MPI's persistent requests, `bound`:
    one ``Startall`` a group). `known`: `messages(comm, axes, receives, sends)`, worked out by the caller
    before (else here, when a trace or a debug hook needs it); a debug hook's run counts again and refuses
    one that differs."""
    if CAPTURES[0] and capturing():  # recorded as one call (the kernel below runs this body again, inside it)
        if bound is None:
            bound = mesh.engine.bind(comm, receives, sends)
        return _recorded_point_to_point(mesh, comm, axes, receives, sends, label, known, bound)
    # The posts first: a peer waits for them. After the wait only the end time and a row of constants
    # (each microsecond between one group's wait and the next group's posts lies on the schedule's chain
    # of stages, at 4 ranks per core on cold caches).
    t0 = perf_counter()
    engine = mesh.engine  # `comm` is a group of `mesh`: its engine
    requests = engine.post(comm, receives, sends) if bound is None else engine.start(bound)
    context = mesh.context  # this rank's: its traces and hooks
    traces = context.traces
    if context.hooks.quiet:  # no check, no watchdog: debug_calls.waiter's answer without its call
        if known is None and traces:
            known = messages(comm, axes, receives, sends)  # while the messages fly
        engine.wait_all(requests, polite_wait if mesh.polite else None)
    else:
        counted = messages(comm, axes, receives, sends)
        engine.wait_all(requests, debug_calls.waiter(counted[0], counted[1], context.seq, mesh.polite, comm))
        if known is not None and known != counted:
            raise SpmdsimError(f"point_to_point: known {known!r} does not describe the messages posted; "
                               f"expected {counted!r}")
        known = counted
    if traces:
        ended = perf_counter()
        op, axes, size, sent, received, peers, partners = known
        # A dry run's groups of one description fold into one row each (their times are the dry engine's).
        (fold_to if engine.dry else record_to)(traces, op, axes, size, sent, received, ended - t0, label, 0,
                                               ended, peers, partners)


def untraced(comm: Any, run: Callable[..., None], *args: Any, wait: Any = None) -> None:
    """`run`, `comm`'s engine's transfer (``engine_of(comm).all_reduce``), on `args`, bare: not numbered,
    checked or traced."""
    run(comm, *args, wait)


def all_gather_object(comm: Any, obj: Any) -> list:
    """Every member's picklable `obj`, in group order, on every member."""
    return engine_of(comm).all_gather_object(comm, obj)


def gather_object(comm: Any, obj: Any, root: int = 0) -> list | None:
    """Every member's `obj` on `root` (None elsewhere)."""
    return engine_of(comm).gather_object(comm, obj, root)


def all_reduce_object(comm: Any, obj: Any, op: str = "sum") -> Any:
    """`op` ("sum", "max", "min") of every member's number `obj`, on every member."""
    return engine_of(comm).all_reduce_object(comm, obj, op)


def _alone(op: str, axes: Any, label: str | None, dtype: Any) -> None:
    """A collective over a group of one rank: dtype checked (unless None), numbered, traced; nothing sent."""
    if dtype is not None and dtype not in _TAKEN[op]:
        _take(op, dtype)
    _context().seq += 1
    record(op, normalize_axes(axes), 1, 0, 0, 0.0, label)


# Point-to-point messages are one recorded call when a rank captures a step, as the collectives are
# (spmdsim.runtime.collectives): a replay meets the peer stage again. point_to_point asks `capturing()`
# itself and calls this only then: the kernel's wrapper (*args, a test) is not on the path of a plain step.
_recorded_point_to_point = kernel(point_to_point)
