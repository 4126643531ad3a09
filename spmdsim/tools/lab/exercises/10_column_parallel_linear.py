"""Column-parallel Linear (Megatron's ColumnParallelLinear with gather_output): local columns, then Allgather."""
import numpy as np

TITLE = "Column-parallel Linear: local columns joined by Allgather"
FUNCTION = "column_parallel_linear"
SIGNATURE = "column_parallel_linear(comm, x, w)"
STATEMENT = """\
Y = X @ W with X of shape (b, k) on every rank and W of shape (k, o) split by columns over the n
ranks (Megatron's ColumnParallelLinear; o a multiple of n): rank r holds w = W[:, r*o/n:(r+1)*o/n].
x @ w is rank r's block of columns of Y.

Return the whole Y (shape (b, o)) on every rank, its column blocks gathered from every rank with
comm.Allgather. Mind the order: Allgather stacks the ranks' blocks along a new first axis.
The check counts the bytes each rank sends: more than its own block of Y fails (no rank gathers W),
and so does any call but Allgather (n broadcasts, say).
"""
REQUIRED = ("Allgather",)
ALLOWED = ("Allgather",)
HINT = "gather each rank's block of Y (x @ w) with Allgather, and nothing else"


def case(seed, n):
    rng = np.random.default_rng(seed)
    b, k, per = (2, 3, 2) if seed % 2 == 0 else (3, 4, 3)
    x, w = rng.standard_normal((b, k)), rng.standard_normal((k, n * per))
    args = [(x.copy(), w[:, r * per:(r + 1) * per].copy()) for r in range(n)]
    return {"args": args, "expected": [x @ w] * n, "label": f"X {b}x{k}, W {k}x{n * per}"}


def optimal_bytes(case, n):
    """This rank's (b, o/n) block of Y (an Allgather sends a rank's send buffer once, see
    spmdsim.tools.lab.sent_bytes); nothing on one rank."""
    x, w = case["args"][0]
    return 0 if n == 1 else x.shape[0] * w.shape[1] * x.itemsize


def explain(case, n, rank, got):
    x, w = case["args"][rank]
    want = case["expected"][rank]
    if not isinstance(got, np.ndarray):
        return None
    if n > 1 and got.shape == (x.shape[0], w.shape[1]) and np.allclose(got, x @ w):
        return "it is this rank's own block of columns: gather every rank's block (Allgather)"
    if n == 1:
        return None
    blocks = np.stack([x @ case["args"][r][1] for r in range(n)])
    if got.shape == want.shape and np.allclose(got, blocks.reshape(want.shape)):
        return ("the blocks are interleaved: the gathered array is (n, b, o/n); move the rank axis next "
                "to the columns before reshaping (np.concatenate(..., axis=1))")
    if got.shape == (n * x.shape[0], w.shape[1]) and np.allclose(got, np.concatenate(blocks, axis=0)):
        return "the blocks are stacked as rows, (n*b, o/n): join them along the columns, np.concatenate(..., axis=1)"
    return None


def column_parallel_linear(comm, x, w):
    n = comm.Get_size()
    y = x @ w
    blocks = np.empty((n,) + y.shape)
    comm.Allgather(y, blocks)
    return np.concatenate(list(blocks), axis=1)
