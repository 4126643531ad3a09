"""Redistribution S(0) -> S(1): row blocks become column blocks with one Alltoall."""
import numpy as np

TITLE = "Redistribute rows to columns, S(0) -> S(1), by Alltoall"
FUNCTION = "rows_to_columns"
SIGNATURE = "rows_to_columns(comm, x)"
STATEMENT = """\
A float64 matrix A of shape (m, k) is split by rows over the n ranks (S(0)): rank r holds
x = A[r*m/n:(r+1)*m/n, :]. Return rank r's block of columns instead (S(1)): A[:, r*k/n:(r+1)*k/n],
of shape (m, k/n). m and k are multiples of n.

Use one comm.Alltoall: rank r sends to rank j the part of its rows in j's columns, and stacks
what it receives from ranks 0, 1, ... by rows. Gathering the whole matrix (Allgather) sends n
times the bytes needed and is not allowed; the check counts the bytes each rank sends, so send each
rank only its part. No call but Alltoall is allowed (not n Scatters, nor Sendrecvs to every rank).
"""
FORBIDDEN = ("Allgather", "Gather", "Bcast", "Allreduce")
ALLOWED = ("Alltoall",)
REQUIRED = ("Alltoall",)
HINT = "one Alltoall moves only what each rank needs"


def case(seed, n):
    rng = np.random.default_rng(seed)
    rows, cols = (2, 3) if seed % 2 == 0 else (3, 2)
    a = rng.standard_normal((n * rows, n * cols))
    args = [(a[r * rows:(r + 1) * rows].copy(),) for r in range(n)]
    expected = [a[:, r * cols:(r + 1) * cols].copy() for r in range(n)]
    return {"args": args, "expected": expected, "label": f"A {n * rows}x{n * cols}"}


def optimal_bytes(case, n):
    """The part of its rows each rank sends the n - 1 others: (n - 1)/n of them (an Alltoall sends a rank's
    blocks for the other ranks, see spmdsim.tools.lab.sent_bytes)."""
    x = case["args"][0][0]
    return (n - 1) * x.nbytes // n


def explain(case, n, rank, got):
    want = case["expected"][rank]
    if isinstance(got, np.ndarray) and got.shape == want.shape and n > 1:
        a = np.concatenate([args[0] for args in case["args"]])
        cols = want.shape[1]
        for other in range(n):
            if other != rank and np.allclose(got, a[:, other * cols:(other + 1) * cols]):
                return f"it is rank {other}'s block of columns: send rank j the columns j holds"
    return None


def rows_to_columns(comm, x):
    n = comm.Get_size()
    send = np.ascontiguousarray(np.stack(np.split(x, n, axis=1)))
    recv = np.empty_like(send)
    comm.Alltoall(send, recv)
    return np.concatenate(list(recv), axis=0)
