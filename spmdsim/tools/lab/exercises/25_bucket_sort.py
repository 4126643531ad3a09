"""Bucket sort by value range: the counts by Alltoall, the values by Alltoallv."""
import numpy as np

TITLE = "Bucket sort: counts by Alltoall, values by Alltoallv"
FUNCTION = "bucket_sort"
SIGNATURE = "bucket_sort(comm, x)"
STATEMENT = """\
Every rank holds a float64 array x of values in [0, 1); the ranks hold different numbers of them.
Value v belongs to bucket int(v * n), and bucket r is rank r's. Return on rank r every value of
bucket r, from all ranks, sorted ascending: the ranks' results one after another are all the
values sorted. A bucket may be empty (return an empty array).

Sort x, so that each bucket's values lie together, and count them (np.bincount with minlength n).
Each rank learns how many values it will receive from each rank by one comm.Alltoall of the
counts, then sends each rank its bucket's values by one comm.Alltoallv([x, counts],
[received, received_counts]) and sorts what arrived. Alltoall and Alltoallv are the only calls
that may move data; the check counts the bytes each rank sends: its n counts and the values of the
other ranks' buckets, no more.
"""
ALLOWED = ("Alltoall",)  # (and its v form, Alltoallv: spmdsim.tools.lab.calls.family)
REQUIRED = ("Alltoall",)
HINT = "exchange the counts by Alltoall, then only each rank's bucket by Alltoallv"


def _bucket(x, n):
    return (x * n).astype(np.int64)


def case(seed, n):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 9, size=n)
    xs = [rng.random(size) for size in sizes]
    if seed % 2:  # skewed: most values in the first buckets, some buckets empty
        xs = [x ** 3 for x in xs]
    everything = np.sort(np.concatenate(xs))
    expected = [everything[_bucket(everything, n) == r] for r in range(n)]
    return {"args": [(x,) for x in xs], "expected": expected, "label": f"{everything.size} values"}


def optimal_bytes(case, n):
    """The busiest rank's counts for the n - 1 others, as int64, and its values of their buckets."""
    if n == 1:
        return 0
    return max(8 * (n - 1) + 8 * int(np.sum(_bucket(x, n) != r)) for r, (x,) in enumerate(case["args"]))


def explain(case, n, rank, got):
    want = case["expected"][rank]
    if n == 1 or not isinstance(got, np.ndarray) or got.ndim != 1:
        return None
    if got.shape == want.shape and np.allclose(np.sort(got), want) and not np.allclose(got, want):
        return "these are the bucket's values, unsorted: sort what arrived"
    stray = got[(got < rank / n) | (got >= (rank + 1) / n)] if np.issubdtype(got.dtype, np.floating) else got[:0]
    if stray.size and not np.isin(stray, want).all():
        return (f"value {stray[0]:.4g} is not of bucket {rank} (int(v * n) is {int(stray[0] * n)}): Alltoallv sends "
                "rank j the next counts[j] values of x in order, so sort x first, each bucket's values together")
    own = np.sort(case["args"][rank][0])
    everything = np.sort(np.concatenate([args[0] for args in case["args"]]))
    for values, said in ((own, "this rank's own values, sorted: the values of bucket r are spread over every "
                               "rank, and each sends rank r its part of it (Alltoallv)"),
                         (own[_bucket(own, n) == rank], "only this rank's own values of bucket r: the other ranks "
                                                        "hold values of it too, which they send by Alltoallv"),
                         (everything, "all the values, sorted: return only bucket r, the values v with "
                                      "int(v * n) == r")):
        if got.shape == values.shape and np.allclose(got, values) and not (want.shape == values.shape
                                                                            and np.allclose(want, values)):
            return said
    return None


def bucket_sort(comm, x):
    n = comm.Get_size()
    x = np.sort(x)
    counts = np.bincount(_bucket(x, n), minlength=n)  # int64
    received_counts = np.empty_like(counts)
    comm.Alltoall(counts, received_counts)
    received = np.empty(int(received_counts.sum()))
    comm.Alltoallv([x, counts], [received, received_counts])
    return np.sort(received)
