"""Point-to-point messages between simulated ranks: matching, eager sends, probes (the thread engine's).

A send is matched with the first posted receive of its destination that takes
its source and tag, and a receive with the oldest pending send that fits, so
messages between two ranks never overtake each other (MPI's rule). A message
is bytes: an object send carries its pickle, and a buffer receive of it gets
those bytes (a ``recv()`` of a buffer send unpickles the buffer's bytes), as
under MPI. A standard send smaller than the world's eager limit (World.eager_limit,
EAGER_BYTES unless the run set another) is copied and completes at once if no
receive is posted (MPICH's eager protocol on one node: a ring of small Send then
Recv works); a larger one, and every Ssend, completes only when its receive
matches it, so both ranks sending large messages first is a deadlock, as under
MPICH. With the limit 0 every standard send waits for its receive: a program
that relies on MPI buffering it (unsafe, by the MPI standard) deadlocks at any
message size. Bsend always buffers.

A program's nonblocking receive into a buffer (``Irecv``, ``irecv(buf)``,
``Message.Irecv``, a started ``Recv_init``, ``Isendrecv``) defers: its message lands in the
buffer only when the request completes (Wait, Waitall, a Test that returns
true, ...), as a rendezvous receive on a cluster may land it, so that a program
reading the buffer before its Wait sees what was there before (MPI: the buffer
must not be read until the receive completes), every run, not only on some
clusters. A message that arrives first is held (a copy, if its bytes are
still the sender's buffer, which the sender may reuse once its send
completes). A receive the program already waits for takes its message at
once; so do the blocking calls (Recv, Sendrecv) and spmdsim's own transfers.
"""
from __future__ import annotations

import itertools
import os
import pickle
from typing import Any, Optional

from ...errors import DTypeError, ShapeError
from ...base.validate import counted
from ._buffers import message
from ._mpi import c_int, integer, mpi_error, mpi_module, special, wildcards
from .groups import Group
from .waiting import _Waiting
from .request_sets import Polled
from .landing import CHECK_BYTES, _land, _remove, _sample, program_line, rank_name
from .requests import Request, completed, fill_status
from ..._lazy import numpy_on_first_use

np = numpy_on_first_use(globals())  # a program without numpy does not load it

__all__ = ["post_send", "post_recv", "unreceived", "probe", "receive_matched", "uncompleted", "rewrites"]

#: The largest tag: MPICH's MPI_TAG_UB, and under mpi4py this process's MPI's (spmdsim.emulator.mpi4py_world sets
#: it from ``Get_attr(MPI.TAG_UB)``, so a program that reads the attribute is refused past exactly that).
TAG_UB = (1 << 29) - 1

#: Numbers the messages and receives as they are posted (Request.seq; each rank posts its own in turn, so a
#: rank's are numbered in its order): the warnings when the ranks end list them by rank, then in that order.
_POSTED = itertools.count()


def _fits(recv: Request, source: int, tag: int, wild: tuple[int, int]) -> bool:
    """Whether `recv` (a receive or a probe) takes a message from `source` with `tag`; `wild`: `wildcards()`."""
    return recv.peer in (source, wild[0]) and recv.tag in (tag, wild[1])


def _check_peer(group: Group, peer: Any, what: str) -> None:
    if not integer(peer):
        raise ShapeError(f"{what} {peer!r} must be an integer rank of the communicator")
    if not (0 <= peer < group.size or peer == special("PROC_NULL")):
        mpi = mpi_module()
        text = f"{what} rank {peer!r} is outside the communicator of {counted(group.size, 'rank')}"
        if mpi is not None:
            ranks = f"0 to {group.size - 1}" if group.size > 1 else "0"
            raise mpi_error(mpi, mpi.ERR_RANK, f"{text} ({ranks}, or MPI.PROC_NULL)")
        raise ShapeError(text)


