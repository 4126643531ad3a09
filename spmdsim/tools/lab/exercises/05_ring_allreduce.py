"""Allreduce by ring from Send/Recv: reduce-scatter then allgather around the ring."""
import numpy as np

from spmdsim.tools.lab.calls import COLLECTIVES

TITLE = "Allreduce by ring from Send/Recv"
FUNCTION = "ring_allreduce"
SIGNATURE = "ring_allreduce(comm, x)"
STATEMENT = """\
Every rank holds a float64 vector x of the same length N. Return, on every rank, the elementwise sum
of all ranks' x, computed by the ring algorithm from point-to-point calls (Send/Recv, Sendrecv):

1. cut x into n chunks with np.array_split (N need not be a multiple of the number of ranks n);
2. reduce-scatter: n-1 steps; at step s rank r sends chunk (r - s) % n to rank r+1 and adds the
   chunk (r - s - 1) % n it receives from rank r-1 into its own copy;
3. allgather: n-1 more steps passing the finished chunks around the ring.

Each rank then sends 2(n-1) chunks, 2(n-1)/n of the vector: no more bytes than that.
Collectives (comm.Allreduce, comm.Reduce, ...) are not allowed; a Barrier, which moves no data, is.
"""
FORBIDDEN = tuple(sorted(COLLECTIVES))
HINT = "implement it with Send/Recv (or Sendrecv) around the ring"
RANKS = (1, 2, 3, 4, 8)
SEEDS = (0, 1)


def case(seed, n):
    rng = np.random.default_rng(seed)
    # divisible by 1, 2, 4, 8 but not 3; the second cuts into chunks over MPICH's 8 KiB eager limit at every
    # rank count (8,320 float64 over 8 ranks: 1,040 each, 8,320 B), where a Send waits for its Recv under
    # `check --mpiexec` too (on simulated ranks the grader buffers no standard Send at any size)
    size = (16, 8320)[seed % 2]
    xs = [rng.standard_normal(size) for _ in range(n)]
    total = np.sum(xs, axis=0)
    return {"args": [(x,) for x in xs], "expected": [total] * n, "label": f"N={size}"}


def partners(rank, n):  # the ring's neighbours (either way round)
    return ((rank + 1) % n, (rank - 1) % n)


def optimal_bytes(case, n):
    size = case["args"][0][0].size
    chunks = [len(c) for c in np.array_split(np.empty(size), n)]
    return 2 * (n - 1) * max(chunks) * 8


def explain(case, n, rank, got):
    size = case["args"][rank][0].size
    if isinstance(got, np.ndarray) and got.ndim == 1 and size % n and got.size == size - size % n:
        left = "the 1 value left over was" if size % n == 1 else f"the {size % n} values left over were"
        return (f"{size} values do not cut into {n} equal chunks, and {left} dropped: cut x with "
                "np.array_split, which gives the values left over to the first chunks, one each")
    return None


def ring_allreduce(comm, x):
    n, r = comm.Get_size(), comm.Get_rank()
    chunks = [c.copy() for c in np.array_split(x.astype(np.float64), n)]
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        send, recv = (r - step) % n, (r - step - 1) % n
        buf = np.empty_like(chunks[recv])
        comm.Sendrecv(chunks[send], dest=right, recvbuf=buf, source=left)
        chunks[recv] += buf
    for step in range(n - 1):
        send, recv = (r + 1 - step) % n, (r - step) % n
        buf = np.empty_like(chunks[recv])
        comm.Sendrecv(chunks[send], dest=right, recvbuf=buf, source=left)
        chunks[recv] = buf
    return np.concatenate(chunks)
