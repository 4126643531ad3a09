"""A Llama-style block with the heads split over tp, forward and gradients checked against numpy.

RMSNorm, grouped-query attention (one key/value head per tp rank, 2 query heads
each) with rotary position embeddings (the head dim cut in halves,
x[..., :Dh // 2], and joined by ops.concatenate: local, the head dim is
whole on every rank), a causal mask, the row-parallel output projection (a pending
sum), then RMSNorm and the SwiGLU MLP silu(h W1) * (h W3) W2 (column -> row
parallel). Every weight's gradient against central differences of the same
numpy program. The block is as wide at any rank count: tp is 8 where the ranks
divide by 8 (else 4, 2 or 1) and the other ranks are dp replicas of it (the same
sequence, so no gradient sum over dp), so each rank holds shards of one size and the
check's work does not grow with the ranks. Run: python examples/llama_block.py --ranks 8
(or: timeout -k 5 300 mpiexec -n 8 python examples/llama_block.py)
"""
import argparse
import math

import numpy as np

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim import Layout, SeededTensor, ops
from spmdsim import DTensor, Mesh, collect_trace
from spmdsim.runtime import shared_numeric_grads
from spmdsim.runtime.sim import dry_run_active, once
from spmdsim.references.tolerances import central_difference_tolerance

