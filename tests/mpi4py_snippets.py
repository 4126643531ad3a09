"""Small mpi4py programs whose per-rank results are compared: simulated ranks against MPICH.

    timeout -k 5 120 mpiexec -n 4 python tests/mpi4py_snippets.py OUT.json   # MPICH's results

Each snippet takes nothing, uses ``MPI.COMM_WORLD`` as an mpi4py program does
and returns a JSON-able value; tests/test_sim_mpi4py.py runs the same
snippets on simulated ranks (MPI.COMM_WORLD swapped) and compares, rank by
rank, and also checks the values MPI's semantics give.
"""
from __future__ import annotations

import json
import pickle
import sys

import numpy as np

from mpi4py import MPI


def alltoall_count_per_peer():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    s = np.arange(2 * p, dtype="l") + 10 * r
    out = np.zeros(2 * p + 2, dtype="l")
    comm.Alltoall([s, 2, MPI.LONG], [out, 2, MPI.LONG])
    return out.tolist()


def allgather_and_gather_count_per_peer():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    s = np.array([r, -1], dtype="i")
    out = np.zeros(2 * p, dtype="i")
    comm.Allgather([s, 1, MPI.INT], [out, 1, MPI.INT])
    g = np.zeros(2 * p, dtype="i")
    comm.Gather([s, 1, MPI.INT], [g, 1, MPI.INT], root=0)
    return [out.tolist(), g.tolist()]


def reduce_scatter_block_count():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    s = np.arange(2 * p, dtype="d") + r
    out = np.zeros(3, dtype="d")
    comm.Reduce_scatter_block([s, MPI.DOUBLE], [out, 2, MPI.DOUBLE], op=MPI.SUM)
    return out.tolist()


def recv_status_and_proc_null():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    st = MPI.Status()
    buf = np.zeros(5)
    comm.Sendrecv(np.arange(3.0) + r, (r + 1) % p, 7, buf, (r - 1) % p, 7, status=st)
    got = [st.Get_source(), st.Get_tag(), st.Get_count(MPI.DOUBLE), buf.tolist()]
    null = MPI.Status()
    comm.Recv(np.zeros(2), source=MPI.PROC_NULL, status=null)
    return got + [null.Get_source() == MPI.PROC_NULL, null.Get_tag() == MPI.ANY_TAG, null.Get_count(MPI.BYTE)]


def requests_null_after_wait():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    recv = comm.Irecv(np.zeros(1), (r - 1) % p, 3)
    send = comm.Isend(np.ones(1), (r + 1) % p, 3)
    before = [bool(recv), bool(send)]
    waited = recv.Wait()
    send.Wait()
    statuses = [MPI.Status()]
    reqs = [comm.Isend(np.full(2, r, "i"), (r + 1) % p, 4), comm.Irecv(np.zeros(2, "i"), (r - 1) % p, 4)]
    all_done = MPI.Request.Waitall(reqs, statuses)
    return [before, waited, bool(recv), recv == MPI.REQUEST_NULL, all_done, len(statuses),
            statuses[1].Get_source(), [bool(q) for q in reqs]]


def communicators():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    dup = comm.Dup()
    same = MPI.Comm.Compare(comm, dup)
    dup.Free()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    none = comm.Split_type(MPI.UNDEFINED)
    group = comm.Get_group()
    evens = group.Incl(list(range(0, p, 2)))
    sub = comm.Create(evens)
    sub2 = comm.Create_group(evens) if r % 2 == 0 else MPI.COMM_NULL
    out = [same == MPI.CONGRUENT, dup == MPI.COMM_NULL, node.Get_size(), none == MPI.COMM_NULL,
           group.Get_size(), group.Get_rank(), evens.Get_rank(),
           sub.Get_size() if sub != MPI.COMM_NULL else None,
           sub2.allgather(r) if sub2 != MPI.COMM_NULL else None,
           MPI.Comm.Compare(comm, comm) == MPI.IDENT, comm.Is_intra(), comm.Is_inter()]
    name = comm.Get_name()
    comm.Set_name("mine")
    out += [name, comm.Get_name()]
    comm.Set_name(name)
    for c in (node, sub, sub2):
        if c != MPI.COMM_NULL:
            c.Free()
    return out


