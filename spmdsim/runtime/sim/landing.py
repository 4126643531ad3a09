"""How a simulated message lands in its receive (`land`, `let_land`: now, or at its completion) and what a
completed send's buffer tells (`rewritten`); how a report names a rank of a group (`rank_name`). Shared by
the requests (spmdsim.runtime.sim.requests) and the messages that make them (spmdsim.runtime.sim.p2p), which
sit above it: a `send`, `recv` or `req` here is one of their Requests, a `group` a communicator's Group
(spmdsim.runtime.sim.groups)."""
from __future__ import annotations

import os
import sys
from typing import Any, Optional

from ..._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["EAGER_BYTES", "sends_wait", "rank_name", "land", "let_land", "cancel", "rewritten", "program_line"]

#: Standard sends below this many bytes are buffered (MPICH 4's shared-memory eager limit is 8 KiB), unless a run
#: sets its world's own limit (World.eager_limit: ``spmdsim mpirun --eager-limit 0``, the lab's grader).
EAGER_BYTES = 8 << 10

_SPMDSIM = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep  # spmdsim/

#: A program's nonblocking send of up to this many bytes is compared whole at its completion with what its buffer
#: held when posted; a larger one at SAMPLES bytes spread over it and the first and last EDGE bytes (a few bytes
#: changed between those go unseen), so that the check costs little beside the message (`rewritten`).
CHECK_BYTES = 64 << 10
SAMPLES, EDGE = 4096, 4096


