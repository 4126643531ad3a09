"""Derived datatypes in the emulator's reductions and in-place collectives (spmdsim.emulator.derived): what the
lab programs (tests/data/lab/reduce_derived_user.py, inplace_derived.py) do not show, on simulated ranks."""
from __future__ import annotations

import numpy as np
import pytest

from spmdsim.emulator.mpi4py_world import swapped
from spmdsim.errors import DTypeError, ShapeError
from spmdsim.runtime.sim import simulate

MPI = pytest.importorskip("mpi4py.MPI")


def _on_ranks(n: int, body):
    with swapped():
        return simulate(n, body)


def _column_sums():
    """Three columns of a 4 x 3 matrix as one column type resized to a double (its data reach past count
    extents): a user op's Allreduce of them, what its function saw, and an Exscan's and an in-place
    Reduce_scatter_block's results."""
    comm = MPI.COMM_WORLD
    r, g = comm.rank, comm.size
    column = MPI.DOUBLE.Create_vector(4, 1, 3)
    one = column.Create_resized(0, 8).Commit()
    pair = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()
    seen = []

    def add(x, y, datatype):  # a column's 4 doubles lie 3 apart, past the memory's count extents
        if datatype != pair:
            seen.append((len(x), len(y), datatype == one))
        n = len(x) // datatype.extent
        shape, strides = ((n, 4), (8, 24)) if datatype == one else ((n, 2), (24, 16))  # one's, or pair's
        xs, ys = (np.lib.stride_tricks.as_strided(np.frombuffer(m, np.float64), shape, strides) for m in (x, y))
        ys += xs

    plus = MPI.Op.Create(add, commute=True)
    a = np.arange(12.0) + 100 * r
    got = np.full(12, -1.0)
    comm.Allreduce([a, 2, one], [got, 2, one], op=plus)  # columns 0 and 1; column 2 untouched
    ex = np.full(12, -1.0)
    comm.Exscan([a, 3, one], [ex, 3, one], op=plus)
    block = np.arange(3.0 * g) + 10 * r  # g pairs: doubles 0 and 2 of each 3
    comm.Reduce_scatter_block(MPI.IN_PLACE, [block, 1, pair], op=plus)
    for t in (column, one, pair, plus):
        t.Free()
    return got.tolist(), set(seen), ex.tolist(), block.tolist()


def test_user_op_on_a_resized_column_type():
    g = 3
    results = _on_ranks(g, _column_sums)
    # count extents of memory, as mpi4py hands them over (on whichever ranks fold: MPICH's tree picks others)
    assert set().union(*(seen for _, seen, _, _ in results)) == {(16, 16, True), (24, 24, True)}
    for r, (got, _, ex, block) in enumerate(results):
        a = [np.arange(12.0) + 100 * q for q in range(g)]
        want = np.full(12, -1.0)
        for k in range(4):
            for j in (0, 1):
                want[3 * k + j] = sum(x[3 * k + j] for x in a)
        assert got == want.tolist()
        if r == 0:
            assert ex == [-1.0] * 12  # rank 0's receive buffer left as it was
        else:
            assert ex == [sum(a[q][i] for q in range(r)) for i in range(12)]
        mine = np.arange(3.0 * g) + 10 * r
        reduced = [sum(np.arange(3.0 * g)[3 * r + i] + 10 * q for q in range(g)) for i in range(3)]
        assert block == [reduced[0], mine[1], reduced[2], *mine[3:]]


def _refusals():
    comm = MPI.COMM_WORLD
    column = MPI.DOUBLE.Create_vector(2, 1, 2).Commit()
    plus = MPI.Op.Create(lambda x, y, datatype: None, commute=True)
    a, b = np.zeros(12), np.zeros(12)
    out = []
    for call in (lambda: comm.Allreduce([a, 2, column], [b, 4, MPI.DOUBLE], op=plus),
                 lambda: comm.Allreduce([a, 2, column], [b, 3, column], op=plus),
                 lambda: comm.Reduce_scatter_block([a, 2, column], [b, 1, column], op=plus),
                 lambda: comm.Allgather(MPI.IN_PLACE, [np.zeros(9), column])):
        try:
            call()
            out.append("ran")
        except Exception as exc:  # noqa: BLE001 - the class and line are the answer
            out.append((type(exc), str(exc)))
    column.Free()
    plus.Free()
    return out


def test_mismatched_messages_are_refused_in_one_line():
    for found in _on_ranks(2, _refusals):
        types, counts, blocks, split = found
        assert types == (DTypeError, "Allreduce: mismatch in send and receive MPI datatypes: a vector type is "
                                     "sent, MPI.DOUBLE received; a reduction takes one datatype")
        assert counts == (ShapeError, "Allreduce: 2 items of a vector type are sent but the receive buffer "
                                      "takes 3")
        assert blocks == (ShapeError, "Reduce_scatter_block: 2 items of a vector type are sent per rank but "
                                      "the receive buffer takes 1")
        assert split == (ValueError, "message: cannot infer count, 3 items of a vector type do not split into 2 "
                                     "equal blocks")
        assert issubclass(types[0], ValueError) and issubclass(counts[0], ValueError)  # mpi4py's class


def _column_around_the_ring():
    """Each rank's column 1 of a 3 x 4 matrix (a vector type) to the next rank in place, by Sendrecv_replace and
    then Isendrecv_replace, as a halo exchange moves a column; the other columns untouched."""
    comm = MPI.COMM_WORLD
    r, g = comm.rank, comm.size
    column = MPI.DOUBLE.Create_vector(3, 1, 4).Commit()
    a = np.arange(12.0).reshape(3, 4) + 100 * r
    st = MPI.Status()
    comm.Sendrecv_replace([a.reshape(-1)[1:], 1, column], dest=(r + 1) % g, source=(r - 1) % g, status=st)
    b = a.copy()
    comm.Isendrecv_replace([b, 1, column], dest=(r + 1) % g, source=(r - 1) % g).Wait()
    column.Free()
    return a.tolist(), b.tolist(), st.Get_source(), st.Get_count(MPI.DOUBLE)


def test_sendrecv_replace_of_a_derived_datatype_moves_what_the_type_covers():
    """A column type in Sendrecv_replace was "derived datatypes other than contiguous ones are not simulated",
    where Sendrecv took it: the message is now sent packed, and unpacked into the buffer."""
    g = 3
    for r, (a, b, source, count) in enumerate(_on_ranks(g, _column_around_the_ring)):
        before = (r - 1) % g
        want = np.arange(12.0).reshape(3, 4) + 100 * r
        want[:, 1] = np.arange(1.0, 12.0, 4) + 100 * before
        assert a == want.tolist() and (source, count) == (before, 3)
        want[:, 0] = np.arange(0.0, 12.0, 4) + 100 * before  # then column 0, from the same rank
        assert b == want.tolist()
