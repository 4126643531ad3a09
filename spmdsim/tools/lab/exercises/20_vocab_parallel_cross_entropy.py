"""Cross-entropy over vocab-parallel logits (Megatron's vocab_parallel_cross_entropy), ignored labels."""
import numpy as np

TITLE = "Cross-entropy over vocab-split logits, with ignored labels"
FUNCTION = "vocab_parallel_cross_entropy"
SIGNATURE = "vocab_parallel_cross_entropy(comm, logits, labels)"
STATEMENT = """\
A language model's logits L of shape (t, V) are split by vocabulary over the n ranks: rank r holds
logits = L[:, r*V/n:(r+1)*V/n] (V a multiple of n). Every rank gets the same labels, an int64
array of shape (t,) with values in [0, V) or -100 (an ignored position: padding).

Return, on every rank, the float64 array of shape (t,) of per-token losses
logsumexp(L[i]) - L[i, labels[i]], and 0.0 where labels[i] == -100, without gathering L:
- the row maxima by comm.Allreduce with op=MPI.MAX (the logits can be large: exp overflows
  without subtracting the maximum);
- the sums of exp(L - max) by an Allreduce (sum);
- the target logit L[i, labels[i]] lives on one rank: the others add 0 (an Allreduce again).
The check counts the bytes each rank sends: more than these three numbers per token fails, and
so does any call but Allreduce (sending the logits to one rank, say).
"""
FORBIDDEN = ("Allgather", "Gather", "Alltoall")
ALLOWED = ("Allreduce",)
REQUIRED = ("Allreduce",)
HINT = "reduce the maxima, the sums and the target logits with Allreduce"
IGNORE = -100


def _losses(whole, labels):
    top = whole.max(axis=1)
    lse = top + np.log(np.exp(whole - top[:, None]).sum(axis=1))
    picked = whole[np.arange(len(labels)), np.where(labels == IGNORE, 0, labels)]
    return np.where(labels == IGNORE, 0.0, lse - picked)


def case(seed, n):
    rng = np.random.default_rng(seed)
    per, t = (3, 5) if seed % 2 == 0 else (2, 6)
    whole = rng.standard_normal((t, n * per)) * 3 + (0.0, 800.0)[seed % 2]  # 800: exp overflows unshifted
    labels = rng.integers(0, n * per, size=t)
    labels[1] = IGNORE
    args = [(whole[:, r * per:(r + 1) * per].copy(), labels.copy()) for r in range(n)]
    return {"args": args, "expected": [_losses(whole, labels)] * n, "label": f"t={t}, V={n * per}"}


def optimal_bytes(case, n):
    """Three numbers per token, its maximum, its sum and its target logit (an Allreduce sends a rank's send
    buffer once, see spmdsim.tools.lab.sent_bytes); nothing on one rank."""
    logits = case["args"][0][0]
    return 0 if n == 1 else 3 * logits.shape[0] * logits.itemsize


def explain(case, n, rank, got):
    if not isinstance(got, np.ndarray) or got.shape != case["expected"][rank].shape:
        return None
    labels = case["args"][rank][1]
    if not np.all(np.isfinite(got)):
        return "a loss is inf or nan: subtract each row's maximum over the whole vocabulary before exp"
    if got[labels == IGNORE].any():
        return "an ignored position (label -100) has a loss: it must be 0"
    whole = np.concatenate([a[0] for a in case["args"]], axis=1)
    logits = case["args"][rank][0]
    local = labels - rank * logits.shape[1]
    mine = (labels != IGNORE) & (local >= 0) & (local < logits.shape[1])
    picked = np.zeros(len(labels))
    picked[mine] = logits[np.flatnonzero(mine), local[mine]]
    lse = _losses(whole, labels) + np.where(labels == IGNORE, 0.0, whole[np.arange(len(labels)),
                                                                         np.maximum(labels, 0)])
    if n > 1 and np.allclose(got, np.where(labels == IGNORE, 0.0, lse - picked)):
        return "a target logit lives on one rank only: the others get it by an Allreduce of the picked logits"
    return _index_or_maximum(case, n, rank, got, lse)


def _index_or_maximum(case, n, rank, got, lse):
    """The explanation of a label taken as a column of every rank's block, or of each rank's own row maxima."""
    labels, per = case["args"][rank][1], case["args"][rank][0].shape[1]
    rows, inside = np.arange(len(labels)), (labels != IGNORE) & (labels < per)
    unshifted = sum(np.where(inside, a[0][rows, np.where(inside, labels, 0)], 0.0) for a in case["args"])
    if n > 1 and np.allclose(got, np.where(labels == IGNORE, 0.0, lse - unshifted)):
        return ("a label is a column of the whole vocabulary: rank r holds columns r*V/n to (r+1)*V/n - 1; "
                "pick only labels in that range, less r*V/n, from its own logits")
    top = case["args"][rank][0].max(axis=1)
    sums = sum(np.exp(a[0] - a[0].max(axis=1)[:, None]).sum(axis=1) for a in case["args"])
    whole = np.concatenate([a[0] for a in case["args"]], axis=1)
    target = whole[rows, np.maximum(labels, 0)]
    if n > 1 and np.allclose(got, np.where(labels == IGNORE, 0.0, top + np.log(sums) - target)):
        return "each rank subtracted its own row maxima: take the maximum over all ranks (Allreduce, op=MPI.MAX)"
    return None


def vocab_parallel_cross_entropy(comm, logits, labels):
    from mpi4py import MPI  # here, not above: the grader loads this file to list it, where no rank runs

    start = comm.Get_rank() * logits.shape[1]
    top = np.empty(len(labels))
    comm.Allreduce(logits.max(axis=1), top, op=MPI.MAX)
    sums = np.empty(len(labels))
    comm.Allreduce(np.exp(logits - top[:, None]).sum(axis=1), sums)
    local = labels - start
    mine = (labels != IGNORE) & (local >= 0) & (local < logits.shape[1])
    picked = np.zeros(len(labels))
    picked[mine] = logits[np.flatnonzero(mine), local[mine]]
    target = np.empty(len(labels))
    comm.Allreduce(picked, target)
    return np.where(labels == IGNORE, 0.0, top + np.log(sums) - target)
