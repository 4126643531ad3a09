"""LayerNorm over a hidden dim split across ranks: the row statistics by Allreduce, not by gathering rows."""
import numpy as np

TITLE = "LayerNorm over a split hidden dim, statistics by Allreduce"
FUNCTION = "layer_norm"
SIGNATURE = "layer_norm(comm, x)"
STATEMENT = """\
X has shape (b, h) and its hidden dim is split over the n ranks (h a multiple of n): rank r holds
the columns x = X[:, r*h/n:(r+1)*h/n]. Return this rank's columns of LayerNorm(X) without scale or
shift: (X - mean) / sqrt(var + 1e-5), where mean and var (the biased variance, np.var) are taken
over each whole row of h values.

No rank may gather whole rows: sum what it holds of each row and combine the sums with
comm.Allreduce (one number per row for the mean, one for the variance). The check counts the bytes
each rank sends: more than those two numbers per row fails, and so does any call but Allreduce.
"""
FORBIDDEN = ("Allgather", "Gather", "Alltoall")
ALLOWED = ("Allreduce",)
REQUIRED = ("Allreduce",)
HINT = "combine the rows' partial sums with Allreduce"
EPS = 1e-5


def _norm(x):
    return (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + EPS)


def case(seed, n):
    rng = np.random.default_rng(seed)
    b, per = (3, 4) if seed % 2 == 0 else (2, 5)
    x = rng.standard_normal((b, n * per)) * 2 + 1
    y = _norm(x)
    args = [(x[:, r * per:(r + 1) * per].copy(),) for r in range(n)]
    return {"args": args, "expected": [y[:, r * per:(r + 1) * per].copy() for r in range(n)],
            "label": f"X {b}x{n * per}"}


def optimal_bytes(case, n):
    """Two numbers per row, the sums for the mean and for the variance (an Allreduce sends a rank's send
    buffer once, see spmdsim.tools.lab.sent_bytes); nothing on one rank."""
    x = case["args"][0][0]
    return 0 if n == 1 else 2 * x.shape[0] * x.itemsize


def explain(case, n, rank, got):
    x = case["args"][rank][0]
    if n > 1 and isinstance(got, np.ndarray) and got.shape == x.shape and np.allclose(got, _norm(x)):
        return "it is normalized by this rank's own columns: the mean and variance are over the whole row"
    return None


def layer_norm(comm, x):
    h = x.shape[1] * comm.Get_size()
    total = np.empty(x.shape[0])
    comm.Allreduce(x.sum(axis=1), total)
    centered = x - (total / h)[:, None]
    squares = np.empty(x.shape[0])
    comm.Allreduce((centered ** 2).sum(axis=1), squares)
    return centered / np.sqrt(squares / h + EPS)[:, None]