def _check_tag(tag: Any, what: str, any_tag: bool = False) -> None:
    """A tag is an integer from 0 to TAG_UB (a receive's may be MPI.ANY_TAG): mpi4py's TypeError, its
    OverflowError past a C int, MPI's invalid-tag error (MPICH's "Invalid tag, value is -5"; a negative tag
    would otherwise never match, and the job would hang; one past TAG_UB MPICH refuses on both sides)."""
    tag = c_int(tag, what)
    if tag < 0 and not (any_tag and tag == special("ANY_TAG")):
        text = f"{what} {tag!r} is negative: tags are 0 or more" + ("; MPI.ANY_TAG matches any" if any_tag else "")
    elif tag > TAG_UB:
        text = f"{what} {tag!r} is above the largest tag, MPI.TAG_UB's {TAG_UB}"
    else:
        return
    mpi = mpi_module()
    if mpi is not None:
        raise mpi_error(mpi, mpi.ERR_TAG, text)
    raise ShapeError(text)


def post_send(group: Group, me: int, dest: int, tag: int, buf: Any, obj: Any = None,
              mode: str = "standard", watch: Any = None) -> Request:
    """Isend from group rank `me` to group rank `dest` (`buf` None: the pickle of `obj`). `watch`: a program's
    nonblocking send, whose buffer its completion compares with what it held now (`watched`): True for a plain
    buffer, or for a derived datatype's (`buf` its packed bytes) a function packing the program's buffer again."""
    if type(dest) is not int or type(tag) is not int or not 0 <= dest < group.size or not 0 <= tag <= TAG_UB:
        # as mpi4py converts them (a float truncated: a send to rank ``size / 2`` goes to rank 1 of 2, as in
        # mpi4py's demo osu_multi_lat.py), then the checks and MPI.PROC_NULL: a plain rank and tag skip them
        dest, tag = c_int(dest, "dest"), c_int(tag, "send tag")
        _check_peer(group, dest, "dest")
        _check_tag(tag, "send tag")
        if dest == special("PROC_NULL"):
            return completed(kind="send")
    if buf is None:
        payload = np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8)
    else:
        data, count, _ = message(buf, "send buffer")
        if not count:
            payload = np.empty(0, np.uint8)
        else:  # a byte buffer (osu_bw's) as it is: a view costs as much as the rest of the slicing
            payload = data[:count] if data.dtype.char == "B" else data[:count].view(np.uint8)
    wild = wildcards()
    send = Request(group, me, "send", dest, tag, None, wild)
    send.payload, send.mode, send.own, send.seq = payload, mode, buf is None, next(_POSTED)
    if buf is not None:
        send.sent = data.dtype
    world = group.world
    copy = None
    with world.lock:
        world.check(group.members[me])
        recvs = group.recvs
        for i, other in enumerate(recvs):  # the first posted receive that takes it
            if other.me == dest and _fits(other, me, tag, wild):
                del recvs[i]
                break
        else:
            if mode == "buffered" or (mode == "standard" and payload.nbytes < world.eager_limit):
                copy = send.payload = payload.copy()  # the sender may reuse its buffer now
                send.done = True
            group.sends.append(send)
            world.moves += 1  # a poll of a probe may find it now: not stuck
            if group.probes:
                _wake_probes(group, send)
            other = None
    if other is not None:
        copy = _deliver(send, other)
    if watch is not None:
        # the program's buffer as it is now (no line of the program ran since the post): its bytes, or a sample
        # of them, which the send's completion compares (`rewritten`); a copy made already serves
        if watch is True:
            send.watch = (copy if copy is not None and copy.nbytes <= CHECK_BYTES else
                          payload.copy() if payload.nbytes <= CHECK_BYTES else _sample(payload), payload)
        else:  # a derived datatype's: its packed bytes, and how to pack them again
            send.watch = (payload, watch)
    return send


def rewrites(world: Any) -> tuple[str, ...]:
    """The program's nonblocking sends whose buffer it wrote into before the send completed (`rewritten`), by
    rank, then in the order posted."""
    return tuple(text for _, _, text in sorted(world.rewritten))