def _sample(view: Any) -> Any:
    """`view`'s bytes (a copy) up to CHECK_BYTES; past that the first and last EDGE and SAMPLES spread between."""
    n = view.nbytes
    if n <= CHECK_BYTES:
        return view.copy()
    return np.concatenate((view[:EDGE], view[EDGE:n - EDGE:max(1, (n - 2 * EDGE) // SAMPLES)], view[n - EDGE:]))


def rewritten(send: Any, watch: tuple, call: str, code: Any, offset: Any) -> None:
    """The program completed `send`, which its nonblocking `call` at instruction `offset` of `code` posted (Wait,
    a Test that returned true, ...; `program_line` says where, worked out only for a warning): if the buffer's
    bytes differ from those it held when posted (`watch`), note it in the world's
    `rewritten` (a warning when the ranks end). MPI: "the sender should
    not modify any part of the send buffer after a nonblocking send operation is called, until the send
    completes"; what the receiver gets is then undefined (here, as under MPICH on one node: a message under
    the world's eager limit as it was when sent, a larger one as it was when its receive took it)."""
    then, now = watch
    if callable(now):  # a derived datatype's: packed again
        same = np.array_equal(then, now())
    elif now.nbytes <= CHECK_BYTES:
        same = then.tobytes() == now.tobytes()
    else:
        same = then.tobytes() == _sample(now).tobytes()  # a sample of 12 KiB: bytes compare fastest
    if same:
        return
    file, line = program_line(code, offset)
    frame, caller = sys._getframe(1), None  # the program's line, and the call it made (Wait, Waitall, ...)
    while frame is not None and frame.f_code.co_filename.startswith(_SPMDSIM):
        frame, caller = frame.f_back, frame
    done = caller.f_code.co_name if caller is not None else "its completion"
    if frame is not None:
        done += f" at {os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
    group = send.group
    world = group.world
    where = "" if group is world.root else f" on {group.label()}"
    at = f" at {os.path.basename(file)}:{line}" if file else ""
    world.rewritten.append((group.members[send.me], send.seq, (
        f"{rank_name(group, send.me)} wrote into the buffer of its {call} to {rank_name(group, send.peer)} (tag "
        f"{send.tag}){where}{at} before the send completed ({done}): MPI forbids changing a send buffer until "
        f"then; the receiver may get the old contents, the new or a mix")))


def sends_wait(limit: int) -> str:
    """The deadlock report's advice where ranks wait in standard Sends to each other, under eager limit `limit`."""
    fix = "post the receive first on one side, or use Sendrecv or Isend/Irecv"
    if limit <= 0:
        return (f"no standard Send is buffered here (eager limit 0): the program relies on MPI buffering its "
                f"standard Sends, which the MPI standard calls unsafe (it deadlocks once the messages outgrow "
                f"MPI's buffer, or under another MPI): {fix}")
    size = f"{limit // 1024} KiB" if limit % 1024 == 0 else f"{limit} bytes"
    return f"a standard Send of {size} or more waits for its receive, as MPICH's does past its eager limit: {fix}"


def rank_name(group: Any, me: int) -> str:
    """'rank 3' on the world, else 'group rank 1 (world rank 3)' (a rank of `group`, as a report names it)."""
    world = _world_rank(group, me)
    return f"rank {me}" if world is None else f"group rank {me} (world rank {world})"


def _world_rank(group: Any, me: int) -> Optional[int]:
    """The world rank of `group`'s rank `me`; None on the world itself (its ranks are the world's), without a
    group, or for a number that is no rank of it."""
    if group is None or not 0 <= me < group.size or group.members == tuple(range(group.world.size)):
        return None
    return group.members[me]


def _land(recv: Any, payload: Any) -> None:
    """Write the received bytes (`recv.nbytes` of `payload`) into the receive's buffer: a buffer receive's, or
    the program's buffer given to irecv; a derived datatype's spread where they go."""
    n = recv.nbytes
    into = recv.buf
    if into is None:
        if isinstance(recv.given, memoryview):  # irecv(buf): the bytes land in the program's buffer (those that fit)
            recv.given[:n] = payload[:n]
        return
    (into if into.dtype.char == "B" else into.view(np.uint8))[:n] = payload if n == payload.nbytes else payload[:n]
    if recv.unpack is not None:  # before the receive completes: its owner reads the buffer after that
        try:  # a derived datatype's bytes spread where they go, a truncated message's those that fit
            recv.unpack(n)
        except Exception as exc:  # noqa: BLE001 - raised by the receive's Wait, in its owner (as a truncation)
            recv.error = recv.error or exc


def land(recv: Any) -> None:
    """The message a deferring receive holds lands in its buffer: its completion (Wait, a Test that returns
    true, Get_status that does, ...), in its owner's thread. A nonblocking collective's request holds what writes
    what completes it (a function: spmdsim.emulator.nonblocking.CollectiveRequest)."""
    held, recv.held = recv.held, None
    if callable(held):
        held()
    elif held is not None:
        _land(recv, held)


def let_land(recv: Any) -> None:
    """`recv` stops deferring (its owner waits for it, or freed it): a message that arrives lands at once, and
    one held lands now."""
    group = recv.group
    if group is None or not recv.defer:
        return
    with group.world.lock:
        recv.defer = False
        held, recv.held = recv.held, None
    if held is not None:
        _land(recv, held)


def _remove(queue: list, req: Any) -> bool:
    """Take `req` itself out of `queue` (not an equal one: every null request equals every other)."""
    for i, other in enumerate(queue):
        if other is req:
            del queue[i]
            return True
    return False


def cancel(req: Any) -> None:
    """Cancel `req` if no message matched it yet (MPI_Cancel): it completes as cancelled."""
    group = req.group
    if group is None or req.done:
        return
    with group.world.lock:
        queue = group.recvs if req.kind == "recv" else group.sends
        if not req.done and _remove(queue, req):
            req.done = req.cancelled = True


def _land_held(req: Any) -> None:
    """What `req` and its parts hold to land at completion lands (spmdsim.runtime.sim.landing.land): a
    deferring receive's message, a nonblocking collective's result (a persistent one's, a copy's: their part's)."""
    for part in (req, *req.parts):
        if part.held is not None:
            land(part)


def _sent(req: Any, entry: Any) -> None:
    """The sends of `req` (itself, its parts) that watch their buffer stop; with `entry` (the request's in
    World.posted: completed, not freed) one whose buffer changed since posted is noted (landing.rewritten)."""
    for part in (req, *req.parts):
        watch = part.watch
        if watch is not None:
            part.watch = None
            if entry and not (watch[1].__class__ is np.ndarray and watch[1].nbytes == watch[0].nbytes
                              and watch[0].tobytes() == watch[1].tobytes()):  # unchanged: a small one's bytes
                rewritten(part, watch, *entry[1:4])


def program_line(code: Any, offset: Any) -> tuple[Optional[str], Optional[int]]:
    """(file, line) of the instruction at byte `offset` of `code`, as a request's entry in World.posted keeps
    where the program posted it (spmdsim.runtime.sim.requests.noted); (None, None) for none."""
    if code is None:
        return None, None
    for start, end, line in code.co_lines():
        if start <= offset < end:
            return code.co_filename, line
    return code.co_filename, None
