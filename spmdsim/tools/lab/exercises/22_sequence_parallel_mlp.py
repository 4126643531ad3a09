"""A sequence-parallel MLP (Megatron's sequence parallelism): Allgather in, Reduce_scatter out."""
import numpy as np

TITLE = "Sequence-parallel MLP: Allgather in, Reduce_scatter out"
FUNCTION = "sequence_parallel_mlp"
SIGNATURE = "sequence_parallel_mlp(comm, x, w1, w2)"
STATEMENT = """\
Y = relu(X @ W1) @ W2 with X of shape (s, d), W1 (d, f), W2 (f, d), over n ranks in Megatron's
sequence parallelism: rank r holds the rows x = X[r*s/n:(r+1)*s/n] of the sequence, the columns
w1 = W1[:, r*f/n:(r+1)*f/n] and the rows w2 = W2[r*f/n:(r+1)*f/n] (s and f multiples of n).

Gather the whole sequence (comm.Allgather), apply the column-parallel first layer and relu, the
row-parallel second layer (a partial sum of Y), and return rank r's rows of Y,
Y[r*s/n:(r+1)*s/n], by one comm.Reduce_scatter_block: the same bytes as tensor parallelism's
Allreduce, with 1/n of the activations kept per rank. Allreduce is not allowed. The check counts
the bytes each rank sends: more than its rows x and n-1 blocks of the partial output fails (no rank
gathers the weights), and so does any call but Allgather and Reduce_scatter (Sendrecvs, say).
"""
FORBIDDEN = ("Allreduce",)
REQUIRED = ("Allgather", "Reduce_scatter")
ALLOWED = ("Allgather", "Reduce_scatter")
HINT = "sum and split the partial output in one Reduce_scatter"


def case(seed, n):
    rng = np.random.default_rng(seed)
    # f/n outnumbers the rows a rank holds, as in a transformer's MLP: gathering w1 and w2 costs more bytes
    rows, d, per = (2, 3, 8) if seed % 2 == 0 else (1, 4, 4)
    x = rng.standard_normal((n * rows, d))
    w1, w2 = rng.standard_normal((d, n * per)), rng.standard_normal((n * per, d))
    y = np.maximum(x @ w1, 0) @ w2
    args = [(x[r * rows:(r + 1) * rows].copy(), w1[:, r * per:(r + 1) * per].copy(), w2[r * per:(r + 1) * per].copy())
            for r in range(n)]
    return {"args": args, "expected": [y[r * rows:(r + 1) * rows] for r in range(n)],
            "label": f"X {n * rows}x{d}, f={n * per}"}


def optimal_bytes(case, n):
    """Its rows x to the Allgather, and n-1 blocks of rows of the partial output to the Reduce_scatter."""
    x = case["args"][0][0]
    return n * x.nbytes if n > 1 else 0


def explain(case, n, rank, got):
    if not isinstance(got, np.ndarray):
        return None
    x = np.concatenate([a[0] for a in case["args"]])
    rows = case["args"][rank][0].shape[0]
    _, w1, w2 = case["args"][rank]
    own = np.maximum(x @ w1, 0) @ w2
    partial = own[rank * rows:(rank + 1) * rows]  # (the answer itself where relu zeroed the other ranks' part)
    if n > 1 and got.shape == partial.shape and np.allclose(got, partial) and \
            not np.allclose(partial, case["expected"][rank]):
        return "it is this rank's partial rows: the ranks' partial outputs must be summed (Reduce_scatter)"
    if n > 1 and got.shape == (x.shape[0], x.shape[1]):
        return "it is the whole sequence: return only this rank's rows (Reduce_scatter splits as it sums)"
    return None


def sequence_parallel_mlp(comm, x, w1, w2):
    n = comm.Get_size()
    whole = np.empty((n,) + x.shape)
    comm.Allgather(x, whole)
    partial = np.maximum(whole.reshape(-1, x.shape[1]) @ w1, 0) @ w2
    out = np.empty_like(x)
    comm.Reduce_scatter_block(partial, out)  # op=MPI.SUM, the default; rank r gets rows block r
    return out