def post_recv(group: Group, me: int, source: int, tag: int, buf: Any, unpack: Any = None,
              room: Optional[int] = None, given: Any = None, defer: bool = False) -> Request:
    """Irecv into group rank `me`'s `buf` (None: an object): matched now if a send is pending. `unpack`:
    for a receive into a derived datatype (`buf` its packed bytes), what spreads them into the user's buffer
    once they arrive (spmdsim.emulator.derived.unpacking). `room`: an object's receive (mpi4py's irecv) takes at
    most that many bytes (more: MPI's truncation error, when it completes); `given`: what irecv was given for
    them (Request.given). `defer`: the message lands in the buffer only when the request completes (a
    program's Irecv: the module docstring)."""
    if type(source) is not int or type(tag) is not int or not 0 <= source < group.size or not 0 <= tag <= TAG_UB:
        source = c_int(source, "source")  # as mpi4py converts it (`_any` passes a plain int as it is)
        if source != special("ANY_SOURCE"):  # a plain rank and tag skip the checks
            _check_peer(group, source, "source")
        _check_tag(tag, "receive tag", any_tag=True)
        if source == special("PROC_NULL"):
            return completed(kind="recv-null")
    view = None
    if buf is not None:
        data, count, _ = message(buf, "receive buffer", readonly=False)
        view = data[:count]
    wild = wildcards()
    recv = Request(group, me, "recv", source, tag, view, wild)
    recv.unpack, recv.room, recv.given, recv.defer, recv.seq = unpack, room, given, defer, next(_POSTED)
    world = group.world
    with world.lock:
        world.check(group.members[me])
        sends = group.sends
        for i, other in enumerate(sends):  # the oldest pending send it takes
            if other.peer == me and _fits(recv, other.me, other.tag, wild):
                del sends[i]
                break
        else:
            group.recvs.append(recv)
            return recv
    _deliver(other, recv)
    return recv


def _deliver(send: Request, recv: Request) -> Any:
    """Match `send` with `recv`: the receive's source, tag, byte count and truncation error now; its bytes land
    now (outside the lock), or, for a receive that defers, when it completes (`land`); then complete both
    requests and wake their owners. Returns the copy of the whole message it made for a deferring receive
    (post_send's check of the buffer keeps it), else None."""
    recv.source, recv.got_tag = send.me, send.tag
    payload = send.payload
    n = payload.nbytes
    if recv.buf is None:
        if recv.room is not None and n > recv.room:
            recv.error = _truncated(send, recv, n)
            recv.nbytes = recv.room  # its status counts the bytes that fit, as MPICH's
        else:
            recv.payload = payload.tobytes()
            recv.nbytes = n
    else:
        if n > recv.buf.nbytes:  # the bytes that fit are received, and counted, as MPICH receives them
            recv.error = _truncated(send, recv, n)
            n = recv.buf.nbytes
        elif recv.unpack is None and recv.buf.dtype.char != "B" and (send.own or n % recv.buf.itemsize
                                                                      or _other_type(send.sent, recv.buf.dtype)):
            recv.error = _mistyped(send, recv, n)  # values no rank sent (MPICH aborts on a part element)
        recv.nbytes = n
    group = send.group
    world = group.world
    if recv.defer and (recv.buf is not None or isinstance(recv.given, memoryview)):
        # held until the receive completes; a copy if they are the sender's buffer (its send completes now)
        held = copy = payload if send.done or send.own else payload[:recv.nbytes].copy()
        with world.lock:  # its owner stops deferring under the lock (a Wait for it, a Free)
            if recv.defer:
                recv.held, held = held, None
        if held is not None:
            _land(recv, held)
    else:
        _land(recv, copy := payload)
    with world.lock:
        send.done = recv.done = True
        send.payload = None
        world.moves += 1
        world.release(group.members[send.me], send)
        world.release(group.members[recv.me], recv)
    return copy if copy is not payload and copy.nbytes == payload.nbytes else None


def _truncated(send: Request, recv: Request, n: int) -> BaseException:
    group = send.group
    detail = (f"{rank_name(group, send.me)} sends {n} bytes (tag {send.tag}) but {rank_name(group, recv.me)} "
              f"receives into a buffer of {recv.room if recv.buf is None else recv.buf.nbytes}")
    if recv.buf is None:
        if recv.given is None:
            detail += (" (irecv's; given none, mpi4py's own of mpi4py.rc.irecv_bufsz bytes: give irecv a buffer "
                       "large enough")
        elif isinstance(recv.given, memoryview):
            detail += " (the buffer given to irecv: give it one large enough"
        else:
            detail += f" (irecv's of the {recv.room} bytes asked for: ask for enough"
        detail += ", or receive with recv, which takes any size)"
    mpi = mpi_module()
    if mpi is not None:
        return mpi_error(mpi, mpi.ERR_TRUNCATE, detail)
    return ShapeError(f"message truncated: {detail}")


