"""Exercises 8, 10, 11, 17-19, 21 and 22 count the bytes a rank sends: gathering what a partial needs fails."""
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


#: Exercise 17: W's and dy's columns gathered, dx computed whole on every rank, a dummy Allreduce.
BACKWARD_GATHER = """
    import numpy as np
    def column_parallel_backward(comm, x, w, dy):
        W = np.concatenate(comm.allgather(w), axis=1)
        DY = np.concatenate(comm.allgather(dy), axis=1)
        comm.allreduce(0)
        return DY @ W.T, x.T @ dy
    """
#: Exercise 18: every partial gathered and summed whole, a dummy Reduce_scatter.
REDUCE_SCATTER_GATHER = """
    import numpy as np
    def sum_my_block(comm, partial):
        r, n = comm.Get_rank(), comm.Get_size()
        per = partial.size // n
        total = np.sum(comm.allgather(partial), axis=0)
        comm.Reduce_scatter_block(np.zeros(n), np.empty(1))
        return total[r * per:(r + 1) * per]
    """
#: Exercise 21: the heads' outputs and Wo's rows summed into whole ones by zero-padded Allreduces (a gather).
HEADS_PADDED = """
    import numpy as np
    from mpi4py import MPI
    def attention_heads(comm, x, wq, wk, wv, wo, e):
        r, n, s, c = comm.Get_rank(), comm.Get_size(), x.shape[0], wq.shape[1]
        q, k, v = x @ wq, x @ wk, x @ wv
        heads, big_wo = np.zeros((s, n * c)), np.zeros((n * c, wo.shape[1]))
        for h in range(c // e):
            cut = slice(h * e, (h + 1) * e)
            scores = np.where(np.tril(np.ones((s, s), bool)), q[:, cut] @ k[:, cut].T / np.sqrt(e), -np.inf)
            weights = np.exp(scores - scores.max(axis=1, keepdims=True))
            heads[:, r * c + h * e:r * c + (h + 1) * e] = weights / weights.sum(axis=1, keepdims=True) @ v[:, cut]
        big_wo[r * c:(r + 1) * c] = wo
        comm.Allreduce(MPI.IN_PLACE, heads)
        comm.Allreduce(MPI.IN_PLACE, big_wo)
        return heads @ big_wo
    """
#: Exercise 22: the sequence and both weights gathered, Y computed whole, a dummy Reduce_scatter.
MLP_GATHER_WEIGHTS = """
    import numpy as np
    def sequence_parallel_mlp(comm, x, w1, w2):
        r, n = comm.Get_rank(), comm.Get_size()
        whole = np.empty((n,) + x.shape)
        comm.Allgather(x, whole)
        W1 = np.concatenate(comm.allgather(w1), axis=1)
        W2 = np.concatenate(comm.allgather(w2), axis=0)
        y = np.maximum(whole.reshape(-1, x.shape[1]) @ W1, 0) @ W2
        comm.Reduce_scatter_block(np.zeros(n), np.empty(1))
        return y[r * x.shape[0]:(r + 1) * x.shape[0]]
    """


@pytest.mark.parametrize("number, source, ranks, words", [
    (17, BACKWARD_GATHER, 8, ["rank 0 sent 88 B at 8 ranks (X 2x3, W 3x16); the algorithm needs 48 B",
                              "comm.allgather at line 3 sent 48 B of them", "dw needs no communication"]),
    (18, REDUCE_SCATTER_GATHER, 3, ["rank 0 sent 64 B at 3 ranks (N=6); the algorithm needs 32 B",
                                    "comm.allgather at line 5 sent 48 B of them", "sums and splits in one call"]),
    (21, HEADS_PADDED, 2, ["rank 0 sent 320 B at 2 ranks (s=4, d=6, H=2, e=2); the algorithm needs 192 B",
                           "each rank's heads give a partial output"]),
    (22, MLP_GATHER_WEIGHTS, 8, ["rank 0 sent 488 B at 8 ranks (X 16x3, f=64); the algorithm needs 384 B",
                                 "comm.allgather at line 6 sent 192 B of them", "in one Reduce_scatter"]),
], ids=["ex17-gather-w-dy", "ex18-gather-partials", "ex21-padded-allreduce", "ex22-gather-weights"])
def test_gathering_what_a_sum_of_partials_needs_not_sends_too_many_bytes(tmp_path, number, source, ranks, words):
    path = tmp_path / "submission.py"
    path.write_text(textwrap.dedent(source).lstrip())
    result = run_case(find_exercise(number), str(path), ranks, 0)
    assert result.status == "bytes", result
    for word in words:
        assert word in result.reason, result


def test_the_bucket_exercise_allows_its_one_allreduce_and_no_other_call(tmp_path):
    path = tmp_path / "submission.py"
    path.write_text(textwrap.dedent("""
        import numpy as np
        def bucketed_allreduce(comm, grads):
            everyone = comm.allgather(grads)
            comm.allreduce(0)
            return tuple(sum(g[k] for g in everyone) for k in range(len(grads)))
        """).lstrip())
    result = run_case(find_exercise(19), str(path), 3, 0)
    assert result.status == "forbidden" and result.reason.startswith(
        "line 3: comm.allgather is not one of the calls this exercise allows (Allreduce)"), result


#: Right solutions of 17, 18, 19 and 22 in other forms (object calls, MPI.IN_PLACE, the v form).
OTHER_FORMS = [
    (17, """
    def column_parallel_backward(comm, x, w, dy):
        return comm.allreduce(dy @ w.T), x.T @ dy
    """),
    (18, """
    import numpy as np
    def sum_my_block(comm, partial):
        n = comm.Get_size()
        out = np.empty(partial.size // n)
        comm.Reduce_scatter(partial, out, [partial.size // n] * n)
        return out
    """),
    (19, """
    import numpy as np
    from mpi4py import MPI
    def bucketed_allreduce(comm, grads):
        bucket = np.concatenate([g.ravel() for g in grads])
        comm.Allreduce(MPI.IN_PLACE, bucket)
        return tuple(part.reshape(g.shape) for part, g in
                     zip(np.split(bucket, np.cumsum([g.size for g in grads])[:-1]), grads))
    """),
    (22, """
    import numpy as np
    def sequence_parallel_mlp(comm, x, w1, w2):
        n = comm.Get_size()
        partial = np.maximum(np.concatenate(comm.allgather(x)) @ w1, 0) @ w2
        out = np.empty_like(x)
        comm.Reduce_scatter_block(partial, out)
        return out
    """),
]


@pytest.mark.parametrize("number, source", [
    (8, ROW_REDUCE_SCATTER_ALLGATHER), (8, ROW_REDUCE_BCAST), (10, COLUMN_OBJECT_ALLGATHER)] + OTHER_FORMS,
    ids=["ex8-reduce-scatter-allgather", "ex8-reduce-bcast", "ex10-object-allgather"]
    + [f"ex{n}" for n, _ in OTHER_FORMS])
def test_a_right_solution_in_another_form_sends_no_more_than_the_budget(tmp_path, number, source):
    path = tmp_path / "submission.py"
    path.write_text(textwrap.dedent(source).lstrip())
    for ranks in (1, 3, 4):
        for seed in (0, 1):
            result = run_case(find_exercise(number), str(path), ranks, seed)
            assert result.passed and result.optimum is not None and result.sent <= result.optimum, result