def pickled_bytes_and_objects():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    data = pickle.dumps({"from": r, "x": [1, 2, 3]})
    req = comm.Isend([data, MPI.BYTE], (r + 1) % p, 5)
    got = comm.recv(source=(r - 1) % p, tag=5)
    req.Wait()
    mine = {"r": r}
    back = comm.bcast(mine, root=0)
    return [got, back, back is mine]


class _DLPack:
    """A buffer seen only through DLPack (host memory)."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, stream=None, **kwargs):
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class _CAI:
    """A buffer seen only through __cuda_array_interface__ (here host memory, as mpi4py's tests do)."""

    def __init__(self, array):
        self.array = array
        self.__cuda_array_interface__ = {"shape": array.shape, "typestr": array.dtype.str,
                                         "data": (array.ctypes.data, False), "version": 3}


def dlpack_and_cai_in_place():
    comm = MPI.COMM_WORLD
    r = comm.rank
    a = np.full(3, float(r))
    comm.Bcast(_DLPack(a), root=comm.size - 1)
    b = np.full(2, r, dtype="i")
    comm.Allreduce(MPI.IN_PLACE, _CAI(b), op=MPI.SUM)
    return [a.tolist(), b.tolist()]


def in_place_and_none():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    s = np.full(2, r + 1, "i")
    comm.Allreduce(None, s, op=MPI.SUM)
    g = np.arange(p, dtype="i") * (r == 0)
    g[r] = 100 + r
    comm.Allgather(None, g)
    root = np.full(p, -1, "i")
    if r == 0:
        root[0] = 7
        comm.Gather(MPI.IN_PLACE, root, root=0)
    else:
        comm.Gather(np.array([r], "i"), None, root=0)
    return [s.tolist(), g.tolist(), root.tolist() if r == 0 else None]


def alltoallv_forms():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    s = np.arange(2 * p, dtype="i") + 100 * r
    a = np.zeros(2 * p, "i")
    comm.Alltoallv([s, 2], [a, 2])  # one count for every peer
    b = np.zeros(2 * p, "i")
    comm.Alltoallv([s, [2] * p], [b, ([2] * p, [2 * j for j in range(p)]), MPI.INT])
    c = s.copy()
    comm.Alltoallv(MPI.IN_PLACE, [c, 2])
    return [a.tolist(), b.tolist(), c.tolist()]


def bcast_bad_root():
    comm = MPI.COMM_WORLD
    try:
        comm.Bcast(np.zeros(1), root=-1)
    except MPI.Exception as exc:
        return exc.Get_error_class() == MPI.ERR_ROOT
    return "no error"


def eager_ring_of_small_sends():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    if p == 1:
        return None  # MPICH does not buffer a blocking send to itself on one rank: it hangs
    out = np.zeros(4, "i")
    comm.Send(np.full(4, r, "i"), (r + 1) % p, 1)  # everyone sends first: eager below MPICH's limit
    comm.Recv(out, (r - 1) % p, 1)
    got = comm.sendrecv(r * 10, (r + 1) % p, source=(r - 1) % p)
    comm.send([r], (r + 1) % p, 2)
    obj = comm.recv(source=(r - 1) % p, tag=2)
    return [out.tolist(), got, obj]


def scatter_gather_v():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    counts = [j + 1 for j in range(p)]
    displs = [sum(counts[:j]) for j in range(p)]
    full = np.arange(sum(counts), dtype="d")
    mine = np.zeros(r + 1)
    comm.Scatterv([full, counts, displs, MPI.DOUBLE] if r == 0 else None, mine, root=0)
    block = np.zeros(2, "i")
    comm.Scatter(np.arange(2 * p, dtype="i") if r == 0 else None, block, root=0)
    back = np.zeros(sum(counts)) if r == p - 1 else None
    comm.Gatherv(mine * 2, [back, counts] if r == p - 1 else None, root=p - 1)
    every = np.zeros(sum(counts))
    comm.Allgatherv(mine, [every, counts])
    return [mine.tolist(), block.tolist(), None if back is None else back.tolist(), every.tolist()]


def scans_and_reductions():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    x = np.array([r + 1, 2 * r], "i")
    inc = np.zeros(2, "i")
    comm.Scan(x, inc, op=MPI.SUM)
    exc = np.full(2, -9, "i")
    comm.Exscan(x, exc, op=MPI.SUM)
    req = comm.Iscan(x, np.zeros(2, "i"))
    req.Wait()
    counts = [j + 1 for j in range(p)]
    rs = np.zeros(r + 1, "i")
    comm.Reduce_scatter(np.arange(sum(counts), dtype="i"), rs, counts, op=MPI.SUM)
    pair = np.array([(float((r * 3) % p), r)], dtype=np.dtype([("v", "f8"), ("i", "i4")], align=True))
    best = np.zeros(1, dtype=pair.dtype)
    comm.Allreduce([pair, MPI.DOUBLE_INT], [best, MPI.DOUBLE_INT], op=MPI.MAXLOC)
    worst = comm.allreduce((float((r * 3) % p), r), op=MPI.MINLOC)
    land = np.zeros(1, "i")
    comm.Allreduce(np.array([r > 0], "i"), land, op=MPI.LAND)
    return [inc.tolist(), exc.tolist() if r else None, rs.tolist(), [float(best["v"][0]), int(best["i"][0])],
            list(worst), land.tolist(), comm.scan(r), comm.exscan(r)]


def p2p_more():
    comm = MPI.COMM_WORLD
    p, r = comm.size, comm.rank
    buf = np.full(3, r, "i")
    comm.Sendrecv_replace(buf, (r + 1) % p, 0, (r - 1) % p, 0)
    req = comm.issend({"r": r}, (r + 1) % p, 8)
    got = comm.recv(source=(r - 1) % p, tag=8)
    req.wait()
    req = comm.irecv(source=(r - 1) % p, tag=9)
    comm.ssend(r, (r + 1) % p, 9)
    flag, obj = req.test()
    while not flag:
        flag, obj = req.test()
    st = MPI.Status()
    comm.isend("probe me", (r + 1) % p, 10)
    comm.Probe((r - 1) % p, 10, st)
    probed = [st.Get_source(), st.Get_tag()]
    comm.recv(source=(r - 1) % p, tag=10)
    reqs = [comm.irecv(source=(r - 1) % p, tag=11), comm.isend(r, (r + 1) % p, 11)]
    index, first = MPI.Request.waitany(reqs)
    rest = MPI.Request.waitall(reqs)
    return [buf.tolist(), got, obj, probed, index in (0, 1), rest[0] if index == 1 else first]


SNIPPETS = [alltoall_count_per_peer, allgather_and_gather_count_per_peer, reduce_scatter_block_count,
            recv_status_and_proc_null, requests_null_after_wait, communicators, pickled_bytes_and_objects,
            dlpack_and_cai_in_place, in_place_and_none, alltoallv_forms, bcast_bad_root,
            eager_ring_of_small_sends, scatter_gather_v, scans_and_reductions, p2p_more]


def run_all():
    """{snippet name: its result on this rank} (JSON-able)."""
    return {f.__name__: json.loads(json.dumps(f())) for f in SNIPPETS}


if __name__ == "__main__":
    results = MPI.COMM_WORLD.gather(run_all(), root=0)
    if MPI.COMM_WORLD.rank == 0:
        with open(sys.argv[1], "w") as out:
            json.dump(results, out)
