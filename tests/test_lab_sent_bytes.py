"""What spmdsim lab counts a collective (or an object) as sending from each rank (spmdsim.tools.lab.sent_bytes),
and exercise 16's byte budget, which a broadcast of the whole block exceeds."""
from __future__ import annotations

import textwrap
import types

import numpy as np
import pytest

from spmdsim.runtime.sim._mpi import IN_PLACE
from spmdsim.tools.lab.exercise import find_exercise
from spmdsim.tools.lab.harness import run_case
from spmdsim.tools.lab.sent_bytes import collective_sent, object_bytes


class _Comm:
    """The size and rank a rule reads from its communicator."""

    def __init__(self, size: int, rank: int) -> None:
        self.size, self.rank = size, rank

    def Get_size(self) -> int:  # noqa: N802 - mpi4py's name
        return self.size

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank


X = np.arange(6.0)  # 48 bytes: 3 blocks of 16 on 3 ranks
ROWS = [np.zeros(2), np.zeros(3), np.zeros(4)]  # 16, 24 and 32 bytes

#: (call, arguments, ranks, rank, bytes that rank sends).
RULES = [
    ("Bcast", dict(buf=X, root=0), 4, 0, 48),
    ("Bcast", dict(buf=X, root=0), 4, 1, 0),
    ("Bcast", dict(buf=X, root=0), 1, 0, 0),
    ("Ibcast", dict(buf=[X, 2, None], root=3), 4, 3, 16),
    ("Bcast_init", dict(buf=X, root=1), 2, 1, 48),
    ("bcast", dict(obj=X, root=2), 3, 2, 48),
    ("bcast", dict(obj=X, root=2), 3, 0, 0),
    ("Scatter", dict(sendbuf=X, recvbuf=np.empty(2), root=0), 3, 0, 32),
    ("Scatter", dict(sendbuf=None, recvbuf=np.empty(2), root=0), 3, 1, 0),
    ("Scatterv", dict(sendbuf=[X, [1, 2, 3]], recvbuf=np.empty(2), root=1), 3, 1, 32),
    ("scatter", dict(sendobj=ROWS, root=0), 3, 0, 56),
    ("Gather", dict(sendbuf=X, recvbuf=None, root=0), 3, 1, 48),
    ("Gather", dict(sendbuf=X, recvbuf=np.empty(18), root=0), 3, 0, 0),
    ("Igatherv", dict(sendbuf=X, recvbuf=None, root=2), 3, 0, 48),
    ("gather", dict(sendobj=ROWS[1], root=0), 3, 2, 24),
    ("Allgather", dict(sendbuf=X, recvbuf=np.empty(18)), 3, 0, 48),
    ("Allgather", dict(sendbuf=IN_PLACE, recvbuf=X), 3, 0, 16),
    ("Allgatherv", dict(sendbuf=IN_PLACE, recvbuf=[X, [1, 2, 3]]), 3, 1, 16),
    ("allgather", dict(sendobj=ROWS[2]), 2, 1, 32),
    ("Alltoall", dict(sendbuf=X, recvbuf=np.empty(6)), 3, 1, 32),
    ("Alltoall", dict(sendbuf=IN_PLACE, recvbuf=X), 3, 1, 32),
    ("Alltoallv", dict(sendbuf=[X, [1, 2, 3]], recvbuf=None), 3, 2, 24),
    ("alltoall", dict(sendobj=ROWS), 3, 1, 48),
    ("Reduce", dict(sendbuf=X, recvbuf=None, root=0), 3, 1, 48),
    ("Reduce", dict(sendbuf=X, recvbuf=np.empty(6), root=0), 3, 0, 0),
    ("reduce", dict(sendobj=ROWS[0], root=1), 3, 0, 16),
    ("Allreduce", dict(sendbuf=X, recvbuf=np.empty(6)), 4, 2, 48),
    ("Iallreduce", dict(sendbuf=IN_PLACE, recvbuf=X), 4, 2, 48),
    ("allreduce", dict(sendobj=ROWS[1]), 2, 0, 24),
    ("Reduce_scatter_block", dict(sendbuf=X, recvbuf=np.empty(2)), 3, 0, 32),
    ("Reduce_scatter", dict(sendbuf=X, recvbuf=np.empty(1), recvcounts=[1, 2, 3]), 3, 0, 40),
    ("Reduce_scatter", dict(sendbuf=X, recvbuf=np.empty(3), recvcounts=None), 3, 2, 24),
    ("Scan", dict(sendbuf=X, recvbuf=np.empty(6)), 4, 0, 48),
    ("Exscan", dict(sendbuf=X, recvbuf=np.empty(6)), 4, 3, 0),
    ("scan", dict(sendobj=ROWS[0]), 4, 3, 0),
    ("Barrier", {}, 4, 0, 0),
    ("Bcast", dict(buf="not a buffer", root=0), 4, 0, 0),
]


@pytest.mark.parametrize("call, arguments, size, rank, sent", RULES,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(RULES)])
def test_a_collective_sends_the_data_of_its_rank_that_the_other_ranks_receive_once(call, arguments, size, rank,
                                                                                     sent):
    assert collective_sent(call, arguments, _Comm(size, rank)) == sent


