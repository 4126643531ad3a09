"""Gradient buckets: many sums in one Allreduce (DDP's and Megatron's buckets)."""
import numpy as np

TITLE = "Gradient buckets: every gradient summed by one Allreduce"
FUNCTION = "bucketed_allreduce"
SIGNATURE = "bucketed_allreduce(comm, grads)"
STATEMENT = """\
Every rank holds a list of float64 gradients of different shapes (a weight matrix, a bias, ...),
each a partial sum over the data-parallel ranks. Return the list of their sums over the ranks,
in the same order and shapes, on every rank.

Each Allreduce call has a fixed cost, so make one: flatten the gradients into one buffer (a
bucket), sum it with a single comm.Allreduce, and cut the result back into the gradients' shapes
(PyTorch DDP and Megatron bucket their gradients so). More than one Allreduce fails, and so does
any other communication call, or an Allreduce of more bytes than the gradients hold.
"""
REQUIRED = ("Allreduce",)
ALLOWED = ("Allreduce",)
MOST_CALLS = {"Allreduce": 1}
HINT = "flatten the gradients into one bucket and sum it once"
SHAPES = (((3, 2), (2,), (2, 4), (4,)), ((5,), (2, 3)))


def case(seed, n):
    rng = np.random.default_rng(seed)
    shapes = SHAPES[seed % 2]
    grads = [[rng.standard_normal(shape) for shape in shapes] for _ in range(n)]
    sums = [np.sum([g[k] for g in grads], axis=0) for k in range(len(shapes))]
    return {"args": [(g,) for g in grads], "expected": [tuple(sums)] * n, "label": f"{len(shapes)} gradients"}


def optimal_bytes(case, n):
    """The bucket: every gradient's bytes once (an Allreduce sends a rank's send buffer once); nothing on one
    rank."""
    return 0 if n == 1 else sum(g.nbytes for g in case["args"][0][0])


def explain(case, n, rank, got):
    want = case["expected"][rank]
    if n > 1 and isinstance(got, (list, tuple)) and len(got) == n * len(want):
        return ("comm.allreduce of a Python list adds the ranks' lists, and + joins lists end to end: "
                "sum one NumPy array, the bucket, instead")
    return None


def bucketed_allreduce(comm, grads):
    bucket = np.concatenate([g.ravel() for g in grads])
    total = np.empty_like(bucket)
    comm.Allreduce(bucket, total)  # op=MPI.SUM, the default
    out, at = [], 0
    for g in grads:
        out.append(total[at:at + g.size].reshape(g.shape))
        at += g.size
    return tuple(out)
