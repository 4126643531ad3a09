"""The backward of a column-parallel Linear: which gradient needs a collective, and which one."""
import numpy as np

TITLE = "Backward of a column-parallel Linear: dx by Allreduce"
FUNCTION = "column_parallel_backward"
SIGNATURE = "column_parallel_backward(comm, x, w, dy)"
STATEMENT = """\
The forward was Megatron's ColumnParallelLinear without gathering: y = x @ w, with x of shape (b, k)
the same on every rank and w = W[:, r*o/n:(r+1)*o/n] rank r's columns of W (k, o; o a multiple of
n), so y is rank r's columns of Y. The backward gets dy, the gradient of the loss with respect to
this rank's columns of Y (shape (b, o/n)).

Return (dx, dw) on every rank: dx, the gradient with respect to x (shape (b, k)), which every rank
needs whole; dw, the gradient with respect to this rank's w (shape (k, o/n)). One of them is a sum
over the ranks (the forward's identity becomes an Allreduce); the other needs no communication.
The check counts the bytes each rank sends: more than one (b, k) block fails (no rank gathers W or
dy), and so does any call but Allreduce (Reduce then Bcast, say).
"""
REQUIRED = ("Allreduce",)
ALLOWED = ("Allreduce",)
HINT = "sum each rank's partial dx = dy @ w.T over the ranks (Allreduce); dw needs no communication"


def case(seed, n):
    rng = np.random.default_rng(seed)
    b, k, per = (2, 3, 2) if seed % 2 == 0 else (3, 2, 3)
    x, w, dy = rng.standard_normal((b, k)), rng.standard_normal((k, n * per)), rng.standard_normal((b, n * per))
    dx = dy @ w.T
    args, expected = [], []
    for r in range(n):
        cut = slice(r * per, (r + 1) * per)
        args.append((x.copy(), w[:, cut].copy(), dy[:, cut].copy()))
        expected.append((dx, x.T @ dy[:, cut]))
    return {"args": args, "expected": expected, "label": f"X {b}x{k}, W {k}x{n * per}"}


def optimal_bytes(case, n):
    """One (b, k) partial dx (an Allreduce sends a rank's send buffer once); nothing on one rank."""
    x = case["args"][0][0]
    return 0 if n == 1 else x.nbytes


def explain(case, n, rank, got):
    x, w, dy = case["args"][rank]
    try:
        dx, dw = (np.asarray(g) for g in got)
    except (TypeError, ValueError):
        return None
    if n > 1 and dx.shape == x.shape and np.allclose(dx, dy @ w.T):
        return "dx is this rank's partial dy @ w.T: every rank's columns add to it (Allreduce)"
    if n > 1 and dw.shape == w.shape and np.allclose(dw, sum(a[0].T @ a[2] for a in case["args"])):
        return "dw was summed over the ranks: each rank's dw belongs to its own columns alone"
    return None


def column_parallel_backward(comm, x, w, dy):
    partial = dy @ w.T
    dx = np.empty_like(partial)
    comm.Allreduce(partial, dx)  # op=MPI.SUM, the default
    return dx, x.T @ dy
