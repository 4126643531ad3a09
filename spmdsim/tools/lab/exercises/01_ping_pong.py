"""Ping-pong: rank 0 sends an array to rank 1, which sends it back plus one."""
import numpy as np

from spmdsim.tools.lab.calls import COLLECTIVES

TITLE = "Ping-pong between ranks 0 and 1"
FUNCTION = "ping_pong"
SIGNATURE = "ping_pong(comm, x)"
STATEMENT = """\
Every rank holds a float64 array x (each rank's differs). Rank 0 sends its x to rank 1; rank 1
adds 1 to the array it received and sends the sum back to rank 0.

Return, on rank 0, the array rank 1 sent back; on rank 1, the array it received from rank 0
(before adding 1); on every other rank, None (they take no part).

Use comm.Send and comm.Recv (or their lowercase forms); collectives are not allowed (a Barrier is).
"""
FORBIDDEN = tuple(sorted(COLLECTIVES))
HINT = "use Send and Recv between ranks 0 and 1"
RANKS = (2, 3, 4, 8)


def case(seed, n):
    rng = np.random.default_rng(seed)
    size = (5, 1500)[seed % 2]  # 12 KB: over MPICH's 8 KiB eager limit, a Send waits for its Recv
    xs = [rng.standard_normal(size) for _ in range(n)]
    expected = [xs[0] + 1, xs[0]] + [None] * (n - 2)
    return {"args": [(x,) for x in xs], "expected": expected, "label": f"{size} values"}


def partners(rank, n):
    return {0: (1,), 1: (0,)}.get(rank, ())


def sends(case, n, rank):
    """Rank 1's work: the array it received, plus 1 (rank 0 adding the 1 itself passed before)."""
    return {"array it received plus 1": case["args"][0][0] + 1} if rank == 1 else {}


def optimal_bytes(case, n):
    return case["args"][0][0].nbytes


def explain(case, n, rank, got):
    x0 = case["args"][0][0]
    if rank == 0 and isinstance(got, np.ndarray) and got.shape == x0.shape and np.allclose(got, x0):
        return "it is rank 0's own x: rank 1 must add 1 before sending it back"
    if rank == 1 and isinstance(got, np.ndarray) and got.shape == x0.shape and np.allclose(got, x0 + 1):
        return "it is the array plus 1, what rank 1 sends back: rank 1 returns the array as received (add 1 to a copy)"
    return None


def ping_pong(comm, x):
    rank = comm.Get_rank()
    if rank == 0:
        comm.Send(x, dest=1, tag=0)
        reply = np.empty_like(x)
        comm.Recv(reply, source=1, tag=1)
        return reply
    if rank == 1:
        got = np.empty_like(x)
        comm.Recv(got, source=0, tag=0)
        comm.Send(got + 1, dest=0, tag=1)
        return got
    return None
