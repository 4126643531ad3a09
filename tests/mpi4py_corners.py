"""mpi4py corners a lab meets, whose per-rank results are compared: simulated ranks against MPICH.

    timeout -k 5 120 mpiexec -n 2 python tests/mpi4py_corners.py OUT.json   # MPICH's results

Each function takes nothing, uses ``MPI.COMM_WORLD`` as an mpi4py program does and
returns a JSON-able value; tests/test_sim_mpi4py_corners.py runs them on simulated
ranks (MPI.COMM_WORLD swapped), compares rank by rank with MPICH's, and checks
the values MPI's semantics give. The names of exception classes are compared,
so a refusal must be mpi4py's class (BufferError, ValueError, TypeError, ...).
"""
from __future__ import annotations

import json
import sys

import numpy as np

from mpi4py import MPI


def _raises(fn) -> str:
    """The first of mpi4py's exception classes `fn` raises ('' if none)."""
    try:
        fn()
    except MPI.Exception as exc:
        return f"MPI.Exception {MPI.Get_error_string(exc.Get_error_class()).split(',')[0]}"
    except Exception as exc:  # noqa: BLE001 - the class is the answer
        for kind in (BufferError, KeyError, TypeError, ValueError, NotImplementedError):
            if isinstance(exc, kind):
                return kind.__name__
        return type(exc).__name__
    return ""


def group_null_and_empty():
    comm = MPI.COMM_WORLD
    world = comm.Get_group()
    null = MPI.Group()
    union = MPI.Group.Union(MPI.GROUP_EMPTY, world)
    inter = MPI.Group.Intersection(world, MPI.GROUP_EMPTY)
    copy = MPI.Group(world)
    out = [bool(null), null == MPI.GROUP_NULL, MPI.Group(MPI.GROUP_NULL) == MPI.GROUP_NULL,
           bool(MPI.Group(MPI.GROUP_NULL)), union.size, MPI.Group.Compare(union, world) == MPI.IDENT,
           union == world, inter.size, inter == MPI.GROUP_EMPTY, world == comm.Get_group(),
           world.Incl([0]) == world.Incl([0]), world.Incl([]) == MPI.GROUP_EMPTY, copy == world,
           MPI.Group.Difference(world, world) == MPI.GROUP_EMPTY,
           MPI.Group.Translate_ranks(world, list(range(comm.size)), MPI.GROUP_EMPTY) == [MPI.UNDEFINED] * comm.size]
    world.Free()
    return out + [bool(world), world == MPI.GROUP_NULL]


def predefined_free():
    comm = MPI.COMM_WORLD
    comm.free()
    MPI.COMM_SELF.free()
    out = [bool(comm), comm == MPI.COMM_NULL, _raises(comm.Free), _raises(MPI.COMM_SELF.Free)]
    out += [comm.allreduce(1), MPI.COMM_SELF.allreduce(1), bool(comm)]
    dup = comm.Dup()
    dup.free()
    return out + [bool(dup), dup == MPI.COMM_NULL]


def request_copies():
    comm = MPI.COMM_WORLD
    r = comm.rank
    req = comm.Isend(np.arange(3.0) + r, r, 5)
    copy = MPI.Request(req)
    out = [copy == req, copy is req, bool(copy)]
    null = MPI.Request(MPI.REQUEST_NULL)
    out += [null == MPI.REQUEST_NULL, bool(null), MPI.Request() == MPI.REQUEST_NULL]
    got = np.zeros(3)
    recv = comm.Irecv(got, r, 5)
    rcopy = MPI.Request(recv)
    status = MPI.Status()
    rcopy.Wait(status)
    copy.Wait()
    return out + [got.tolist(), status.Get_source(), status.Get_tag(), bool(rcopy), bool(recv), recv == rcopy]


def byte_order():
    comm = MPI.COMM_WORLD
    big = np.arange(1, 4, dtype=">i4")
    return [_raises(lambda: comm.Send(big, comm.rank, 1)),
            _raises(lambda: comm.Allreduce(big, np.zeros(3, ">i4"))),
            _raises(lambda: comm.Bcast(np.zeros(2, ">f8")))]


