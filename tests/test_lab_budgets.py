"""Exercises 3, 4, 8, 10, 11, 17-19, 21 and 22 count the bytes a rank sends: gathering what a partial needs
fails; 3, 10-12, 15-22 allow only the collectives they ask for, 13 and 14 no communication."""
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


#: Exercise 17: W's and dy's columns gathered by zero-padded Allreduces (the one call it allows), dx computed whole.
BACKWARD_GATHER = """
    import numpy as np
    def column_parallel_backward(comm, x, w, dy):
        r, n, per = comm.Get_rank(), comm.Get_size(), w.shape[1]
        W, DY = np.zeros((w.shape[0], n * per)), np.zeros((dy.shape[0], n * per))
        W[:, r * per:(r + 1) * per], DY[:, r * per:(r + 1) * per] = w, dy
        return comm.allreduce(DY) @ comm.allreduce(W).T, x.T @ dy
    """
#: Exercise 18: the whole sum on every rank by a Reduce_scatter of n copies of the partial (an Allreduce's
#: sum), this rank's block kept.
REDUCE_SCATTER_GATHER = """
    import numpy as np
    def sum_my_block(comm, partial):
        r, n = comm.Get_rank(), comm.Get_size()
        per = partial.size // n
        total = np.empty_like(partial)
        comm.Reduce_scatter_block(np.tile(partial, n), total)
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
    (17, BACKWARD_GATHER, 8, ["rank 0 sent 640 B at 8 ranks (X 2x3, W 3x16); the algorithm needs 48 B",
                              "comm.allreduce at line 6 sent all of them", "dw needs no communication"]),
    (18, REDUCE_SCATTER_GATHER, 3, ["rank 0 sent 96 B at 3 ranks (N=6); the algorithm needs 32 B",
                                    "comm.Reduce_scatter_block at line 6 sent all", "sums and splits in one call"]),
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


#: Another algorithm within the bytes, beside a dummy call of the collective asked for, or a rank computing what
#: each rank could compute alone and sending it to them: each exercise's rules name the call.
OTHER_ALGORITHMS = [
    (3, ["line 7: comm.recv is not one of the calls this exercise allows (Reduce)"], """
    def pi_reduce(comm, intervals):
        r, n = comm.Get_rank(), comm.Get_size()
        part = sum(4.0 / (1.0 + ((i + 0.5) / intervals) ** 2) for i in range(r, intervals, n)) / intervals
        comm.reduce(0.0, root=0)
        if r:
            comm.send(part, dest=0)
        return part + sum(comm.recv(source=k) for k in range(1, n)) if r == 0 else None
    """),
    (3, ["line 7: fh.Write_at_all is not one of the calls this exercise allows (Reduce)"], """
    import numpy as np
    from mpi4py import MPI
    def pi_reduce(comm, intervals):
        r, n = comm.Get_rank(), comm.Get_size()
        part = sum(4.0 / (1.0 + ((i + 0.5) / intervals) ** 2) for i in range(r, intervals, n)) / intervals
        fh = MPI.File.Open(comm, "parts.bin", MPI.MODE_CREATE | MPI.MODE_RDWR | MPI.MODE_DELETE_ON_CLOSE)
        fh.Write_at_all(8 * r, np.array([part]))
        comm.reduce(0.0, root=0)
        got = np.empty(n)
        fh.Read_at_all(0, got)
        fh.Close()
        return float(got.sum()) if r == 0 else None
    """),
    (4, ["rank 0 sent 1,480 B at 3 ranks (A 36x5); the algorithm needs 1,256 B", "comm.bcast at line 4"], """
    import numpy as np
    def matvec(comm, A, x):
        r, n = comm.Get_rank(), comm.Get_size()
        A, x = comm.bcast(A, root=0), comm.bcast(x, root=0)
        comm.Scatter(np.zeros(0) if r == 0 else None, np.empty(0), root=0)
        y = np.empty(A.shape[0]) if r == 0 else None
        comm.Gather(np.split(A, n)[r] @ x, y, root=0)
        return y
    """),
    (12, ["line 7: comm.Scatter is not one of the calls this exercise allows (Alltoall)"], """
    import numpy as np
    def rows_to_columns(comm, x):
        n, r = comm.Get_size(), comm.Get_rank()
        send = np.ascontiguousarray(np.stack(np.split(x, n, axis=1)))
        recv = np.empty_like(send)
        for root in range(n):
            comm.Scatter(send if r == root else None, recv[root], root=root)
        comm.Alltoall(np.zeros(0), np.zeros(0))
        return np.concatenate(list(recv), axis=0)
    """),
    (13, ["line 8: comm.scatter is not allowed in this exercise", "computes its own schedule"], """
    def one_f_one_b(comm, m):
        p = comm.Get_size()
        every = [[("F", i) for i in range(min(p - r - 1, m))] for r in range(p)]
        for r, order in enumerate(every):
            warm = len(order)
            order += [pair for i in range(m - warm) for pair in (("F", warm + i), ("B", i))]
            order += [("B", i) for i in range(m - warm, m)]
        return comm.scatter(every if comm.Get_rank() == 0 else None, root=0)
    """),
    (14, ["line 14: comm.scatter is not allowed in this exercise", "computes its own block"], """
    def block(rank, devices, aliases, tensor_map, shape):
        sizes, coords = dict(zip(aliases, devices)), {}
        for name, size in reversed(list(zip(aliases, devices))):
            coords[name], rank = rank % size, rank // size
        out = []
        for length, entry in zip(shape, tensor_map):
            index, parts = 0, 1
            for axis in () if entry is None else (entry,) if isinstance(entry, str) else entry:
                index, parts = index * sizes[axis] + coords[axis], parts * sizes[axis]
            out.append((index * length // parts, (index + 1) * length // parts))
        return out
    def my_block(comm, *args):
        every = [block(r, *args) for r in range(comm.Get_size())] if comm.Get_rank() == 0 else None
        return comm.scatter(every, root=0)
    """),
    (15, ["line 6: comm.recv is not one of the calls this exercise allows (Allreduce)"], """
    import numpy as np
    def layer_norm(comm, x):
        n, r = comm.Get_size(), comm.Get_rank()
        s = np.stack([x.sum(axis=1), (x * x).sum(axis=1)])
        comm.Allreduce(np.zeros(0), np.zeros(0))
        parts = [comm.recv(source=k) for k in range(1, n)] if r == 0 else comm.send(s, dest=0)
        s = comm.bcast(s + sum(parts) if r == 0 else None, root=0)
        mean = s[0] / (x.shape[1] * n)
        return (x - mean[:, None]) / np.sqrt(s[1] / (x.shape[1] * n) - mean ** 2 + 1e-5)[:, None]
    """),
    (16, ["line 5: comm.Allreduce is not one of the calls this exercise allows (Bcast)"], """
    import numpy as np
    def last_position(comm, x):
        n, r = comm.Get_size(), comm.Get_rank()
        row, out = x[-1] * (r == n - 1), np.empty(x.shape[1])
        comm.Allreduce(row, out)
        comm.Bcast(np.zeros(0), root=0)
        return out
    """),
    (20, ["line 5: comm.recv is not one of the calls this exercise allows (Allreduce)"], """
    import numpy as np
    def vocab_parallel_cross_entropy(comm, logits, labels):
        n, r = comm.Get_size(), comm.Get_rank()
        comm.Allreduce(np.zeros(0), np.zeros(0))
        whole = comm.send(logits, dest=0) if r else np.hstack([logits] + [comm.recv(source=k) for k in range(1, n)])
        out = None
        if r == 0:
            lse = np.log(np.exp(whole - whole.max(axis=1)[:, None]).sum(axis=1)) + whole.max(axis=1)
            out = np.where(labels == -100, 0.0, lse - whole[np.arange(len(labels)), np.maximum(labels, 0)])
        return comm.bcast(out, root=0)
    """),
    (10, ["line 6: comm.Bcast is not one of the calls this exercise allows (Allgather)"], """
    import numpy as np
    def column_parallel_linear(comm, x, w):
        blocks = [x @ w if comm.Get_rank() == root else np.empty((x.shape[0], w.shape[1]))
                  for root in range(comm.Get_size())]
        for root, block in enumerate(blocks):
            comm.Bcast(block, root=root)
        comm.Allgather(np.zeros(0), np.zeros(0))
        return np.hstack(blocks)
    """),
    (11, ["line 8: comm.Reduce is not one of the calls this exercise allows (Allreduce)"], """
    import numpy as np
    def vocab_parallel_embedding(comm, ids, table):
        local = ids - comm.Get_rank() * table.shape[0]
        mine = (local >= 0) & (local < table.shape[0])
        out, y = np.zeros((ids.size, table.shape[1])), np.empty((ids.size, table.shape[1]))
        out[mine] = table[local[mine]]
        comm.Allreduce(np.zeros(0), np.zeros(0))
        comm.Reduce(out, y, root=0)
        comm.Bcast(y, root=0)
        return y
    """),
    (17, ["line 4: comm.Reduce is not one of the calls this exercise allows (Allreduce)"], """
    import numpy as np
    def column_parallel_backward(comm, x, w, dy):
        dx = np.empty((dy.shape[0], w.shape[0]))
        comm.Reduce(dy @ w.T, dx, root=0)
        comm.Bcast(dx, root=0)
        comm.Allreduce(np.zeros(0), np.zeros(0))
        return dx, x.T @ dy
    """),
    (18, ["line 4: comm.Alltoall is not one of the calls this exercise allows (Reduce_scatter)"], """
    import numpy as np
    def sum_my_block(comm, partial):
        blocks = np.empty_like(partial)
        comm.Alltoall(partial, blocks)
        comm.Reduce_scatter_block(np.zeros(0), np.zeros(0))
        return blocks.reshape(comm.Get_size(), -1).sum(axis=0)
    """),
    (21, ["line 11: comm.Reduce is not one of the calls this exercise allows (Allreduce)"], """
    import numpy as np
    def attention_heads(comm, x, wq, wk, wv, wo, e):
        s, outs = x.shape[0], []
        q, k, v = x @ wq, x @ wk, x @ wv
        for h in range(wq.shape[1] // e):
            cut = slice(h * e, (h + 1) * e)
            scores = np.where(np.tril(np.ones((s, s), bool)), q[:, cut] @ k[:, cut].T / np.sqrt(e), -np.inf)
            outs.append(np.exp(scores - scores.max(axis=1, keepdims=True)) @ v[:, cut] / np.exp(
                scores - scores.max(axis=1, keepdims=True)).sum(axis=1, keepdims=True))
        y = np.empty_like(x)
        comm.Reduce(np.concatenate(outs, axis=1) @ wo, y, root=0)
        comm.Bcast(y, root=0)
        comm.Allreduce(np.zeros(0), np.zeros(0))
        return y
    """),
    (22, ["line 10: comm.Sendrecv is not one of the calls this exercise allows (Allgather, Reduce_scatter)"], """
    import numpy as np
    def sequence_parallel_mlp(comm, x, w1, w2):
        r, n = comm.Get_rank(), comm.Get_size()
        whole = np.empty((n,) + x.shape)
        comm.Allgather(x, whole)
        blocks = np.split(np.maximum(whole.reshape(-1, x.shape[1]) @ w1, 0) @ w2, n)
        out, got = blocks[r].copy(), np.empty_like(x)
        for k in range(1, n):
            to, fr = (r + k) % n, (r - k) % n
            comm.Sendrecv(np.ascontiguousarray(blocks[to]), dest=to, recvbuf=got, source=fr)
            out += got
        comm.Reduce_scatter_block(np.zeros(0), np.zeros(0))
        return out
    """),
]


@pytest.mark.parametrize("number, words, source", OTHER_ALGORITHMS, ids=[f"ex{n}" for n, _, _ in OTHER_ALGORITHMS])
def test_another_algorithm_beside_a_dummy_call_of_the_one_asked_for_fails(tmp_path, number, words, source):
    path = tmp_path / "submission.py"
    path.write_text(textwrap.dedent(source).lstrip())
    result = run_case(find_exercise(number), str(path), 3, 0)
    assert result.status in ("forbidden", "bytes"), result
    for word in words:
        assert word in result.reason, result


#: Right solutions in other forms (object calls, MPI.IN_PLACE, nonblocking calls, the v form), each within
#: the budget and the calls its exercise allows.
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
    (3, """
    import numpy as np
    from mpi4py import MPI
    def pi_reduce(comm, intervals):
        r, n = comm.Get_rank(), comm.Get_size()
        t = (np.arange(r, intervals, n) + 0.5) / intervals
        part = np.array([np.sum(4.0 / (1.0 + t * t)) / intervals])
        comm.Ireduce(MPI.IN_PLACE if r == 0 else part, part, op=MPI.SUM, root=0).Wait()
        return float(part[0]) if r == 0 else None
    """),
    (4, """
    import numpy as np
    def matvec(comm, A, x):
        r, n = comm.Get_rank(), comm.Get_size()
        mine = comm.scatter(np.split(A, n) if r == 0 else None, root=0)
        parts = comm.gather(mine @ comm.bcast(x, root=0), root=0)
        return np.concatenate(parts) if r == 0 else None
    """),
    (4, """
    import numpy as np
    def matvec(comm, A, x):
        r, n = comm.Get_rank(), comm.Get_size()
        shape = np.array(A.shape if r == 0 else (0, 0))
        comm.Bcast(shape, root=0)
        m, k = map(int, shape)
        x = x if r == 0 else np.empty(k)
        comm.Ibcast(x, root=0).Wait()
        mine = np.empty((m // n, k))
        comm.Scatterv([A, [m // n * k] * n] if r == 0 else None, mine, root=0)
        y = np.empty(m) if r == 0 else None
        comm.Gatherv(mine @ x, [y, [m // n] * n] if r == 0 else None, root=0)
        return y
    """),
    (4, """
    import numpy as np
    def matvec(comm, A, x):
        r, n = comm.Get_rank(), comm.Get_size()
        (m, k), x = comm.bcast((A.shape, x) if r == 0 else None, root=0)
        mine = np.empty((m // n, k))
        comm.Scatter(A, mine, root=0)
        y = np.empty(m) if r == 0 else None
        comm.Gather(mine @ x, y, root=0)
        return y
    """),
    (12, """
    import numpy as np
    def rows_to_columns(comm, x):
        return np.concatenate(comm.alltoall(np.split(x, comm.Get_size(), axis=1)), axis=0)
    """),
    (12, """
    import numpy as np
    from mpi4py import MPI
    def rows_to_columns(comm, x):
        buf = np.ascontiguousarray(np.stack(np.split(x, comm.Get_size(), axis=1)))
        comm.Ialltoall(MPI.IN_PLACE, buf).Wait()
        return np.concatenate(list(buf), axis=0)
    """),
    (15, """
    import numpy as np
    from mpi4py import MPI
    def layer_norm(comm, x):
        h = x.shape[1] * comm.Get_size()
        s = x.sum(axis=1)
        comm.Iallreduce(MPI.IN_PLACE, s).Wait()
        c = x - (s / h)[:, None]
        return c / np.sqrt(comm.allreduce((c ** 2).sum(axis=1)) / h + 1e-5)[:, None]
    """),
    (16, """
    def last_position(comm, x):
        n = comm.Get_size()
        return comm.bcast(x[-1] if comm.Get_rank() == n - 1 else None, root=n - 1)
    """),
    (20, """
    import numpy as np
    from mpi4py import MPI
    def vocab_parallel_cross_entropy(comm, logits, labels):
        top = np.empty(len(labels))
        comm.Iallreduce(logits.max(axis=1), top, op=MPI.MAX).Wait()
        local = labels - comm.Get_rank() * logits.shape[1]
        mine = (labels != -100) & (local >= 0) & (local < logits.shape[1])
        both = np.stack([np.exp(logits - top[:, None]).sum(axis=1), np.zeros(len(labels))])
        both[1, mine] = logits[np.flatnonzero(mine), local[mine]]
        comm.Allreduce(MPI.IN_PLACE, both)
        return np.where(labels == -100, 0.0, top + np.log(both[0]) - both[1])
    """),
    (10, """
    import numpy as np
    def column_parallel_linear(comm, x, w):
        every = np.empty((comm.Get_size(),) + (x.shape[0], w.shape[1]))
        comm.Iallgather(x @ w, every).Wait()
        return np.concatenate(list(every), axis=1)
    """),
    (11, """
    import numpy as np
    from mpi4py import MPI
    def vocab_parallel_embedding(comm, ids, table):
        local = ids - comm.Get_rank() * table.shape[0]
        mine = (local >= 0) & (local < table.shape[0])
        out = np.zeros((ids.size, table.shape[1]))
        out[mine] = table[local[mine]]
        comm.Iallreduce(MPI.IN_PLACE, out).Wait()
        return out
    """),
    (21, """
    import numpy as np
    def attention_heads(comm, x, wq, wk, wv, wo, e):
        s, outs = x.shape[0], []
        q, k, v = x @ wq, x @ wk, x @ wv
        for h in range(wq.shape[1] // e):
            cut = slice(h * e, (h + 1) * e)
            causal = np.tril(np.ones((s, s), bool))
            scores = np.where(causal, q[:, cut] @ k[:, cut].T / np.sqrt(e), -np.inf)
            weights = np.exp(scores - scores.max(axis=1, keepdims=True))
            outs.append(weights / weights.sum(axis=1, keepdims=True) @ v[:, cut])
        return comm.allreduce(np.concatenate(outs, axis=1) @ wo)
    """),
    (22, """
    import numpy as np
    from mpi4py import MPI
    def sequence_parallel_mlp(comm, x, w1, w2):
        n = comm.Get_size()
        whole = np.empty((n * x.shape[0], x.shape[1]))
        comm.Allgatherv(x, [whole, [x.size] * n])
        partial = np.maximum(whole @ w1, 0) @ w2
        comm.Reduce_scatter(MPI.IN_PLACE, partial, [x.size] * n)
        return partial[:x.shape[0]].copy()
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
