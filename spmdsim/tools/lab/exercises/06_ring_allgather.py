"""Allgather by a ring (or by Bruck's algorithm) from point-to-point calls."""
import numpy as np

from spmdsim.tools.lab.calls import COLLECTIVES

TITLE = "Allgather by ring or Bruck from Send/Recv"
FUNCTION = "ring_allgather"
SIGNATURE = "ring_allgather(comm, block)"
STATEMENT = """\
Every rank r holds a float64 block of the same length k. Return, on every rank, all the blocks
in rank order: np.concatenate([block of rank 0, block of rank 1, ...]).

Use a ring: n-1 steps, each rank sending to rank r+1 the block it received at the step before
(its own at the first) and receiving from rank r-1; or Bruck's algorithm (ceil(log2 n) steps).
Either way a rank sends (n-1) blocks' bytes in all. Collectives are not allowed (a Barrier is).
"""
FORBIDDEN = tuple(sorted(COLLECTIVES))
HINT = "pass the blocks around the ring with Sendrecv"


def case(seed, n):
    rng = np.random.default_rng(seed)
    k = (3, 1100)[seed % 2]
    blocks = [rng.standard_normal(k) for _ in range(n)]
    return {"args": [(b,) for b in blocks], "expected": [np.concatenate(blocks)] * n, "label": f"k={k}"}


def partners(rank, n):  # the ring's neighbours, or Bruck's rank -+ 2^k (either way round)
    return {(rank + sign * (1 << k)) % n for sign in (1, -1) for k in range(max(n - 1, 1).bit_length())}


def optimal_bytes(case, n):
    return (n - 1) * case["args"][0][0].nbytes


def explain(case, n, rank, got):
    blocks = [args[0] for args in case["args"]]
    if n == 1 or not isinstance(got, np.ndarray) or got.shape != (n * blocks[0].size,):
        return None
    if np.allclose(got, np.concatenate([blocks[(rank - i) % n] for i in range(n)])):
        return ("the blocks are in the order they arrived (this rank's, then rank r-1's, r-2's, ...): put "
                "rank j's block at [j*k:(j+1)*k]")
    if np.allclose(got, np.concatenate([blocks[(rank + i) % n] for i in range(n)])):
        return "the blocks start at this rank's own (ranks r, r+1, ...): rotate them so that rank 0's comes first"
    return None


def ring_allgather(comm, block):
    rank, n = comm.Get_rank(), comm.Get_size()
    k = block.size
    out = np.empty(n * k)
    out[rank * k:(rank + 1) * k] = block
    for step in range(n - 1):
        send, recv = (rank - step) % n, (rank - step - 1) % n
        buf = np.empty(k)
        comm.Sendrecv(out[send * k:(send + 1) * k].copy(), dest=(rank + 1) % n, recvbuf=buf,
                      source=(rank - 1) % n)
        out[recv * k:(recv + 1) * k] = buf
    return out