def op_types():
    """A predefined op on elements MPI does not define it on (MPI.MAX of complex, MPI.SUM of booleans, MPI.BAND of
    floats) is MPI.ERR_OP ("Invalid MPI_Op"); the same ops on the elements they take answer."""
    comm = MPI.COMM_WORLD
    out = []
    for dtype in ("bool", "int32", "float64", "complex128"):
        for op in ("SUM", "MAX", "LAND", "BAND"):
            a = np.ones(2, dtype)
            b = np.zeros_like(a)
            raised = _raises(lambda: comm.Allreduce(a, b, op=getattr(MPI, op)))
            out.append(raised or b.tolist() if dtype != "complex128" else raised or "taken")
    return out


def fortran_order_and_0d_counts():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    a = np.asfortranarray(np.arange(6.0).reshape(2, 3) * (r + 1))
    total = np.empty((2, 3), order="F")
    comm.Allreduce(a, total)
    flat = np.zeros(6)
    comm.Sendrecv(a, r, 3, flat, r, 3)  # one block, in memory order
    s = np.arange(p, dtype="i") + 10 * r
    got = np.zeros(p, dtype="i")
    comm.Alltoallv([s, np.array(1)], [got, np.array(1)])  # a 0-d count: one item a peer
    return [total.tolist(), flat.tolist(), got.tolist()]


def fewer_statuses():
    comm = MPI.COMM_WORLD
    r = comm.rank
    bufs = [np.zeros(1) for _ in range(3)]
    reqs = [comm.Irecv(b, r, t) for t, b in enumerate(bufs)]
    for t in range(3):
        comm.Send(np.full(1, 10.0 * t + r), r, t)
    status = MPI.Status()
    MPI.Request.Waitall(reqs, (status,))  # fewer statuses than requests: the first is filled
    grown = []
    MPI.Request.Waitall([comm.Isend(np.zeros(1), r, 9), comm.Irecv(np.zeros(1), r, 9)], grown)
    return [[b[0] for b in bufs], status.Get_tag(), status.Get_source(), len(grown)]


def failed_requests():
    """A truncated receive among requests: Waitall (with a status list shorter than the requests, and without
    statuses), Testall and Waitsome raise MPI.ERR_IN_STATUS with each status's error, and leave active what
    MPICH leaves active; a truncated Recv fills its status and the buffer's first bytes. Each rank sends to the
    other, 10 doubles where 5 are received (tag 0), then 2 into 4 (tag 1)."""
    comm = MPI.COMM_WORLD
    peer = comm.rank ^ 1
    out = []
    for call in ("Waitall", "Waitall without statuses", "Testall", "Waitsome"):
        comm.Send(np.arange(10.0), peer, 0)  # small: both sends complete before the receives are posted
        comm.Send(np.arange(2.0), peer, 1)
        a, b = np.zeros(5), np.zeros(4)
        reqs = [comm.Irecv(a, peer, 0), comm.Irecv(b, peer, 1)]
        statuses = None if call == "Waitall without statuses" else [MPI.Status()]  # one: the list grows
        try:
            if call.startswith("Waitall"):
                MPI.Request.Waitall(reqs, statuses)
            elif call == "Testall":
                while not MPI.Request.Testall(reqs, statuses):
                    pass
            else:
                MPI.Request.Waitsome(reqs[:1], statuses)
            raised = "nothing"
        except MPI.Exception as exc:
            raised = MPI.Get_error_string(exc.Get_error_class()).split(",")[0]
        seen = [[MPI.Get_error_class(s.Get_error()), s.Get_source(), s.Get_tag(), s.Get_count(MPI.DOUBLE)]
                for s in statuses or ()]
        out.append([call, raised, seen, [bool(r) for r in reqs]])
        for r in reqs:  # what is left: a failed request left active raises its error again
            try:
                r.Wait()
            except MPI.Exception as exc:
                out.append(exc.Get_error_class() == MPI.ERR_TRUNCATE)
        out.append([a.tolist(), b.tolist()])
    comm.Send(np.arange(10.0), peer, 2)
    a, status = np.zeros(5), MPI.Status()
    out.append(_raises(lambda: comm.Recv(a, peer, 2, status)))
    return out + [[status.Get_source(), status.Get_tag(), status.Get_count(MPI.DOUBLE), status.Get_error()],
                  a.tolist()]


