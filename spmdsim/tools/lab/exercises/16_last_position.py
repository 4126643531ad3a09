"""The last position of a sequence-split activation, on every rank: one broadcast from the last rank."""
import numpy as np

TITLE = "The last position of a sequence-split activation"
FUNCTION = "last_position"
SIGNATURE = "last_position(comm, x)"
STATEMENT = """\
An activation of shape (s, d) is split over the n ranks along its sequence dim (s a multiple of n):
rank r holds x = A[r*s/n:(r+1)*s/n], consecutive positions. A language model predicts from the last
position, A[s - 1] (shape (d,)). Return it on every rank.

Only one rank holds it: broadcast it from there (comm.Bcast or comm.bcast). Send that one row, d
values: the check counts the bytes each rank sends, and a broadcast of the whole block fails.
Gathering the whole sequence is not allowed: it moves n times the rows needed. Nor is any call but
the broadcast (an Allreduce of zeros and the row is another algorithm).
"""
FORBIDDEN = ("Allgather", "Gather", "Alltoall")
ALLOWED = ("Bcast",)
REQUIRED = ("Bcast",)
HINT = "broadcast the one row from the rank that holds it"


def case(seed, n):
    rng = np.random.default_rng(seed)
    per, d = (2, 3) if seed % 2 == 0 else (3, 4)
    a = rng.standard_normal((n * per, d))
    args = [(a[r * per:(r + 1) * per].copy(),) for r in range(n)]
    return {"args": args, "expected": [a[-1].copy()] * n, "label": f"A {n * per}x{d}"}


def optimal_bytes(case, n):
    """The one row the last rank broadcasts (a broadcast sends the root's buffer once, see
    spmdsim.tools.lab.sent_bytes); nothing on one rank."""
    x = case["args"][0][0]
    return 0 if n == 1 else x.shape[1] * x.itemsize


def explain(case, n, rank, got):
    if not isinstance(got, np.ndarray) or got.shape != case["expected"][rank].shape:
        return None
    for other in range(n - 1):
        if np.allclose(got, case["args"][other][0][-1]):
            owner = "this rank's own" if other == rank else f"rank {other}'s"
            return f"it is {owner} last row: only rank n - 1 holds the sequence's last position"
    return None


def last_position(comm, x):
    n, rank = comm.Get_size(), comm.Get_rank()
    row = x[-1].copy() if rank == n - 1 else np.empty(x.shape[1])
    comm.Bcast(row, root=n - 1)
    return row
