"""Pi by the midpoint rule, each rank summing its share of the intervals, combined by Reduce."""
import numpy as np

TITLE = "Pi by the midpoint rule and Reduce"
FUNCTION = "pi_reduce"
SIGNATURE = "pi_reduce(comm, intervals)"
STATEMENT = """\
pi is the integral of 4 / (1 + t*t) for t from 0 to 1. With h = 1 / intervals, the midpoint rule
sums h * 4 / (1 + t*t) at t = (i + 0.5) * h for i = 0, 1, ..., intervals - 1.

Rank r of n sums the terms i = r, r + n, r + 2n, ... (every rank gets the same `intervals`).
Combine the ranks' partial sums with comm.reduce or comm.Reduce onto rank 0, and return the
estimate of pi (a float) on rank 0 and None on every other rank. comm.Allreduce is not allowed:
only rank 0 needs the sum. Nor is any call but Reduce: the check counts the bytes each rank
sends, and a rank sends its one partial sum, 8 bytes.
"""
FORBIDDEN = ("Allreduce",)
ALLOWED = ("Reduce",)
REQUIRED = ("Reduce",)
HINT = "Reduce onto rank 0: only the root needs the sum"


def _part(intervals, rank, n):
    h = 1.0 / intervals
    t = (np.arange(rank, intervals, n) + 0.5) * h
    return float(np.sum(4.0 / (1.0 + t * t)) * h)


def case(seed, n):
    intervals = (1000, 777)[seed % 2]
    total = sum(_part(intervals, r, n) for r in range(n))
    return {"args": [(intervals,)] * n, "expected": [total] + [None] * (n - 1), "label": f"{intervals} intervals"}


def sends(case, n, rank):
    """A non-root rank's work: the sum of its own terms, with the factors h and 4 or without either (rank 0
    may multiply the total by them), or with 4 / h factored out (the terms 1 / (N*N + (i + 0.5)**2), N the
    intervals); rank 0 summing every interval beside the others' Reduce of zeros passed before."""
    if rank == 0:
        return {}
    intervals = case["args"][0][0]
    part = _part(intervals, rank, n)
    return {f"partial sum of its terms i = {rank}, {rank} + {n}, ...": (part, part * intervals, part / 4,
                                                                      part * intervals / 4, part / intervals,
                                                                      part / intervals / 4)}


def optimal_bytes(case, n):
    """A rank's partial sum, one float64 (a Reduce sends a non-root's send buffer, see
    spmdsim.tools.lab.sent_bytes); nothing on one rank."""
    return 0 if n == 1 else 8


def explain(case, n, rank, got):
    if rank != 0 or not isinstance(got, float):
        return None
    intervals = case["args"][0][0]
    if n > 1 and np.isclose(got, _part(intervals, 0, n)):
        return "it is rank 0's own partial sum: the other ranks' sums were never added in (Reduce)"
    if n > 1 and np.isclose(got, n * case["expected"][0]):
        return f"it is {n} times pi: every rank summed every interval, not its own share"
    return None


def pi_reduce(comm, intervals):
    rank, n = comm.Get_rank(), comm.Get_size()
    h = 1.0 / intervals
    t = (np.arange(rank, intervals, n) + 0.5) * h
    part = float(np.sum(4.0 / (1.0 + t * t)) * h)
    total = comm.reduce(part, root=0)  # op=MPI.SUM, the default
    return total if rank == 0 else None
