"""Exercises 1, 3 and 4 name the values a rank's messages must carry (`sends`): another rank doing that rank's
work beside messages sent for show fails, naming the rank and the value; right forms pass."""
from __future__ import annotations

import textwrap
import types

import numpy as np
import pytest
from mpi4py import MPI

from spmdsim.tools.lab.contents import payload, uncarried
from spmdsim.tools.lab.exercise import LabError, find_exercise
from spmdsim.tools.lab.harness import run_case

#: Exercise 1: rank 1 sends the array back as it came; rank 0 adds the 1.
PING_ZERO_ADDS = """
    import numpy as np
    def ping_pong(comm, x):
        if comm.Get_rank() == 0:
            comm.Send(x, dest=1)
            reply = np.empty_like(x)
            comm.Recv(reply, source=1)
            return reply + 1
        if comm.Get_rank() == 1:
            got = np.empty_like(x)
            comm.Recv(got, source=0)
            comm.Send(got, dest=0)
            return got
    """
#: Exercise 3: rank 0 sums every interval; the others Reduce zeros.
PI_ZERO_SUMS_ALL = """
    import numpy as np
    def pi_reduce(comm, intervals):
        t = (np.arange(intervals) + 0.5) / intervals
        mine = float(np.sum(4.0 / (1.0 + t * t)) / intervals) if comm.Get_rank() == 0 else 0.0
        total = comm.reduce(mine, root=0)
        return total if comm.Get_rank() == 0 else None
    """
#: Exercise 4: rank 0 computes A @ x; the Scatter and Gather the exercise requires move other values.
MATVEC_ZERO_COMPUTES = """
    import numpy as np
    def matvec(comm, A, x):
        n = comm.Get_size()
        m, k = comm.bcast(None if A is None else A.shape, root=0)
        mine = np.empty((m // n, k))
        comm.Scatter(A, mine, root=0)
        comm.Gather(np.zeros(m // n), np.empty(m) if comm.Get_rank() == 0 else None, root=0)
        return A @ x if comm.Get_rank() == 0 else None
    """
#: Exercise 4: each rank sends a header (its count) then its piece in two halves, from rows it did not multiply.
MATVEC_HEADER_HALVES = """
    import numpy as np
    def matvec(comm, A, x):
        n, rank = comm.Get_size(), comm.Get_rank()
        m, k = comm.bcast(None if A is None else A.shape, root=0)
        mine = np.empty((m // n, k))
        comm.Scatter(A, mine, root=0)
        x = comm.bcast(x, root=0)
        y = {piece}
        h = y.size // 2
        comm.gather(y.size, root=0)  # a header: the count to come
        first, second = (np.empty((n, h)), np.empty((n, y.size - h))) if rank == 0 else (None, None)
        comm.Gather(y[:h], first, root=0)
        comm.Gather(y[h:], second, root=0)
        return {result} if rank == 0 else None
    """


@pytest.mark.parametrize("number, source, words", [
    (1, PING_ZERO_ADDS, "rank 1's messages at 3 ranks (5 values) carried no array it received plus 1: in this "
                        "exercise's algorithm rank 1 computes it and sends it, not another rank"),
    (3, PI_ZERO_SUMS_ALL, "rank 1's messages at 3 ranks (1000 intervals) carried no partial sum of its terms "
                          "i = 1, 1 + 3, ...: in this exercise's algorithm rank 1 computes it and sends it"),
    (4, MATVEC_ZERO_COMPUTES, "rank 1's messages at 3 ranks (A 36x5) carried no rows 12..23 of A times x"),
    (4, MATVEC_HEADER_HALVES.format(piece="mine[:, 0] * x[0]", result="A @ x"),
     "rank 1's messages at 3 ranks (A 36x5) carried no rows 12..23 of A times x"),
], ids=["ex1-rank0-adds", "ex3-rank0-sums-all", "ex4-rank0-multiplies", "ex4-header-then-wrong-halves"])
def test_a_rank_doing_another_ranks_work_fails_naming_the_value(tmp_path, number, source, words):
    path = tmp_path / "submission.py"
    path.write_text(textwrap.dedent(source).lstrip())
    for seed in (0, 1):
        assert run_case(find_exercise(number), str(path), 3, seed).status == "forbidden"
    result = run_case(find_exercise(number), str(path), 3, 0)
    assert words in result.reason, result


