"""Ring pass: every rank sends its array to the next rank around the ring."""
import numpy as np

from spmdsim.tools.lab.calls import COLLECTIVES

TITLE = "Ring pass: send to the right, receive from the left"
FUNCTION = "ring_pass"
SIGNATURE = "ring_pass(comm, x)"
STATEMENT = """\
Every rank r holds a float64 array x. Send it to rank (r + 1) % n and return the array received
from rank (r - 1) % n, where n is the number of ranks (on one rank, a rank is its own neighbour).

Every rank sends at the same time: a Send larger than the MPI library's buffer waits for its Recv,
so if every rank sends first, every rank waits. Use comm.Sendrecv, or order the calls so that
it cannot happen. Collectives are not allowed (a Barrier, which moves no data, is).
"""
FORBIDDEN = tuple(sorted(COLLECTIVES))
HINT = "pass the arrays around the ring with Sendrecv (or Send/Recv)"


def case(seed, n):
    rng = np.random.default_rng(seed)
    size = (4, 1500)[seed % 2]  # 12 KB: over MPICH's 8 KiB eager limit, a Send waits for its Recv
    xs = [rng.standard_normal(size) for _ in range(n)]
    return {"args": [(x,) for x in xs], "expected": [xs[(r - 1) % n] for r in range(n)],
            "label": f"{size} values"}


def partners(rank, n):
    return ((rank + 1) % n,)


def optimal_bytes(case, n):
    return 0 if n == 1 else case["args"][0][0].nbytes


def explain(case, n, rank, got):
    right = case["args"][(rank + 1) % n][0]
    if n > 2 and isinstance(got, np.ndarray) and got.shape == right.shape and np.allclose(got, right):
        return f"it is rank {(rank + 1) % n}'s x, the right neighbour's: the ring turns the wrong way"
    return None


def ring_pass(comm, x):
    rank, n = comm.Get_rank(), comm.Get_size()
    got = np.empty_like(x)
    comm.Sendrecv(x, dest=(rank + 1) % n, recvbuf=got, source=(rank - 1) % n)
    return got