#: Exercise 16's solutions that broadcast the one row, in the forms a student writes.
ONE_ROW = {
    "Bcast": """
        import numpy as np
        def last_position(comm, x):
            n = comm.Get_size()
            row = x[-1].copy() if comm.Get_rank() == n - 1 else np.empty(x.shape[1])
            comm.Bcast(row, root=n - 1)
            return row
        """,
    "bcast": """
        def last_position(comm, x):
            n = comm.Get_size()
            return comm.bcast(x[-1] if comm.Get_rank() == n - 1 else None, root=n - 1)
        """,
    # a list of the row's floats: its pickle is 43 B for 3 of them, its values 24
    "bcast_list": """
        import numpy as np
        def last_position(comm, x):
            n = comm.Get_size()
            return np.array(comm.bcast(x[-1].tolist() if comm.Get_rank() == n - 1 else None, root=n - 1))
        """,
    "Bcast_1xd": """
        import numpy as np
        def last_position(comm, x):
            n = comm.Get_size()
            row = x[-1:].copy() if comm.Get_rank() == n - 1 else np.empty((1, x.shape[1]))
            comm.Bcast(row, root=n - 1)
            return row[0]
        """,
    "Ibcast": """
        import numpy as np
        def last_position(comm, x):
            n = comm.Get_size()
            row = x[-1].copy() if comm.Get_rank() == n - 1 else np.empty(x.shape[1])
            comm.Ibcast(row, root=n - 1).Wait()
            return row
        """,
}

#: Exercise 16 solved by broadcasting the last rank's whole block: right values, s/n times the bytes.
WHOLE_BLOCK = {
    "Bcast": """
        import numpy as np
        def last_position(comm, x):
            n = comm.Get_size()
            block = x.copy() if comm.Get_rank() == n - 1 else np.empty_like(x)
            comm.Bcast(block, root=n - 1)
            return block[-1]
        """,
    "Bcast_init": """
        import numpy as np
        def last_position(comm, x):
            n = comm.Get_size()
            block = x.copy() if comm.Get_rank() == n - 1 else np.empty_like(x)
            request = comm.Bcast_init(block, root=n - 1)
            request.Start()
            request.Wait()
            return block[-1]
        """,
}


def _run(tmp_path, source: str, ranks: int, seed: int):
    path = tmp_path / "submission.py"
    path.write_text(textwrap.dedent(source).lstrip())
    return run_case(find_exercise(16), str(path), ranks, seed)


@pytest.mark.parametrize("form", sorted(ONE_ROW))
def test_broadcasting_the_one_row_meets_exercise_16s_budget_in_every_form(tmp_path, form):
    for ranks in (1, 3, 8):
        for seed in (0, 1):
            result = _run(tmp_path, ONE_ROW[form], ranks, seed)
            assert result.passed, result
            assert result.sent == result.optimum == (0 if ranks == 1 else (3 if seed == 0 else 4) * 8), result


@pytest.mark.parametrize("form", sorted(WHOLE_BLOCK))
def test_broadcasting_the_whole_block_fails_exercise_16_naming_the_rank_its_bytes_and_the_call(tmp_path, form):
    result = _run(tmp_path, WHOLE_BLOCK[form], 3, 1)
    line = 5 if form == "Bcast" else 6
    call = "comm.Bcast" if form == "Bcast" else "request.Start"
    assert result.status == "bytes", result
    assert result.reason == (f"rank 2 sent 96 B at 3 ranks (A 9x4); the algorithm needs 32 B from its busiest rank; "
                             f"{call} at line {line} sent all of them: broadcast the one row from the rank that "
                             "holds it")


def test_an_object_counts_its_arrays_values_and_anything_else_its_pickle():
    boxed = np.empty(2, dtype=object)
    boxed[0], boxed[1] = np.zeros(1000), 1
    assert object_bytes(np.zeros(3)) == object_bytes(np.zeros((3, 3))[:, 1]) == 24
    assert object_bytes(np.float64(1.0)) == 8 and object_bytes([np.zeros(2), np.ones(3)]) == 40
    # an array of objects holds pointers; an object naming __array_interface__ no buffer: their pickles count
    assert object_bytes(boxed) > 8000
    assert object_bytes(types.SimpleNamespace(__array_interface__=None, data=np.zeros(1000))) > 8000
    assert object_bytes([types.SimpleNamespace(__array_interface__=None, data=np.zeros(1000))]) > 8000
    # a Python number is 8 bytes, as an int64 or float64; an int past 64 bits its own (an array packed in it)
    assert object_bytes(3) == object_bytes(2.5) == 8 and object_bytes([1.0, 2, 3]) == 24
    assert object_bytes(int.from_bytes(np.arange(100.0).tobytes(), "little")) == 800


def test_gathering_x_and_w_in_an_array_of_objects_fails_exercise_8s_budget(tmp_path):
    path = tmp_path / "submission.py"
    path.write_text(textwrap.dedent("""
        import numpy as np
        def row_parallel_linear(comm, x, w):
            box = np.empty(2, dtype=object)
            box[0], box[1] = x, w
            every = comm.allgather(box)
            comm.allreduce(np.zeros(1))
            return np.hstack([b[0] for b in every]) @ np.vstack([b[1] for b in every])
        """).lstrip())
    result = run_case(find_exercise(8), str(path), 3, 0)
    assert result.status == "bytes" and "comm.allgather at line 5" in result.reason, result