# --help prints this docstring; an argument other than --ranks N and --dry-run is refused (exit 2)
parser = OnceParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--ranks", metavar="N", help="run on N simulated ranks in this process (no mpiexec)")
parser.add_argument("--dry-run", action="store_true", help="with --ranks: shapes only, each rank's bytes and peak")
parser.parse_args()
spmdsim.script(__file__, ranks=8)  # --ranks N: N simulated ranks here (1 process alone: says how to get 8)
world = spmdsim.world()
tp = math.gcd(world.size, 8)  # 8 key/value heads at most: the block's width does not grow with the ranks
mesh = Mesh(Layout((world.size // tp, tp), ("dp", "tp")), world)  # dp: replicas of the tp ranks' block
L = mesh.layout
T, KV, G, Dh = 6, tp, 2, 4  # sequence, key/value heads (one per tp rank), query heads per kv head, head width
D, F = KV * G * Dh, 8 * tp  # model width, SwiGLU width
shapes = [(T, D), (D,), (D, D), (D, KV * Dh), (D, KV * Dh), (D, D), (D,), (D, F), (D, F), (F, D)]
maps = [(None, None), (None,), (None, "tp"), (None, "tp"), (None, "tp"), ("tp", None), (None,),
        (None, "tp"), (None, "tp"), ("tp", None)]  # x, g1, wq, wk, wv (columns), wo (rows), g2, w1, w3, w2
bound = [1.0 if len(s) == 1 or i == 0 else s[0] ** -0.5 for i, s in enumerate(shapes)]  # weights: 1/sqrt(fan-in)
src = [SeededTensor(s, "float64", seed=i, low=-b, high=b) for i, (s, b) in enumerate(zip(shapes, bound))]
params = [DTensor.from_seeded(mesh, L(*m), s).requires_grad_() for m, s in zip(maps, src)]
angle = np.arange(T)[:, None] * 10000.0 ** -(np.arange(Dh // 2) / (Dh // 2))
cos, sin = np.cos(np.concatenate([angle, angle], 1)), np.sin(np.concatenate([angle, angle], 1))


def rope(x, cos, sin):  # x * cos + rotate_half(x) * sin over the head dim, whole on every rank: local
    return x * cos + ops.concatenate([-x[..., Dh // 2:], x[..., :Dh // 2]], -1) * sin


def block(x, g1, wq, wk, wv, wo, g2, w1, w3, w2):
    c, s = (DTensor.from_global(mesh, t[:, None, :], L(None, None, None)) for t in (cos, sin))  # (T, 1, Dh)
    h = ops.rms_norm(x, g1)
    q = rope(ops.reshape(h @ wq, (T, KV, G, Dh)), ops.reshape(c, (T, 1, 1, Dh)), ops.reshape(s, (T, 1, 1, Dh)))
    k = rope(ops.reshape(h @ wk, (T, KV, Dh)), c, s)
    v = ops.reshape(h @ wv, (T, KV, Dh))
    scores = ops.masked_fill(ops.einsum("qhgd,khd->hgqk", q, k) * Dh ** -0.5, ops.causal_mask(mesh, (T, T)), -np.inf)
    x = x + ops.reshape(ops.einsum("hgqk,khd->qhgd", ops.softmax(scores, -1), v), (T, D)) @ wo
    h = ops.rms_norm(x, g2)
    return x + (ops.silu(h @ w1) * (h @ w3)) @ w2


with collect_trace() as trace:
    y = block(*params)
    ops.sum(y * y).backward()


def numpy_block(x, g1, wq, wk, wv, wo, g2, w1, w3, w2):  # any argument may carry a leading axis of copies
    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g[..., None, :]

    def rope(x, c, s):
        return x * c + np.concatenate([-x[..., Dh // 2:], x[..., :Dh // 2]], -1) * s

    def split(a, *dims):  # the last axis cut into `dims`
        return a.reshape(a.shape[:-1] + dims)

    h = rms(x, g1)
    q = rope(split(h @ wq, KV, G, Dh), cos[:, None, None], sin[:, None, None])
    k, v = rope(split(h @ wk, KV, Dh), cos[:, None], sin[:, None]), split(h @ wv, KV, Dh)
    s = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, np.einsum("...qhgd,...khd->...hgqk", q, k) * Dh ** -0.5)
    e = np.exp(s - s.max(-1, keepdims=True))
    o = np.einsum("...hgqk,...khd->...qhgd", e / e.sum(-1, keepdims=True), v)
    x = x + o.reshape(o.shape[:-3] + (D,)) @ wo
    h = rms(x, g2)
    return x + (h @ w1 / (1 + np.exp(-(h @ w1))) * (h @ w3)) @ w2


def magnitudes(x, g1, wq, wk, wv, wo, g2, w1, w3, w2):  # what entered sum(y^2), each carried to it as an error
    def rms(x, mx, g):  # (value, magnitudes): the mean square's rounding moves every x / rms
        ms = (x * x).mean(-1, keepdims=True) + 1e-6
        return x / np.sqrt(ms) * g, (mx + abs(x) * (abs(x) * mx).mean(-1, keepdims=True) / ms) / np.sqrt(ms) * abs(g)

    def rope(x, c, s):
        return x * c + np.concatenate([-x[..., Dh // 2:], x[..., :Dh // 2]], -1) * s

    def split(a, *dims):
        return a.reshape(a.shape[:-1] + dims)

    def turned(m, c, s):  # the magnitudes of rope's output from its input's: |cos| m + |sin| (m's halves swapped)
        return m * np.abs(c) + np.concatenate([m[..., Dh // 2:], m[..., :Dh // 2]], -1) * np.abs(s)

    h, mh = rms(x, np.abs(x), g1)
    cq, sq, ck, sk = cos[:, None, None], sin[:, None, None], cos[:, None], sin[:, None]
    q, k, v = rope(split(h @ wq, KV, G, Dh), cq, sq), rope(split(h @ wk, KV, Dh), ck, sk), split(h @ wv, KV, Dh)
    mq, mk = turned(split(mh @ abs(wq), KV, G, Dh), cq, sq), turned(split(mh @ abs(wk), KV, Dh), ck, sk)
    mv = split(mh @ abs(wv), KV, Dh)
    sc = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, np.einsum("qhgd,khd->hgqk", q, k) * Dh ** -0.5)
    msc = (np.einsum("qhgd,khd->hgqk", mq, abs(k)) + np.einsum("qhgd,khd->hgqk", abs(q), mk)) * Dh ** -0.5
    p = np.exp(sc - sc.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    mp = p * (1 + msc + (p * msc).sum(-1, keepdims=True))  # an error in a score moves its p and every p it shares
    o = np.einsum("hgqk,khd->qhgd", p, v).reshape(T, D)
    mo = (np.einsum("hgqk,khd->qhgd", mp, abs(v)) + np.einsum("hgqk,khd->qhgd", p, mv)).reshape(T, D)
    x2, mx2 = x + o @ wo, np.abs(x) + mo @ abs(wo)
    h, mh = rms(x2, mx2, g2)
    a, b, ma, mb = h @ w1, h @ w3, mh @ abs(w1), mh @ abs(w3)
    silu = a / (1 + np.exp(-a))
    y, my = x2 + (silu * b) @ w2, mx2 + (1.1 * ma * abs(b) + abs(silu) * mb + abs(silu * b)) @ abs(w2)  # silu' < 1.1
    return float((3 * np.abs(y) * my).sum())  # y^2: 2 |y| dy


dry = dry_run_active()  # a dry run has no values to check: its references are not made
# The global tensors, once for all simulated ranks (spmdsim.runtime.sim.once; each MPI rank makes its own).
arrays = None if dry else once("llama_block arrays", lambda: [s.full() for s in src])
verdicts = [y.check(lambda region: once("llama_block y", numpy_block, *arrays)[region])]
# Central differences, 128 elements a call; the ranks share them, each computing 1/p
# (spmdsim.runtime.shared_numeric_grads: the same bits as one process computing them all).
numeric = [None] * len(params) if dry else shared_numeric_grads(mesh, lambda *b: numpy_block(*b) ** 2, *arrays,
                                                                 batch=128)
# Their rounding follows what entered sum(y^2) over the step h
# (spmdsim.references.tolerances.central_difference_tolerance).
rtol, atol = (0.0, 0.0) if dry else central_difference_tolerance(magnitudes(*arrays), max(T * D, F))
verdicts += [t.grad.check(lambda region, r=r: r[region], rtol=rtol, atol=atol) for t, r in zip(params, numeric)]
if mesh.rank == 0:
    print(f"collectives: {trace.counts()}")
    print(f"forward and {len(params)} gradients vs numpy: {'PASS' if all(verdicts) else 'FAILED'} "
          f"(max error {max(v.max_abs_error for v in verdicts):.1e})")
raise SystemExit(0 if all(verdicts) else 1)
