"""Stream compaction: each kept value's global position, from an offset by Exscan."""
import numpy as np

TITLE = "Compaction: global positions of kept values by Exscan"
FUNCTION = "kept_positions"
SIGNATURE = "kept_positions(comm, x)"
STATEMENT = """\
Every rank holds a float64 array x; the ranks hold different numbers of values. Keep the values
above 0. Joined in rank order (rank 0's kept values, then rank 1's, ...), the kept values of all
ranks form one array. Return on rank r the int64 positions its kept values have in that array, in
the order they lie in x: offset, offset + 1, ..., where offset is the number of values kept by the
ranks before r (an empty array where rank r keeps none).

The offset is an exclusive prefix sum of the ranks' counts: one comm.Exscan with op MPI.SUM. MPI
leaves rank 0's result undefined (the buffer form leaves it as it was, the object form
comm.exscan returns None): rank 0's offset is 0. Exscan (or an inclusive Scan minus the rank's own
count) is the only call that may move data.
"""
ALLOWED = ("Exscan", "Scan")
REQUIRED = ("Exscan|Scan",)
HINT = "one Exscan of the counts gives each rank the number of values kept before it"


def case(seed, n):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(size) for size in rng.integers(0 if seed % 2 else 1, 7, size=n)]
    counts = [int(np.sum(x > 0)) for x in xs]
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    expected = [np.arange(offset, offset + count, dtype=np.int64) for offset, count in zip(offsets, counts)]
    return {"args": [(x,) for x in xs], "expected": expected, "label": f"{sum(counts)} of {sum(map(len, xs))} kept"}


def explain(case, n, rank, got):
    want = case["expected"][rank]
    if n == 1 or not isinstance(got, np.ndarray) or got.shape != want.shape or not want.size:
        return None
    shift = int(got[0]) - int(want[0])
    if np.array_equal(got - shift, want) and shift:
        if shift == want.size:
            return ("the offset counts this rank's own kept values too: Scan is inclusive; take Exscan, or "
                    "subtract the rank's own count")
        if rank == 0:
            return "rank 0's offset is not 0: MPI leaves rank 0's Exscan result undefined, so set it to 0"
        if int(got[0]) == 0:
            return "every rank's positions start at 0: add the offset, the count kept by the ranks before it"
    return None


def kept_positions(comm, x):
    from mpi4py import MPI  # (here: `spmdsim lab list` loads every exercise, and needs no MPI)

    count = np.array([np.sum(x > 0)], dtype=np.int64)
    offset = np.zeros(1, dtype=np.int64)  # rank 0's stays 0: Exscan leaves it as it was
    comm.Exscan(count, offset, op=MPI.SUM)
    return np.arange(offset[0], offset[0] + count[0], dtype=np.int64)
