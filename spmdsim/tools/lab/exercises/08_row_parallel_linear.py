"""Row-parallel Linear (Megatron's RowParallelLinear): each rank multiplies its slice, then Allreduce."""
import numpy as np

TITLE = "Row-parallel Linear: partial products summed by Allreduce"
FUNCTION = "row_parallel_linear"
SIGNATURE = "row_parallel_linear(comm, x, w)"
STATEMENT = """\
Y = X @ W with X of shape (b, k) and W of shape (k, o), the contraction dim k split over the n ranks
(Megatron's RowParallelLinear; k a multiple of n): rank r holds x = X[:, r*k/n:(r+1)*k/n] and the
matching rows of W, w = W[r*k/n:(r+1)*k/n, :].

x @ w is a partial product: Y is the sum of all ranks' partial products. Return Y (shape (b, o))
on every rank. The check counts the bytes each rank sends: more than one (b, o) array fails (no rank
gathers X or W).
"""
HINT = "sum the partial products x @ w over the ranks (Allreduce)"


def case(seed, n):
    rng = np.random.default_rng(seed)
    b, per, o = (2, 3, 4) if seed % 2 == 0 else (3, 2, 5)
    x, w = rng.standard_normal((b, n * per)), rng.standard_normal((n * per, o))
    args = [(x[:, r * per:(r + 1) * per].copy(), w[r * per:(r + 1) * per].copy()) for r in range(n)]
    return {"args": args, "expected": [x @ w] * n, "label": f"X {b}x{n * per}, W {n * per}x{o}"}


def optimal_bytes(case, n):
    """One (b, o) partial product (an Allreduce sends a rank's send buffer once, see
    spmdsim.tools.lab.sent_bytes); nothing on one rank."""
    x, w = case["args"][0]
    return 0 if n == 1 else x.shape[0] * w.shape[1] * x.itemsize


def explain(case, n, rank, got):
    x, w = case["args"][rank]
    if n > 1 and isinstance(got, np.ndarray) and got.shape == (x.shape[0], w.shape[1]) and np.allclose(got, x @ w):
        return "it is this rank's partial product x @ w: sum the partial products over the ranks (Allreduce)"
    return None


def row_parallel_linear(comm, x, w):
    partial = x @ w
    y = np.empty_like(partial)
    comm.Allreduce(partial, y)  # op=MPI.SUM, the default
    return y
