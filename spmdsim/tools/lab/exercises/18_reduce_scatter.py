"""Partial sums resolved to a split: P -> S(0) by one Reduce_scatter."""
import numpy as np

TITLE = "Partial sums to a split, P -> S(0), by Reduce_scatter"
FUNCTION = "sum_my_block"
SIGNATURE = "sum_my_block(comm, partial)"
STATEMENT = """\
Every rank holds a float64 vector `partial` of length N (a multiple of n): the global vector is
the sum of all ranks' partials (a pending sum, P). Return rank r's block of that sum (S(0)):
sum(partials)[r*N/n:(r+1)*N/n].

One comm.Reduce_scatter_block (or comm.Reduce_scatter) does it, moving (n-1)/n of the vector
per rank. An Allreduce also sums, but moves twice that and then throws n-1 blocks away: it is
not allowed here. The check counts the bytes each rank sends: more than n-1 blocks of its partial
fails, and so does any call but Reduce_scatter (an Alltoall of the blocks, or Sendrecvs, say).
"""
FORBIDDEN = ("Allreduce", "Reduce")
REQUIRED = ("Reduce_scatter",)
ALLOWED = ("Reduce_scatter",)
HINT = "Reduce_scatter sums and splits in one call, at half an Allreduce's bytes"


def case(seed, n):
    rng = np.random.default_rng(seed)
    per = (2, 3)[seed % 2]
    partials = [rng.standard_normal(n * per) for _ in range(n)]
    total = np.sum(partials, axis=0)
    return {"args": [(p,) for p in partials], "expected": [total[r * per:(r + 1) * per] for r in range(n)],
            "label": f"N={n * per}"}


def optimal_bytes(case, n):
    """A rank's blocks of its partial for the other ranks: n-1 of its n blocks."""
    partial = case["args"][0][0]
    return (n - 1) * partial.nbytes // n


def explain(case, n, rank, got):
    if not isinstance(got, np.ndarray):
        return None
    per = case["expected"][rank].size
    total = np.sum([a[0] for a in case["args"]], axis=0)
    if n > 1 and got.shape == (per,):
        if np.allclose(got, case["args"][rank][0][rank * per:(rank + 1) * per]):
            return "it is this rank's own partial block: the ranks' partials were never summed"
        for other in range(n):
            if other != rank and np.allclose(got, total[other * per:(other + 1) * per]):
                return f"it is rank {other}'s block of the sum: rank r keeps block r"
    if n > 1 and got.shape == total.shape and np.allclose(got, total):
        return "it is the whole sum: keep only this rank's block"
    return None


def sum_my_block(comm, partial):
    n = comm.Get_size()
    out = np.empty(partial.size // n)
    comm.Reduce_scatter_block(partial, out)  # op=MPI.SUM, the default
    return out