def refused_buffers():
    comm = MPI.COMM_WORLD
    a = np.arange(12.0).reshape(3, 4)
    readonly = np.zeros(3)
    readonly.flags.writeable = False
    return [_raises(lambda: comm.Bcast(a[:, ::2])),
            _raises(lambda: comm.Allreduce(np.zeros(3), readonly)),
            _raises(lambda: comm.Allreduce(np.zeros(3), b"abc")),
            _raises(lambda: comm.Allreduce([np.zeros(3), -1, MPI.DOUBLE], np.zeros(3))),
            _raises(lambda: comm.Bcast([np.zeros(3), (1, 5), MPI.DOUBLE])),
            _raises(lambda: comm.Bcast([np.zeros(3), 1, 0, MPI.DOUBLE, 1])),
            _raises(lambda: comm.Bcast(np.zeros(3, object))),
            _raises(lambda: comm.Bcast([np.zeros(3), "Q!"])),
            _raises(lambda: comm.Bcast([np.zeros(3), 1.5, MPI.DOUBLE])),
            _raises(lambda: comm.Send(None, comm.rank)),
            _raises(lambda: comm.Send("hello", comm.rank)),
            _raises(lambda: comm.Allreduce(np.zeros(3), np.zeros(3, "i"))),
            _raises(lambda: comm.Allreduce(np.zeros(3), np.zeros(4))),
            _raises(lambda: comm.Alltoallv([np.zeros(3), []], [np.zeros(3), [3] * comm.size]))]


def matched_probes():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    reqs = [comm.Isend(np.full(3, 10.0 * r + t), right, t) for t in (1, 2)] + [comm.isend({"from": r}, right, 3)]
    status = MPI.Status()
    second = comm.Mprobe(left, 2, status)  # taken out of order: the tag-1 message stays for its receive
    out = [status.Get_source(), status.Get_tag(), status.Get_count(MPI.DOUBLE), bool(second)]
    got2, got1 = np.zeros(3), np.zeros(3)
    first = comm.Improbe(left, 1)
    first.Irecv(got1).Wait()
    second.Recv(got2)
    obj = None
    while obj is None:  # a matched probe of an object message, polled
        msg = comm.improbe(left, 3)
        obj = msg.recv() if msg is not None else None
    MPI.Request.Waitall(reqs)
    noproc = comm.Mprobe(MPI.PROC_NULL)
    return out + [bool(second), got1.tolist(), got2.tolist(), obj, comm.Improbe(left, 1) is None,
                  noproc == MPI.MESSAGE_NO_PROC, noproc.recv() is None, noproc == MPI.MESSAGE_NULL]


def errhandlers():
    comm = MPI.COMM_WORLD
    dup = comm.Dup()
    out = [comm.Get_errhandler() == MPI.ERRORS_RETURN, dup.Get_errhandler() == MPI.ERRORS_RETURN]
    dup.Set_errhandler(MPI.ERRORS_ARE_FATAL)
    got = dup.Get_errhandler()
    out += [got == MPI.ERRORS_ARE_FATAL, dup.Dup().Get_errhandler() == MPI.ERRORS_RETURN]
    got.Free()
    out.append(got == MPI.ERRHANDLER_NULL)
    calls = []
    handler = MPI.Comm.Create_errhandler(lambda c, code: calls.append((c == dup, code)))
    dup.Set_errhandler(handler)
    dup.Call_errhandler(MPI.ERR_OTHER)
    out += [calls == [(True, MPI.ERR_OTHER)], _raises(lambda: dup.Set_errhandler(MPI.ERRHANDLER_NULL))]
    dup.Set_errhandler(MPI.ERRORS_RETURN)
    dup.Call_errhandler(MPI.ERR_OTHER)  # returns: nothing happens
    handler.Free()
    dup.Free()
    return out + [bool(handler), _raises(lambda: MPI.COMM_NULL.Get_errhandler())]


