"""A histogram on rank 0 by one-sided Accumulate into its window, between two fences."""
import numpy as np

TITLE = "Histogram by one-sided Accumulate into rank 0's window"
FUNCTION = "histogram"
SIGNATURE = "histogram(comm, x, bins)"
STATEMENT = """\
Every rank holds an int64 array x of values in [0, bins); the ranks hold different numbers of
them. Rank 0 returns the int64 histogram of all ranks' values, of shape (bins,): entry b counts
the values equal to b on every rank. The other ranks return None.

Rank 0 exposes bins int64 counters, zeros, in a window: win = MPI.Win.Create(counts, comm=comm),
where counts is np.zeros(bins, np.int64) on rank 0 and an empty int64 array on the others. Open an
access epoch with win.Fence(), add each rank's own counts (np.bincount of x with minlength bins)
to rank 0's counters by one win.Accumulate([mine, MPI.INT64_T], 0, op=MPI.SUM), close it with
win.Fence(), then free the window. No rank calls Send, Recv or a collective that moves data:
the counts go by Accumulate alone, the only call allowed to move them.
"""
ALLOWED = ("Accumulate",)
REQUIRED = ("Fence", "Accumulate")
HINT = "each rank adds its bincount to rank 0's window by one Accumulate between two fences"


def case(seed, n):
    rng = np.random.default_rng(seed)
    bins = 5 if seed % 2 == 0 else 3
    xs = [rng.integers(0, bins, size=size) for size in rng.integers(0 if seed % 2 else 1, 9, size=n)]
    total = np.bincount(np.concatenate(xs), minlength=bins).astype(np.int64)
    return {"args": [(x, bins) for x in xs], "expected": [total] + [None] * (n - 1),
            "label": f"{sum(map(len, xs))} values in {bins} bins"}


def optimal_bytes(case, n):
    """A rank's counts, once: bins int64 (rank 0's own Accumulate into its own window included)."""
    return 8 * case["args"][0][1]


def explain(case, n, rank, got):
    want = case["expected"][rank]
    if rank != 0 or n == 1 or not isinstance(got, np.ndarray) or got.shape != want.shape:
        return None
    own = np.bincount(case["args"][0][0], minlength=want.size)
    if np.array_equal(got, own):
        return ("these are rank 0's own counts: the other ranks' reach rank 0's window by their Accumulates; "
                "return the window's counters after the second win.Fence()")
    if not got.any():
        return "the counters are still zeros: read them after the second win.Fence(), which completes the Accumulates"
    return None


def histogram(comm, x, bins):
    from mpi4py import MPI  # (here: `spmdsim lab list` loads every exercise, and needs no MPI)

    counts = np.zeros(bins if comm.Get_rank() == 0 else 0, dtype=np.int64)
    win = MPI.Win.Create(counts, comm=comm)
    mine = np.bincount(x, minlength=bins).astype(np.int64)
    win.Fence()
    win.Accumulate([mine, MPI.INT64_T], 0, op=MPI.SUM)
    win.Fence()
    win.Free()
    return counts if comm.Get_rank() == 0 else None
