"""Vocab-parallel Embedding (Megatron's VocabParallelEmbedding): each rank looks up its rows, Allreduce."""
import numpy as np

TITLE = "Vocab-parallel Embedding: masked lookups summed by Allreduce"
FUNCTION = "vocab_parallel_embedding"
SIGNATURE = "vocab_parallel_embedding(comm, ids, table)"
STATEMENT = """\
An embedding table E of shape (V, d) is split by rows over the n ranks: rank r holds
table = E[r*V/n:(r+1)*V/n] (V is a multiple of n). Every rank gets the same token ids, an int64
array of shape (t,) with values in [0, V).

Return E[ids] (shape (t, d)) on every rank: each rank looks up the ids that fall in its own range
of rows (shifted to its local row numbers), writes zeros for the others, and the ranks' partial
results are summed with comm.Allreduce (Megatron's VocabParallelEmbedding).
The check counts the bytes each rank sends: more than one (t, d) block fails (no rank gathers the
table, whose rows outnumber the ids), and so does any call but Allreduce (Reduce then Bcast, say).
"""
REQUIRED = ("Allreduce",)
ALLOWED = ("Allreduce",)
HINT = "sum the ranks' masked lookups (Allreduce)"


def case(seed, n):
    rng = np.random.default_rng(seed)
    # each rank's rows outnumber the ids, as a vocabulary's do a batch's: gathering the table costs more bytes
    per, d, t = (12, 4, 7) if seed % 2 == 0 else (16, 3, 9)
    table = rng.standard_normal((n * per, d))
    ids = rng.integers(0, n * per, size=t)
    ids[:3] = [0, n * per - 1, per % (n * per)]  # the table's first and last rows, rank 1's first
    args = [(ids.copy(), table[r * per:(r + 1) * per].copy()) for r in range(n)]
    return {"args": args, "expected": [table[ids]] * n, "label": f"V={n * per}, d={d}, t={t}"}


def optimal_bytes(case, n):
    """One (t, d) block of partial lookups (an Allreduce sends a rank's send buffer once); nothing on one rank."""
    ids, table = case["args"][0]
    return 0 if n == 1 else ids.size * table.shape[1] * table.itemsize


def explain(case, n, rank, got):
    ids, table = case["args"][rank]
    start = rank * table.shape[0]
    mine = (ids >= start) & (ids < start + table.shape[0])
    own = np.zeros(case["expected"][rank].shape)
    own[mine] = table[ids[mine] - start]
    if n > 1 and isinstance(got, np.ndarray) and got.shape == own.shape and np.allclose(got, own) and \
            not np.allclose(own, case["expected"][rank]):  # (not where every id is this rank's)
        return "it holds this rank's own rows only: sum the ranks' lookups (Allreduce)"
    return None


def vocab_parallel_embedding(comm, ids, table):
    rank = comm.Get_rank()
    rows = table.shape[0]
    start = rank * rows
    mine = (ids >= start) & (ids < start + rows)
    partial = np.zeros((ids.size, table.shape[1]))
    partial[mine] = table[ids[mine] - start]
    out = np.empty_like(partial)
    comm.Allreduce(partial, out)  # op=MPI.SUM, the default
    return out