def attributes():
    comm = MPI.COMM_WORLD.Dup()
    deleted = []
    plain = MPI.Comm.Create_keyval()
    kept = MPI.Comm.Create_keyval(copy_fn=True, delete_fn=lambda c, k, v: deleted.append(v))
    doubled = MPI.Comm.Create_keyval(copy_fn=lambda c, k, v: v * 2)
    out = [comm.Get_attr(plain), comm.Get_attr(MPI.TAG_UB) >= 32767]
    comm.Set_attr(plain, "a")
    comm.Set_attr(kept, [comm.rank])
    comm.Set_attr(doubled, 21)
    dup = comm.Dup()
    out += [comm.Get_attr(plain), dup.Get_attr(plain), dup.Get_attr(kept) is comm.Get_attr(kept),
            dup.Get_attr(doubled)]
    comm.Set_attr(kept, "b")  # over a value: its delete callback runs
    comm.Delete_attr(kept)
    dup.Free()  # and on Free
    out += [deleted, comm.Get_attr(kept)]
    for keyval in (plain, kept, doubled):
        out.append(MPI.Comm.Free_keyval(keyval) == MPI.KEYVAL_INVALID)
    comm.Free()
    return out


def pkl5_comm():
    from mpi4py.util import pkl5

    comm = pkl5.Intracomm(MPI.COMM_WORLD)
    p, r = comm.size, comm.rank
    big = np.arange(300_000, dtype="i8") * (r + 1)  # 2.4 MB, sent out of band
    got = comm.sendrecv(big, (r + 1) % p, 5, None, (r - 1) % p, 5)
    req = comm.isend({"r": r}, (r + 1) % p, 6)
    msg = comm.mprobe((r - 1) % p, 6)
    obj = msg.recv()
    req.wait()
    dup = comm.Dup()
    out = [int(got[-1]), obj, comm.bcast(big if r == 0 else None, root=0)[-1].item(), comm.allgather(r),
           comm.gather(r, root=0), type(dup).__name__, isinstance(dup, pkl5.Comm)]
    dup.Free()
    return out


def cartesian_queries():
    comm = MPI.COMM_WORLD
    cart = comm.Create_cart([comm.size], periods=True)
    flat = comm.Create_cart([comm.size, 1], [False, True])
    out = [comm.Cart_map([comm.size]), comm.Cart_map([1]) == (0 if comm.rank == 0 else MPI.UNDEFINED),
           cart.is_topo, cart.indegree, cart.inedges, cart.outedges, list(cart.inoutedges[0]), flat.inedges,
           _raises(lambda: comm.Create_cart([comm.size], []))]
    cart.Free()
    flat.Free()
    return out


def persistent_requests():
    """Send_init/Recv_init around a ring, started twice (the send buffer's contents when started go), and a
    persistent Allreduce: inactive requests are true, unequal to REQUEST_NULL, and a Wait on one returns."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    send, got = np.zeros(3), np.zeros(3)
    reqs = [comm.Send_init(send, (r + 1) % p, 4), comm.Recv_init(got, (r - 1) % p, 4)]
    out = [bool(reqs[0]), reqs[0] != MPI.REQUEST_NULL, reqs[0].Wait()]
    rounds = []
    for k in range(2):
        send[:] = r * 10 + k
        MPI.Prequest.Startall(reqs)
        MPI.Prequest.Waitall(reqs)
        rounds.append(got.tolist())
    total = np.zeros(1)
    summed = comm.Allreduce_init(np.full(1, r + 1.0), total)
    summed.Start()
    summed.Wait()
    out += [rounds, bool(reqs[1]), total.tolist(), _raises(lambda: (reqs[0].Start(), reqs[0].Start()))]
    reqs[0].Wait()
    for req in (*reqs, summed):
        req.Free()
    return out + [bool(reqs[0]), reqs[0] == MPI.REQUEST_NULL]


def derived_datatypes():
    """Point to point with vector, indexed and struct-like (hvector) datatypes: sent to a neighbour and
    received as doubles, and received into a datatype (Recv, Sendrecv)."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    a = np.arange(20.0).reshape(4, 5) + 100 * r
    column = MPI.DOUBLE.Create_vector(4, 1, 5).Commit()
    upper = MPI.DOUBLE.Create_indexed([3, 2, 1], [0, 6, 12]).Commit()
    got = np.zeros(4)
    status = MPI.Status()
    comm.Sendrecv([a.reshape(-1)[1:], 1, column], (r + 1) % p, 1, got, (r - 1) % p, 1, status)
    into = np.zeros((4, 5))
    comm.Sendrecv([a, 1, upper], (r + 1) % p, 2, [into, 1, upper], (r - 1) % p, 2)
    back = np.zeros((4, 5))
    if p > 1:
        if r == 0:
            comm.Send(a[:, 2].copy(), 1, 3)
        elif r == 1:
            comm.Recv([back, 1, column], 0, 3)
    out = [got.tolist(), status.Get_count(MPI.DOUBLE), status.Get_count(column), into.tolist(), back.tolist()]
    column.Free()
    upper.Free()
    return out