#: Right forms: the partial sum without h (rank 0 multiplies), without 4 h, a one-element array by Ireduce,
#: with 4 / h factored out of its terms.
PI_RIGHT = ["""
    def pi_reduce(comm, intervals):
        s = 0.0
        for i in range(comm.Get_rank(), intervals, comm.Get_size()):
            t = (i + 0.5) / intervals
            s += 1.0 / (1.0 + t * t)
        total = comm.reduce(s, root=0)
        return 4.0 * total / intervals if comm.Get_rank() == 0 else None
    """, """
    def pi_reduce(comm, intervals):
        s = 0.0
        for i in range(comm.Get_rank(), intervals, comm.Get_size()):
            t = (i + 0.5) / intervals
            s += 4.0 / (1.0 + t * t)
        total = comm.reduce(s, root=0)
        return total / intervals if comm.Get_rank() == 0 else None
    """, """
    import numpy as np
    def pi_reduce(comm, intervals):
        t = (np.arange(comm.Get_rank(), intervals, comm.Get_size()) + 0.5) / intervals
        mine, total = np.array([np.sum(4.0 / (1.0 + t * t)) / intervals]), np.zeros(1)
        comm.Ireduce(mine, total, root=0).Wait()
        return float(total[0]) if comm.Get_rank() == 0 else None
    """, """
    def pi_reduce(comm, intervals):
        s = 0.0
        for i in range(comm.Get_rank(), intervals, comm.Get_size()):
            s += 1.0 / (intervals * intervals + (i + 0.5) ** 2)  # h * 4 / (1 + t*t), 4 / h factored out
        total = comm.reduce(s, root=0)
        return 4.0 * intervals * total if comm.Get_rank() == 0 else None
    """]
#: Right forms: Gatherv of [piece, MPI.DOUBLE], the lowercase gather of the pieces.
MATVEC_RIGHT = ["""
    import numpy as np
    from mpi4py import MPI
    def matvec(comm, A, x):
        n = comm.Get_size()
        m, k = comm.bcast(None if A is None else A.shape, root=0)
        mine = np.empty((m // n, k))
        comm.Scatter(A, mine, root=0)
        x = comm.bcast(x, root=0)
        y = np.empty(m) if comm.Get_rank() == 0 else None
        comm.Gatherv([mine @ x, MPI.DOUBLE], y, root=0)
        return y
    """, """
    import numpy as np
    def matvec(comm, A, x):
        n = comm.Get_size()
        m, k = comm.bcast(None if A is None else A.shape, root=0)
        mine = np.empty((m // n, k))
        comm.Scatter(A, mine, root=0)
        x = comm.bcast(x, root=0)
        pieces = comm.gather(x @ mine.T, root=0)
        return np.concatenate(pieces) if comm.Get_rank() == 0 else None
    """]
#: Right forms: the lowercase send of the array plus 1; its two halves sent one after the other.
PING_RIGHT = ["""
    import numpy as np
    def ping_pong(comm, x):
        h = x.size // 2
        if comm.Get_rank() == 0:
            comm.Send(x, dest=1)
            reply = np.empty_like(x)
            comm.Recv(reply[:h], source=1)
            comm.Recv(reply[h:], source=1)
            return reply
        if comm.Get_rank() == 1:
            got = np.empty_like(x)
            comm.Recv(got, source=0)
            comm.Send(got[:h] + 1, dest=0)
            comm.Send(got[h:] + 1, dest=0)
            return got
    """, """
    def ping_pong(comm, x):
        if comm.Get_rank() == 0:
            comm.send(x, dest=1)
            return comm.recv(source=1)
        if comm.Get_rank() == 1:
            got = comm.recv(source=0)
            comm.send(got + 1, dest=0)
            return got
    """, """
    import numpy as np
    from mpi4py import MPI
    def ping_pong(comm, x):
        work = np.zeros(2 * x.size + 7)  # a scratch buffer longer than the message: its count is what goes
        if comm.Get_rank() == 0:
            comm.Send([x, x.size, MPI.DOUBLE], dest=1)
            comm.Recv([work, x.size, MPI.DOUBLE], source=1)
            return work[:x.size].copy()
        if comm.Get_rank() == 1:
            comm.Recv([work, x.size, MPI.DOUBLE], source=0)
            got = work[:x.size].copy()
            work[:x.size] += 1
            comm.Send([work, x.size, MPI.DOUBLE], dest=0)
            return got
    """]