#: numpy's kinds of numbers, the integers' three as one (MPI's type matching, which a signed int received as
#: unsigned breaks too, is left to the program there: the same bits, as every MPI library delivers them).
_NUMBERS = {"f": "f", "c": "c", "i": "i", "u": "i", "b": "i"}


def _other_type(sent: Any, got: Any) -> bool:
    """Whether elements of numpy dtype `sent` (None: not known) received as `got` are values no rank sent: a
    float received as an integer, float64 as float32, ... (bytes, 'B', are MPI_BYTE: any type's)."""
    if sent is None or sent.char == "B" or sent.kind not in _NUMBERS or got.kind not in _NUMBERS:
        return False
    return _NUMBERS[sent.kind] != _NUMBERS[got.kind] or sent.itemsize != got.itemsize


def _mistyped(send: Request, recv: Request, n: int) -> BaseException:
    """A typed receive of a pickled object (`send`'s, mpi4py's lowercase send), of bytes that are no whole number
    of its elements, or of elements of another type: MPI's type error, saying which."""
    group, kind = send.group, recv.buf.dtype
    detail = (f"{rank_name(group, send.me)} sends {n} bytes (tag {send.tag}) but {rank_name(group, recv.me)} "
              f"receives {kind.name} ({kind.itemsize} bytes each)")
    if send.own:
        detail += (": the message is a pickled object (sent with send, lowercase); receive it with recv(), or send "
                   "an array with Send")
    elif n % kind.itemsize:
        detail += f": {n} bytes are not a whole number of them; send and receive the same dtype"
    else:
        detail = (f"{rank_name(group, send.me)} sends {n // send.sent.itemsize} {send.sent.name} (tag {send.tag}) "
                  f"but {rank_name(group, recv.me)} receives them as {kind.name}: their bytes would land as values no "
                  f"rank sent; receive into {send.sent.name}, or convert after receiving")
    mpi = mpi_module()
    if mpi is not None:
        return mpi_error(mpi, mpi.ERR_TYPE, detail)
    return DTypeError(f"message of another type: {detail}")


def unreceived(world: Any) -> tuple[str, ...]:
    """The messages sent and never received, and the receives posted and never matched, once the
    ranks ended ('rank 0 to rank 1 (tag 3, 20 bytes)'): MPI leaves them undefined (MPICH drops a
    small one at MPI_Finalize without a word). By the world rank of the sender (of a message) or the
    receiver (of a receive), then in the order that rank posted them, every run alike."""
    found = []
    with world.lock:
        for group in list(world.groups):  # a WeakSet, in no set order: sorted below
            where = "" if group is world.root else f" on {group.label()}"
            found += [(group.members[s.me], s.seq, f"a message from {rank_name(group, s.me)} to "
                       f"{rank_name(group, s.peer)} (tag {s.tag}, {s.payload.nbytes} bytes){where} was never "
                       f"received") for s in group.sends]
            found += [(group.members[r.me], r.seq, f"a receive of {rank_name(group, r.me)} from "
                       f"{'any rank' if r.peer == special('ANY_SOURCE') else rank_name(group, r.peer)} "
                       f"(tag {'any' if r.tag == special('ANY_TAG') else r.tag}){where} was never matched")
                      for r in group.recvs]
    return tuple(line for _, _, line in sorted(found))


