"""Causal multi-head attention with the heads split over the ranks (Megatron's tensor-parallel attention)."""
import numpy as np

TITLE = "Causal attention with the heads split, output by Allreduce"
FUNCTION = "attention_heads"
SIGNATURE = "attention_heads(comm, x, wq, wk, wv, wo, e)"
STATEMENT = """\
Self-attention of x (shape (s, d), the same on every rank) with H heads of size e (given), split
over the n ranks (H a multiple of n): rank r holds heads r*H/n ... (r+1)*H/n - 1, that is the
columns of Wq, Wk, Wv (each (d, H*e)) for its heads, wq, wk, wv of shape (d, H/n * e), and the
matching rows of the output projection Wo (H*e, d), wo of shape (H/n * e, d).

For each of its heads h (columns h*e:(h+1)*e of its q = x @ wq, k, v): scores q_h @ k_h.T / sqrt(e),
causal (position i attends to positions j <= i only: the others get -inf before the softmax),
softmax over the last axis, times v_h. Concatenate its heads' outputs (s, H/n * e), multiply by wo:
a partial output. Return the whole output (s, d), the sum of the ranks' partial outputs, on every
rank. The check counts the bytes each rank sends: more than one (s, d) block fails (no rank gathers
the weights), and so does any call but Allreduce (Reduce then Bcast, say).
"""
REQUIRED = ("Allreduce",)
ALLOWED = ("Allreduce",)
FORBIDDEN = ("Allgather", "Gather", "Alltoall")
HINT = "each rank's heads give a partial output: sum them with Allreduce"


def _heads(x, wq, wk, wv, e, causal=True, scale=True):
    s = x.shape[0]
    q, k, v = x @ wq, x @ wk, x @ wv
    outs = []
    for h in range(wq.shape[1] // e):
        cut = slice(h * e, (h + 1) * e)
        scores = q[:, cut] @ k[:, cut].T / (np.sqrt(e) if scale else 1.0)
        if causal:
            scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
        scores = np.exp(scores - scores.max(axis=1, keepdims=True))
        outs.append(scores / scores.sum(axis=1, keepdims=True) @ v[:, cut])
    return np.concatenate(outs, axis=1)


def case(seed, n):
    rng = np.random.default_rng(seed)
    s, d, e, per = (4, 6, 2, 1) if seed % 2 == 0 else (5, 4, 3, 2)
    heads = n * per
    x = rng.standard_normal((s, d))
    wq, wk, wv = (rng.standard_normal((d, heads * e)) / np.sqrt(d) for _ in range(3))
    wo = rng.standard_normal((heads * e, d)) / np.sqrt(heads * e)
    y = _heads(x, wq, wk, wv, e) @ wo
    args = []
    for r in range(n):
        cols = slice(r * per * e, (r + 1) * per * e)
        args.append((x.copy(), wq[:, cols].copy(), wk[:, cols].copy(), wv[:, cols].copy(), wo[cols].copy(), e))
    return {"args": args, "expected": [y] * n, "label": f"s={s}, d={d}, H={heads}, e={e}"}


def optimal_bytes(case, n):
    """One (s, d) partial output (an Allreduce sends a rank's send buffer once); nothing on one rank."""
    x = case["args"][0][0]
    return 0 if n == 1 else x.nbytes


def explain(case, n, rank, got):
    x, wq, wk, wv, wo, e = case["args"][rank]
    if not isinstance(got, np.ndarray) or got.shape != case["expected"][rank].shape:
        return None
    if got.dtype.kind == "f" and np.isnan(got[0]).all() and np.isfinite(got[1:]).all():
        return ("position 0 is nan: it attends to itself alone (j <= i, the diagonal included); masking j >= i "
                "leaves it nothing to attend to")
    if n > 1 and np.allclose(got, _heads(x, wq, wk, wv, e) @ wo):
        return "it is this rank's partial output, its own heads' share: sum the ranks' outputs (Allreduce)"
    total = sum(_heads(a[0], a[1], a[2], a[3], e, causal=False) @ a[4] for a in case["args"])
    if np.allclose(got, total):
        return "position i attended to later positions: mask j > i to -inf before the softmax (causal)"
    total = sum(_heads(a[0], a[1], a[2], a[3], e, scale=False) @ a[4] for a in case["args"])
    if np.allclose(got, total):
        return "the scores were not divided by sqrt(e), the head size"
    return None


def attention_heads(comm, x, wq, wk, wv, wo, e):
    s = x.shape[0]
    q, k, v = x @ wq, x @ wk, x @ wv
    later = ~np.tril(np.ones((s, s), dtype=bool))  # position j > i: masked
    outs = []
    for h in range(wq.shape[1] // e):
        cut = slice(h * e, (h + 1) * e)
        scores = q[:, cut] @ k[:, cut].T / np.sqrt(e)
        scores[later] = -np.inf
        weights = np.exp(scores - scores.max(axis=1, keepdims=True))
        outs.append(weights / weights.sum(axis=1, keepdims=True) @ v[:, cut])
    partial = np.concatenate(outs, axis=1) @ wo
    y = np.empty_like(partial)
    comm.Allreduce(partial, y)  # op=MPI.SUM, the default
    return y
