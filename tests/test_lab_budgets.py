"""Exercises 8 and 10 count the bytes a rank sends: gathering X or W in place of the product's blocks fails."""
from __future__ import annotations

import textwrap

import pytest

from spmdsim.tools.lab.exercise import find_exercise
from spmdsim.tools.lab.harness import run_case

#: Each rank gathers the whole X and W and multiplies them: no partial product is summed.
ROW_GATHER_INPUTS = """
    import numpy as np
    def row_parallel_linear(comm, x, w):
        return np.hstack(comm.allgather(x)) @ np.vstack(comm.allgather(w))
    """

#: Each rank gathers the whole W (the weights) and multiplies X by it: the Allgather the exercise asks for,
#: of the weights in place of Y's column blocks.
COLUMN_GATHER_WEIGHTS = """
    import numpy as np
    def column_parallel_linear(comm, x, w):
        every = np.empty((comm.Get_size(),) + w.shape)
        comm.Allgather(np.ascontiguousarray(w), every)
        return x @ np.concatenate(list(every), axis=1)
    """

#: Right solutions in other forms, each within the budget.
ROW_REDUCE_SCATTER_ALLGATHER = """
    import numpy as np
    def row_parallel_linear(comm, x, w):
        n = comm.Get_size()
        flat = (x @ w).ravel()
        counts = [len(c) for c in np.array_split(flat, n)]
        mine = np.empty(counts[comm.Get_rank()])
        comm.Reduce_scatter(flat, mine, counts)
        whole = np.empty_like(flat)
        comm.Allgatherv(mine, (whole, counts))
        return whole.reshape(x.shape[0], w.shape[1])
    """
ROW_REDUCE_BCAST = """
    import numpy as np
    def row_parallel_linear(comm, x, w):
        part = x @ w
        y = np.empty_like(part)
        comm.Reduce(part, y, root=0)
        comm.Bcast(y, root=0)
        return y
    """
COLUMN_OBJECT_ALLGATHER = """
    import numpy as np
    def column_parallel_linear(comm, x, w):
        return np.hstack(comm.allgather(x @ w))
    """


@pytest.mark.parametrize("number, source, words", [
    (8, ROW_GATHER_INPUTS, ["rank 0 sent 144 B at 3 ranks (X 2x9, W 9x4); the algorithm needs 64 B",
                            "comm.allgather at line 3", "sum the partial products x @ w"]),
    (10, COLUMN_GATHER_WEIGHTS, ["rank 0 sent 48 B at 3 ranks (X 2x3, W 3x6); the algorithm needs 32 B",
                                 "comm.Allgather at line 4 sent all of them", "gather each rank's block of Y"]),
], ids=["ex8-gather-x-and-w", "ex10-gather-w"])
def test_gathering_the_inputs_in_place_of_the_products_blocks_sends_too_many_bytes(tmp_path, number, source, words):
    path = tmp_path / "submission.py"
    path.write_text(textwrap.dedent(source).lstrip())
    for seed in (0, 1):
        result = run_case(find_exercise(number), str(path), 3, seed)
        assert result.status == "bytes", result
    result = run_case(find_exercise(number), str(path), 3, 0)
    for word in words:
        assert word in f"{result.reason}\n{result.detail}", result


@pytest.mark.parametrize("number, source", [
    (8, ROW_REDUCE_SCATTER_ALLGATHER), (8, ROW_REDUCE_BCAST), (10, COLUMN_OBJECT_ALLGATHER),
], ids=["ex8-reduce-scatter-allgather", "ex8-reduce-bcast", "ex10-object-allgather"])
def test_a_right_solution_in_another_form_sends_no_more_than_the_budget(tmp_path, number, source):
    path = tmp_path / "submission.py"
    path.write_text(textwrap.dedent(source).lstrip())
    for ranks in (1, 3, 4):
        for seed in (0, 1):
            result = run_case(find_exercise(number), str(path), ranks, seed)
            assert result.passed and result.optimum is not None and result.sent <= result.optimum, result