def derived_truncation():
    """Receives into derived datatypes (vector, indexed) of messages that do not fill them or are too long: the
    elements that come land where the type puts them, a last item in part too, and a truncated receive raises
    MPI.ERR_TRUNCATE with the bytes that fit written and counted. Each rank sends to the other."""
    comm = MPI.COMM_WORLD
    peer = comm.rank ^ 1
    vector = MPI.DOUBLE.Create_vector(3, 1, 2).Commit()
    indexed = MPI.DOUBLE.Create_indexed([2, 1], [0, 4]).Commit()
    out = []
    for tag, (sent, datatype, count, size, nonblocking) in enumerate([
            (5, vector, 2, 12, False), (2, vector, 1, 6, True), (5, vector, 1, 6, False), (4, indexed, 1, 6, True)]):
        # (a fifth receive here, 7 doubles into 2 vectors, got [11, -1, 11, -1, 11] from MPICH 4.x, counted 3)
        data = np.arange(1.0, sent + 1) + 10 * comm.rank
        req = comm.Isend(data, peer, tag)
        got, status = np.full(size, -1.0), MPI.Status()
        if nonblocking:
            raised = _raises(lambda: comm.Irecv([got, count, datatype], peer, tag).Wait(status))
        else:
            raised = _raises(lambda: comm.Recv([got, count, datatype], peer, tag, status))
        req.Wait()
        out.append([raised, got.tolist(), status.Get_count(MPI.DOUBLE), status.Get_count(datatype) == MPI.UNDEFINED,
                    status.Get_source(), status.Get_tag()])
    vector.Free()
    indexed.Free()
    return out


def comm_copy_after_free():
    """A copy (MPI.Comm(c)) of a communicator freed through `c` keeps its handle: true, unequal to COMM_NULL."""
    dup = MPI.COMM_WORLD.Dup()
    copy = MPI.Comm(dup)
    out = [copy == dup]
    dup.Free()
    return out + [bool(dup), dup == MPI.COMM_NULL, bool(copy), copy == MPI.COMM_NULL, copy == dup]


def float_ranks():
    """A float destination, as mpi4py's C int takes it (osu_multi_lat.py sends to ``rank + size / 2``)."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    got = np.zeros(1)
    req = comm.Irecv(got, (r - 1) % p, 3)
    comm.Send(np.full(1, r + 0.5), (r + 1) % p + 0.0, 3)
    req.Wait()
    return got.tolist()


def unmapped_dtypes():
    """Buffers without a datatype whose numpy dtype mpi4py maps to no MPI datatype: text of more than one
    character ('2w', '2s'), void and structured dtypes ('3x', 'T{...}'): KeyError; datetime (no buffer format,
    and DLPack refuses it): BufferError; each read only where mpi4py reads the message (not to MPI.PROC_NULL).
    One-character text maps (MPI.WCHAR, MPI.CHAR), and a datatype given moves any dtype's bytes."""
    comm = MPI.COMM_WORLD
    r = comm.rank
    text = np.array(["ab", "cd"])
    out = [_raises(lambda: comm.Send(text, r)), _raises(lambda: comm.Isend(np.array([b"ab"]), r)),
           _raises(lambda: comm.Sendrecv(np.zeros(2), r, 0, text, r, 0)),  # read before anything is sent
           _raises(lambda: comm.Send_init(text, r)), _raises(lambda: comm.Recv_init(np.zeros(2, "V3"), r)),
           _raises(lambda: comm.Bcast([text, 2])), _raises(lambda: comm.Bcast(memoryview(text))),
           _raises(lambda: comm.Allreduce(np.zeros(2, "i4,f8"), np.zeros(2, "i4,f8"))),
           _raises(lambda: comm.Allgather(MPI.IN_PLACE, np.zeros(2 * comm.size, "S2"))),
           _raises(lambda: comm.Bcast(np.zeros(2, "M8[s]"))), _raises(lambda: comm.Bcast([np.zeros(2, "m8"), 2])),
           _raises(lambda: comm.Isend(text, MPI.PROC_NULL).Wait())]
    one = np.array(["x", "y"]) if r == 0 else np.array(["", ""])
    comm.Bcast(one)
    chars = np.zeros(comm.size, "S1")
    comm.Allgather(np.array([b"ab"[r % 2:r % 2 + 1]]), chars)
    moved = np.array(["ab", "cd"]) if r == 0 else np.zeros(2, "U2")
    comm.Bcast([moved, MPI.BYTE])
    stamps = np.array([1, 2] if r == 0 else [0, 0], "M8[s]")
    comm.Bcast([stamps, MPI.INT64_T])
    return out + [one.tolist(), chars.tolist() == [b"a", b"b"][:comm.size], moved.tolist(), stamps.astype(int).tolist()]


