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


def test_a_collective_of_a_0d_value_keeps_it_0d():
    """``allreduce(mesh, np.float64(loss), "dp")`` (or a Python float) copied its value with np.ascontiguousarray,
    which makes a 0-d value 1-d: the sum came back of shape (1,), not (), and a gather along dim 0 took the scalar
    for a 1-d block (shape (2,)) where a 0-d array gets a ShapeError (a 0-d value has no dim 0)."""
    from spmdsim.errors import ShapeError
    from spmdsim.runtime import prepare_allreduce

    def body():
        mesh = Mesh(Layout((2,), ("x",)))
        sums = [C.allreduce(mesh, np.float64(1.5 + mesh.rank), "x"), C.allreduce(mesh, 2.0 + mesh.rank, "x", op="max"),
                prepare_allreduce(mesh, np.float32(1.0), "x").run(), C.bcast(mesh, np.float64(7.0 - mesh.rank), "x")]
        said = None
        try:
            C.allgather(mesh, np.float64(1.0), "x", 0)
        except ShapeError as e:
            said = str(e)
        return [(s.shape, s.item()) for s in sums], said

    assert spmdsim.simulate(2, body) == [([((), 4.0), ((), 3.0), ((), 2.0), ((), 7.0)],
                                          "tensor_dim 0 is out of range for an array with 0 dims")] * 2
