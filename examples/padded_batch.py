"""A padded batch through attention and a tagging loss, the heads split over the ranks, checked against numpy.

Sequences of different lengths share one (batch, T) array, padded at the end.
The keys that are padding are masked out of attention (`mask=`, False for a
pad key: PyTorch's boolean convention), the padded positions are left out of
the loss (`cross_entropy(..., ignore_index=-100)`: the mean is over the real
tokens only), the accuracy is an `argmax` over the classes, and the update
clips the gradients' joint norm (`clip_grad_norm_`). The loss and every
gradient are checked against numpy (gradients by central differences).
Run: python examples/padded_batch.py --ranks 4
(or: timeout -k 5 300 mpiexec -n 4 python examples/padded_batch.py)
"""
import argparse

import numpy as np

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim import Layout, SeededTensor, ops
from spmdsim.nn.optim import clip_grad_norm_
from spmdsim import DTensor, Mesh
from spmdsim.runtime import shared_numeric_grads
from spmdsim.runtime.sim import dry_run_active
from spmdsim.references.tolerances import central_difference_tolerance, sum_rtol

# --help prints this docstring; an argument other than --ranks N and --dry-run is refused (exit 2)
parser = OnceParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--ranks", metavar="N", help="run on N simulated ranks in this process (no mpiexec)")
parser.add_argument("--dry-run", action="store_true", help="with --ranks: shapes only, each rank's bytes and peak")
parser.parse_args()
spmdsim.script(__file__, ranks=4)  # --ranks N: N simulated ranks here (1 process alone: says how to get 4)
mesh = Mesh(Layout((spmdsim.world().size,), ("tp",)), spmdsim.world())  # one axis over every rank
L, p = mesh.layout, mesh.size
B, T, H, Dh, C = 3, 6, p, 4, 5  # batch, padded length, heads (one per rank), head width, classes
D, lengths = H * Dh, [6, 4, 2]  # model width; each sequence's real length
real = np.arange(T)[None, :] < np.array(lengths)[:, None]  # (B, T): True for a real token
tags = np.where(real, np.arange(B * T).reshape(B, T) % C, -100)  # pad positions carry the ignored label
shapes, maps = [(B, T, D), (D, D), (D, D), (D, D), (D, C)], [(None,) * 3, (None, "tp"), (None, "tp"), (None, "tp"),
                                                             ("tp", None)]  # x, wq, wk, wv (columns), wc (rows)
src = [SeededTensor(s, "float64", seed=i, low=-0.5, high=0.5) for i, s in enumerate(shapes)]
params = [DTensor.from_seeded(mesh, L(*m), s).requires_grad_() for m, s in zip(maps, src)]


def tagger(x, wq, wk, wv, wc):  # each rank its heads' q, k, v; the classifier's rows leave a pending sum
    q, k, v = (ops.reshape(ops.einsum("btd,de->bte", x, w), (B, T, H, Dh)) for w in (wq, wk, wv))
    keys = DTensor.from_global(mesh, real, L(None, None))
    h = ops.reshape(ops.attention(q, k, v, mask=keys), (B, T, D))
    logits = ops.resolved(ops.einsum("btd,dc->btc", h, wc))
    return logits, ops.cross_entropy(ops.reshape(logits, (B * T, C)),
                                     DTensor.from_global(mesh, tags.reshape(-1), L(None)))


logits, loss = tagger(*params)
loss.backward()
norm = clip_grad_norm_(params, 0.05)  # the norm before clipping
right = (logits.argmax(-1) == DTensor.from_global(mesh, tags, L(None, None))).gather()


def numpy_tagger(x, wq, wk, wv, wc):
    q, k, v = ((x @ w).reshape(B, T, H, Dh) for w in (wq, wk, wv))
    s = np.where(real[:, None, None, :], np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(Dh), -np.inf)
    a = np.exp(s - s.max(-1, keepdims=True))
    z = np.einsum("bhqk,bkhd->bqhd", a / a.sum(-1, keepdims=True), v).reshape(B, T, D) @ wc
    lp = z - z.max(-1, keepdims=True) - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
    return -np.take_along_axis(lp, np.where(real, tags, 0)[..., None], -1)[..., 0][real].mean()


def magnitudes(x, wq, wk, wv, wc):  # what entered the loss, each carried to it as an error in it would be
    q, k, v = ((x @ w).reshape(B, T, H, Dh) for w in (wq, wk, wv))
    mq, mk, mv = ((np.abs(x) @ np.abs(w)).reshape(B, T, H, Dh) for w in (wq, wk, wv))
    s = np.where(real[:, None, None, :], np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(Dh), -np.inf)
    ms = (np.einsum("bqhd,bkhd->bhqk", mq, np.abs(k)) + np.einsum("bqhd,bkhd->bhqk", np.abs(q), mk)) / np.sqrt(Dh)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    ma = a * (1 + ms + (a * ms).sum(-1, keepdims=True))  # an error in a score moves its weight and every other
    h, mh = (np.einsum("bhqk,bkhd->bqhd", u, w).reshape(B, T, D) for u, w in ((a, v), (ma, np.abs(v))))
    mz = (mh + np.einsum("bhqk,bkhd->bqhd", a, mv).reshape(B, T, D)) @ np.abs(wc)
    z = h @ wc
    e = np.exp(z - z.max(-1, keepdims=True))
    taken = np.take_along_axis(mz, np.where(real, tags, 0)[..., None], -1)[..., 0]
    return float((taken + (e * mz).sum(-1) / e.sum(-1) + np.abs(np.log(e.sum(-1))) + 1)[real].mean())


dry = dry_run_active()  # a dry run has no values to check: its references are not made
arrays = None if dry else [s.full() for s in src]
grads = [None] * len(src) if dry else shared_numeric_grads(mesh, numpy_tagger, *arrays)  # each rank 1/p of them
want = 0.0 if dry else np.sqrt(sum((g * g).sum() for g in grads))
# The loss within its terms' rounding (2 k eps: two computations, k the longest sum); the central differences'
# rounding follows what entered the loss over the step h (spmdsim.references.tolerances.central_difference_tolerance),
# and the norm of their errors bounds the norm's.
longest = max(D, T, C, int(real.sum()))
magnitude = 0.0 if dry else magnitudes(*arrays)
rtol, atol = central_difference_tolerance(magnitude, longest, step=0.5)
count = sum(int(np.prod(shape)) for shape in shapes)
off = atol * np.sqrt(count) + rtol * want  # the norm's error: at most the norm of the elements' errors
verdicts = [dry or abs(loss.item() - numpy_tagger(*arrays)) <= 2 * sum_rtol(longest, "float64") * magnitude,
            dry or abs(norm - want) <= off]  # (a dry run has no values: its norm is nan)
clip = min(1.0, 0.05 / (want + 1e-6))  # the clipped gradients: scaled by it, and by the norm's error relative
moved = off / want if want > 0 else 0.0
verdicts += [t.grad.check(lambda region, g=g: g[region] * clip, rtol=rtol + moved, atol=atol * clip)
             for t, g in zip(params, grads)]
if mesh.rank == 0:
    print(f"{int(real.sum())} real tokens of {B * T}: loss {loss.item():.6f}, gradients' norm {norm:.4f} "
          f"(clipped to 0.05), {int(right[real].sum())} tagged right")
    print(f"loss, norm and {len(params)} clipped gradients vs numpy: {'PASS' if all(verdicts) else 'FAILED'}")
raise SystemExit(0 if all(verdicts) else 1)