def _resizable(*buffers: bytearray) -> bool:
    """Whether every bytearray can be resized: none has a view alive anywhere (BufferError otherwise)."""
    try:
        for b in buffers:
            b.append(0)
            del b[-1]
    except BufferError:
        return False
    return True


def buffers_released(rounds: int = 20):
    """After a call returns, nothing else holds a view of its buffers (bytearrays stay resizable), round
    after round: the persistent in-place Allgather, the collectives whose members read each other's
    buffers, a neighbour collective, point to point. The names of the calls after which a buffer of
    this rank was still exported, and the persistent in-place Allgather's last result."""
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    nxt, prv, b = (r + 1) % p, (r - 1) % p, MPI.BYTE
    cart = comm.Create_cart([p], periods=[True])
    held = set()
    gathered = bytearray(4 * p)
    for k in range(rounds):
        s, d, s1, d1 = bytearray(4 * p), bytearray(4 * p), bytearray(4), bytearray(4)
        blocks = ([4] * p, [4 * i for i in range(p)])
        gathered[4 * r:4 * r + 4] = bytes([10 * r + k % 10] * 4)
        calls = {
            "Allgather_init in place": lambda: _start_wait_free(comm.Allgather_init(MPI.IN_PLACE, [gathered, b])),
            "Allreduce in place": lambda: comm.Allreduce(MPI.IN_PLACE, [d, b], MPI.BOR),
            "Alltoall": lambda: comm.Alltoall([s, b], [d, b]),
            "Alltoallv": lambda: comm.Alltoallv([s, blocks, b], [d, blocks, b]),
            "Bcast": lambda: comm.Bcast([d, b], root=0),
            "Scatter": lambda: comm.Scatter([s, b], [d1, b], root=0),
            "Gather": lambda: comm.Gather([s1, b], [d, b], root=0),
            "Ialltoall": lambda: comm.Ialltoall([s, b], [d, b]).Wait(),
            "Neighbor_allgather": lambda: cart.Neighbor_allgather([s1, b], [bytearray(8), b]),
            "Sendrecv": lambda: comm.Sendrecv([s1, b], nxt, 1, [d1, b], prv, 1),
        }
        for name, call in calls.items():
            call()
            if not _resizable(s, d, s1, d1, gathered):
                held.add(name)
    cart.Free()
    return [sorted(held), list(gathered)]


def _start_wait_free(request) -> None:
    request.Start()
    request.Wait()
    request.Free()


ALL = (group_null_and_empty, predefined_free, request_copies, byte_order, op_types, fortran_order_and_0d_counts,
       fewer_statuses, failed_requests, refused_buffers, matched_probes, errhandlers, attributes, pkl5_comm,
       cartesian_queries, persistent_requests, derived_datatypes, comm_copy_after_free, float_ranks, buffers_released,
       unmapped_dtypes, derived_truncation)


def run_all():
    out = {}
    for fn in ALL:  # one failing corner does not hide the others
        try:
            out[fn.__name__] = fn()
        except Exception as exc:  # noqa: BLE001 - reported as the value
            out[fn.__name__] = f"raised {type(exc).__name__}: {exc}"
    return out


if __name__ == "__main__":
    results = run_all()
    gathered = MPI.COMM_WORLD.gather(results, root=0)
    if MPI.COMM_WORLD.rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(gathered, f)