def uncompleted(world: Any) -> tuple[str, ...]:
    """The program's nonblocking requests never completed (no Wait, Test, ... nor Free) once the ranks ended,
    by rank, each rank's in the order it posted them, each as it was posted ('an Irecv of rank 1 from rank 0
    (tag 3) at prog.py:7 was never completed (no Wait or Test)'; a nonblocking collective's: 'an Ibarrier of
    rank 1 at prog.py:9 ...'): MPI requires each to be completed or freed (MPICH's MPI_Finalize says only
    "Builtin communicator 44000000 has pending 1 references"); a receive's message, if one came, never
    reached its buffer, nor a collective's result its receive buffer."""
    found = []
    for req, call, code, offset, group, me in list(world.posted.values()):  # in posted order
        file, line = program_line(code, offset)
        part = req._shown() if group is None else None
        if part is not None:
            group, me = part.group, part.me
            if group is None:
                continue
        where = "" if group is world.root else f" on {group.label()}"
        at = f" at {os.path.basename(file)}:{line}" if file else ""
        # 'an Rput', 'an Rsend_init' (said 'ar-put'), 'a Recv_init'
        article = "an" if call[:1] in "AEIOUaeiou" or call.startswith(("Rput", "Rget", "Racc", "Rsend")) else "a"
        if part is None:  # a collective
            what = f"{article} {call} of {rank_name(group, me)}{where}{at}"
            lost = ": its result never reached its receive buffer" if any(  # `writes`: emulator.nonblocking's
                p.held is not None and getattr(p, "writes", True) for p in (req, *req.parts)) else ""
        else:
            peer = "any rank" if part.peer == special("ANY_SOURCE") else rank_name(group, part.peer)
            tag = "any" if part.tag == special("ANY_TAG") else part.tag
            way = "from" if part.kind.endswith("recv") else "to"
            what = f"{article} {call} of {rank_name(group, me)} {way} {peer} (tag {tag}){where}{at}"
            lost = ": the message it matched never reached its buffer" if part.held is not None else ""
        found.append((group.members[me], len(found),
                      f"{what} was never completed (no Wait or Test{lost})"))
    return tuple(text for _, _, text in sorted(found))


def _wake_probes(group: Group, send: Request) -> None:
    """A send just queued (lock held): release the probes of its destination that it answers."""
    wild = wildcards()
    for probe in [p for p in group.probes if p.me == send.peer and _fits(p, send.me, send.tag, wild)]:
        _remove(group.probes, probe)
        group.world.release(group.members[probe.me], probe)


def probe(group: Group, me: int, source: int, tag: int, status: Any, block: bool, take: bool = False,
          call: Optional[str] = None) -> Any:
    """Whether a message from `source` with `tag` waits for rank `me` (block: until one does). With `take`
    (a matched probe, MPI_Mprobe): the message's send, taken out of the queue so that only `receive_matched`
    receives it (None if none waits; MPI.PROC_NULL's: True). `call`: the program's call (Iprobe, improbe, ...),
    which a report of a loop polling in vain names (None: Iprobe)."""
    _check_tag(tag, "probe tag", any_tag=True)
    if source != special("ANY_SOURCE"):  # a rank outside the group would never match (the job hung)
        _check_peer(group, source, "source")
    if source == special("PROC_NULL"):
        fill_status(status, source, special("ANY_TAG"), 0)
        return True
    world = group.world
    rank = group.members[me]
    token = Request(group, me, "probe", source, tag)
    wild = wildcards()
    while True:
        with world.lock:
            world.check(rank)
            found = next((s for s in group.sends if s.peer == me and _fits(token, s.me, s.tag, wild)), None)
            if found is None and block:
                group.probes.append(token)
                world.wait(rank, _Waiting(None, group, None, token=token))
                continue
            if found is not None:  # read under the lock: a receive may take the message next
                if take:
                    _remove(group.sends, found)
                send, found = found, (found.me, found.tag, found.payload.nbytes)
        if found is not None:
            fill_status(status, *found)
            return send if take else True
        world.pause(rank, token if call is None else Polled([token], call))
        return None if take else False


def receive_matched(send: Request, buf: Any, unpack: Any = None, defer: bool = False) -> Request:
    """Receive the message of `send`, which a matched probe took (MPI_Mrecv): into `buf` (None: an object;
    `unpack` and `defer` as post_recv's)."""
    group, me = send.group, send.peer
    view = None
    if buf is not None:
        data, count, _ = message(buf, "receive buffer", readonly=False)
        view = data[:count]
    recv = Request(group, me, "recv", send.me, send.tag, view)
    recv.unpack, recv.defer = unpack, defer
    _deliver(send, recv)
    return recv
