"""What a collective keeps per mesh after its first call (spmdsim.runtime.collectives, door.repeat): a call
repeated with the same group, shape, dtype and dims reuses it; any other call, a traced one, a closed mesh's
or another mesh's, gets what a first call gets."""
from __future__ import annotations

import numpy as np

import spmdsim
from spmdsim import Layout, Mesh
from spmdsim.base.context import current
from spmdsim.runtime import collect_trace
from spmdsim.runtime import collectives as C


def _rows(trace):
    """A trace's entries less their times."""
    return [(e.op, e.axes, e.group_size, e.bytes_sent, e.bytes_received, e.label, e.bytes_copied, e.peers)
            for e in trace.entries]


def _body():
    comm = spmdsim.world()
    r = comm.Get_rank()
    mesh = Mesh(Layout((2, 2), ("dp", "tp")), comm)
    tp, dp = mesh.group_ranks("tp"), mesh.group_ranks("dp")
    mine = lambda rank, dtype=np.float32: (np.arange(12, dtype=dtype).reshape(4, 3) + 100 * rank)  # noqa: E731
    x = mine(r)
    seen = []
    for _ in range(2):  # the first round makes the plans, the second uses them
        np.testing.assert_array_equal(C.allgather(mesh, x, "tp", 0), np.concatenate([mine(j) for j in tp], 0))
        np.testing.assert_array_equal(C.allgather(mesh, x, "tp", 1), np.concatenate([mine(j) for j in tp], 1))
        np.testing.assert_array_equal(C.allgather(mesh, x, "dp", 0), np.concatenate([mine(j) for j in dp], 0))
        wide = C.allgather(mesh, x.astype(np.float64), "tp", 0)
        assert wide.dtype == np.float64
        np.testing.assert_array_equal(wide, np.concatenate([mine(j, np.float64) for j in tp], 0))
        np.testing.assert_array_equal(C.allreduce(mesh, x, "tp"), sum(mine(j) for j in tp))
        np.testing.assert_array_equal(C.allreduce(mesh, x, "tp", op="max"), mine(max(tp)))
        np.testing.assert_array_equal(C.reduce_scatter(mesh, x, "tp", 0),
                                      np.split(sum(mine(j) for j in tp), 2, 0)[tp.index(r)])
        out = np.empty((4, 3), np.float32)
        assert C.alltoall(mesh, x, "tp", 0, 0, out=out) is out
        np.testing.assert_array_equal(out, np.concatenate([np.split(mine(j), 2, 0)[tp.index(r)] for j in tp], 0))
        inplace = x.copy()
        assert C.allreduce(mesh, inplace, "dp", out=inplace) is inplace
        sent = x.copy()  # received in place: member 1's block on both
        assert C.bcast(mesh, sent, "tp", 1) is sent
        np.testing.assert_array_equal(sent, mine(tp[1]))
        np.testing.assert_array_equal(inplace, sum(mine(j) for j in dp))
        with collect_trace() as trace:  # a trace open: its rows as a first call's
            C.allgather(mesh, x, "tp", 0, label="again")
            C.reduce_scatter(mesh, x, "tp", 0)
        seen.append(_rows(trace))
        seen.append(current().seq)
    kept = len(mesh._plans)
    mesh.close()
    assert not mesh._plans  # its groups freed: its plans with them
    other = Mesh(Layout((2, 2), ("tp", "dp")), comm)  # another mesh: the same names, other groups
    np.testing.assert_array_equal(C.allgather(other, x, "tp", 0),
                                  np.concatenate([mine(j) for j in other.group_ranks("tp")], 0))
    np.testing.assert_array_equal(C.allgather(mesh, x, "tp", 0), np.concatenate([mine(j) for j in tp], 0))
    other.close()
    mesh.close()
    return kept, seen


def test_a_repeated_collective_gets_what_its_first_call_got():
    for kept, (rows1, seq1, rows2, seq2) in spmdsim.simulate(4, _body):
        assert kept == 9  # every call above but the allgather along dim 1 (unpacked: worked out each time)
        assert rows1 == rows2 == [("allgather", ("tp",), 2, 48, 48, "again", 0, 0),  # as main's first calls
                                  ("reduce_scatter", ("tp",), 2, 24, 24, None, 0, 0)]
        assert seq2 - seq1 == 12  # each call numbered as a first one is
