"""Allreduce by recursive doubling: log2(n) exchanges of the whole vector with a partner r XOR 2^k."""
import numpy as np

from spmdsim.tools.lab.calls import COLLECTIVES

TITLE = "Allreduce by recursive doubling from Sendrecv"
FUNCTION = "recursive_doubling_allreduce"
SIGNATURE = "recursive_doubling_allreduce(comm, x)"
STATEMENT = """\
Every rank holds a float64 vector x of the same length; the number of ranks n is a power of two.
Return, on every rank, the elementwise sum of all ranks' x, by recursive doubling: at step
k = 0, 1, ..., log2(n) - 1, rank r exchanges its running sum with rank r ^ (1 << k) (comm.Sendrecv)
and adds what it receives. Each rank sends log2(n) vectors: no more bytes than that.
Collectives are not allowed; a Barrier, which moves no data, is.
"""
FORBIDDEN = tuple(sorted(COLLECTIVES))
HINT = "exchange running sums with the partner rank ^ (1 << k) by Sendrecv"
RANKS = (1, 2, 4, 8)


def case(seed, n):
    rng = np.random.default_rng(seed)
    size = (6, 1100)[seed % 2]  # the second is over MPICH's 8 KiB eager limit
    xs = [rng.standard_normal(size) for _ in range(n)]
    return {"args": [(x,) for x in xs], "expected": [np.sum(xs, axis=0)] * n, "label": f"N={size}"}


def partners(rank, n):
    return tuple(rank ^ (1 << k) for k in range(n.bit_length() - 1))


def optimal_bytes(case, n):
    return (n.bit_length() - 1) * case["args"][0][0].nbytes


def explain(case, n, rank, got):
    xs = [args[0] for args in case["args"]]
    partners = xs[rank] + sum(xs[rank ^ (1 << k)] for k in range(n.bit_length() - 1))
    if n > 2 and isinstance(got, np.ndarray) and got.shape == xs[rank].shape and np.allclose(got, partners):
        return ("it is x plus each partner's own x: at each step send the running sum (x and all that has "
                "been added to it), not x")
    return None


def recursive_doubling_allreduce(comm, x):
    rank, n = comm.Get_rank(), comm.Get_size()
    total = x.astype(np.float64)
    mask = 1
    while mask < n:
        other = np.empty_like(total)
        comm.Sendrecv(total, dest=rank ^ mask, recvbuf=other, source=rank ^ mask)
        total = total + other
        mask <<= 1
    return total