MATVEC_HEADER_RIGHT = MATVEC_HEADER_HALVES.format(piece="mine @ x",
                                                  result="np.concatenate([first, second], axis=1).ravel()")


@pytest.mark.parametrize("number, source", [(3, s) for s in PI_RIGHT] + [(4, s) for s in MATVEC_RIGHT]
                         + [(4, MATVEC_HEADER_RIGHT)] + [(1, s) for s in PING_RIGHT],
                         ids=["ex3-4h-factored", "ex3-h-factored", "ex3-ireduce-array", "ex3-4-over-h-factored",
                              "ex4-gatherv-spec",
                              "ex4-object-gather", "ex4-header-then-halves", "ex1-halves", "ex1-objects",
                              "ex1-count-of-a-longer-buffer"])
def test_right_forms_carry_their_ranks_values(tmp_path, number, source):
    path = tmp_path / "submission.py"
    path.write_text(textwrap.dedent(source).lstrip())
    exercise = find_exercise(number)
    for n in exercise.ranks:
        result = run_case(exercise, str(path), n, 0)
        assert result.passed, result


def _frame(**local):
    return types.SimpleNamespace(f_locals=local)


def test_payload_copies_what_a_call_sends_and_reads_no_objects():
    x = np.arange(4.0)
    sent = payload(_frame(sendbuf=x, recvbuf=None))
    x[0] = 9.0  # a buffer rewritten after its send: the copy keeps what went
    assert sent.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert payload(_frame(buf=[np.arange(3, dtype=np.int32), None])).tolist() == [0.0, 1.0, 2.0]
    assert payload(_frame(sendobj=2.5)).tolist() == [2.5]
    assert payload(_frame(obj={"a": 1})) is None
    assert payload(_frame(self=None)) is None  # a persistent request's Start: its data not at hand


def test_a_tuple_of_counts_is_a_v_collectives_by_the_calls_name():
    """(2, 2) is a count and a displacement to a Send, two ranks' counts to an Alltoallv or an Iscatterv."""
    y = np.arange(4.0)
    spec = [y, (2, 2), MPI.DOUBLE]
    assert payload(types.SimpleNamespace(f_locals={"buf": spec}, f_code=_frame.__code__.replace(
        co_name="Send"))).tolist() == [2.0, 3.0]
    for name in ("Alltoallv", "Iscatterv", "Alltoallv_init"):
        code = _frame.__code__.replace(co_name=name)
        assert payload(types.SimpleNamespace(f_locals={"sendbuf": spec}, f_code=code)).tolist() == y.tolist()


def test_uncarried_finds_a_value_at_a_multiple_of_its_size_only():
    def sends(case, n, rank):
        return {"its pair": np.array([1.0, 2.0])} if rank == 1 else {}

    assert uncarried([[], [np.array([0.0, 0.0, 1.0, 2.0])]], sends, {}) is None
    assert uncarried([[], [np.array([0.0, 1.0, 2.0])]], sends, {}) == (1, "its pair")
    assert uncarried([[], [np.array([1.0, 2.0 + 1e-6])]], sends, {}) == (1, "its pair")  # past float64's 1e-9
    assert uncarried([[], [np.array([1.0, 2.0 + 1e-6])]], sends, {}, rtol=1e-5) is None  # the exercise's RTOL
    assert uncarried([[], [None, np.zeros(2)]], sends, {}) is None  # a message it cannot read: not judged
    assert uncarried([[], [np.array([1.0]), np.array([2.0])]], sends, {}) is None  # in pieces, in order
    assert uncarried([[], [np.array([2.0]), np.array([1.0])]], sends, {}) == (1, "its pair")
    header = np.array([7.0])  # a header (a count), then the value in pieces
    assert uncarried([[], [header, np.array([1.0]), np.array([2.0])]], sends, {}) is None
    assert uncarried([[], [np.array([1.0]), header, np.array([2.0])]], sends, {}) == (1, "its pair")
    assert uncarried([[], [header, np.array([1.0]), np.array([2.5])]], sends, {}) == (1, "its pair")


def test_an_exercises_bad_sends_is_said_in_one_line():
    with pytest.raises(LabError, match=r"the exercise's sends\(case, 2, 0\) returned \[1\.0\]: expected a dict"):
        uncarried([[], []], lambda case, n, rank: [1.0], {})
    with pytest.raises(LabError, match=r"names 'x' as 'one': expected numbers, an array of them, or a tuple"):
        uncarried([[], []], lambda case, n, rank: {"x": "one"}, {})
