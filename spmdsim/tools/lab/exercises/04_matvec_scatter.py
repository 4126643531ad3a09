"""Matrix-vector product: rows scattered from rank 0, the vector broadcast, the results gathered."""
import numpy as np

from spmdsim.tools.lab.calls import POINT_TO_POINT

TITLE = "Matrix-vector product with Scatter, Bcast and Gather"
FUNCTION = "matvec"
SIGNATURE = "matvec(comm, A, x)"
STATEMENT = """\
Rank 0 holds a float64 matrix A of shape (m, k) and a vector x of length k; every other rank gets
A = None and x = None. m is a multiple of the number of ranks n.

Compute y = A @ x in parallel: scatter the rows of A from rank 0 (comm.Scatter, m/n rows each),
broadcast x (comm.Bcast or comm.bcast), multiply each rank's rows by x, and gather the pieces of y
onto rank 0 (comm.Gather). Return y on rank 0 and None on every other rank.
Point-to-point calls (Send, Recv) are not allowed. The check counts the bytes each rank sends:
rank 0 sends the other ranks their rows, x and the shape (m, k); broadcasting all of A fails.
"""
FORBIDDEN = tuple(sorted(POINT_TO_POINT))
REQUIRED = ("Scatter", "Gather")
HINT = "use Scatter, Bcast and Gather"


def case(seed, n):
    rng = np.random.default_rng(seed)
    # a rank's rows outnumber what else rank 0 sends (x, the shape): broadcasting all of A costs more bytes
    rows, k = (12, 16)[seed % 2], (5, 4)[seed % 2]
    a, x = rng.standard_normal((n * rows, k)), rng.standard_normal(k)
    args = [(a, x)] + [(None, None)] * (n - 1)
    return {"args": args, "expected": [a @ x] + [None] * (n - 1), "label": f"A {n * rows}x{k}"}


#: What rank 0 may send besides the rows and x: m and k (16 B as two integers), or in a pickled object with x
#: (comm.bcast((A.shape, x)): 135 B more than x).
SHAPE_BYTES = 256


def optimal_bytes(case, n):
    """Rank 0's: the other ranks' rows of A (a Scatter sends the root's blocks for the other ranks, see
    spmdsim.tools.lab.sent_bytes), x, and m and k, which the others need for their buffers; nothing on one
    rank."""
    a, x = case["args"][0]
    return 0 if n == 1 else (n - 1) * a.nbytes // n + x.nbytes + SHAPE_BYTES


def sends(case, n, rank):
    """A non-root rank's work: its rows of A times x, what it gathers onto rank 0 (rank 0 computing A @ x
    beside a Scatter and a Gather of other values passed before)."""
    if rank == 0:
        return {}
    a, x = case["args"][0]
    rows = a.shape[0] // n
    return {f"rows {rank * rows}..{(rank + 1) * rows - 1} of A times x": a[rank * rows:(rank + 1) * rows] @ x}


def matvec(comm, A, x):
    rank, n = comm.Get_rank(), comm.Get_size()
    shape = comm.bcast(None if A is None else A.shape, root=0)
    m, k = shape
    mine = np.empty((m // n, k))
    comm.Scatter(A, mine, root=0)
    x = comm.bcast(x, root=0)
    y = np.empty(m) if rank == 0 else None
    comm.Gather(mine @ x, y, root=0)
    return y
