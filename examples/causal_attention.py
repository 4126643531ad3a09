"""Causal multi-head self-attention with the heads split over tp, forward and gradients checked.

Q, K, V column-parallel (each rank its heads), scores per head, a causal mask
built rank by rank, softmax over the keys, the row-parallel output projection
(a pending sum, one Allreduce when the result is checked); every weight's
gradient against central differences of the same numpy program. The layer is
as wide at any rank count: tp is 4 where the ranks divide by 4 (else 2 or 1),
one head a tp rank, and the other ranks are dp replicas of it (the same
sequence, so no gradient sum over dp): the check's work does not grow with the ranks.
Run: python examples/causal_attention.py --ranks 4   (or: timeout -k 5 120 mpiexec -n 4 python ...)
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
spmdsim.script(__file__, ranks=4)  # --ranks N: N simulated ranks here (1 process alone: says how to get 4)
world = spmdsim.world()
tp = math.gcd(world.size, 4)  # 4 heads at most: the layer's width does not grow with the ranks
mesh = Mesh(Layout((world.size // tp, tp), ("dp", "tp")), world)  # dp: replicas of the tp ranks' layer
L = mesh.layout
T, D, H = 6, 4 * tp, tp  # sequence, model width, heads (one per tp rank, 4 wide)
src = [SeededTensor(s, "float64", seed=i) for i, s in enumerate([(T, D), (D, D), (D, D), (D, D), (D, D)])]
maps = [(None, None), (None, "tp"), (None, "tp"), (None, "tp"), ("tp", None)]
x, wq, wk, wv, wo = [DTensor.from_seeded(mesh, L(*m), s).requires_grad_() for m, s in zip(maps, src)]
with collect_trace() as trace:
    q, k, v = (ops.reshape(ops.einsum("td,de->te", x, w), (T, H, D // H)) for w in (wq, wk, wv))
    s = ops.einsum("qhd,khd->hqk", q, k) * (D // H) ** -0.5
    s = ops.masked_fill(s, ops.causal_mask(mesh, (T, T)), -np.inf)  # keys after the query: -inf
    o = ops.reshape(ops.einsum("hqk,khd->qhd", ops.softmax(s, -1), v), (T, D))
    y = ops.einsum("te,ed->td", o, wo)
    ops.sum(y * y).backward()


def numpy_program(x, wq, wk, wv, wo):  # any argument may carry a leading axis of copies
    q, k, v = ((x @ w).reshape((x @ w).shape[:-1] + (H, D // H)) for w in (wq, wk, wv))
    s = np.einsum("...qhd,...khd->...hqk", q, k) * (D // H) ** -0.5
    s = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    o = np.einsum("...hqk,...khd->...qhd", p / p.sum(-1, keepdims=True), v)
    return o.reshape(o.shape[:-2] + (D,)) @ wo


def magnitudes(x, wq, wk, wv, wo):  # what entered sum(y^2), each carried to it as an error in it would be
    heads = lambda a: a.reshape(T, H, D // H)  # noqa: E731
    q, k, v = (heads(x @ w) for w in (wq, wk, wv))
    mq, mk, mv = (heads(np.abs(x) @ np.abs(w)) for w in (wq, wk, wv))
    ms = (np.einsum("qhd,khd->hqk", mq, np.abs(k)) + np.einsum("qhd,khd->hqk", np.abs(q), mk)) * (D // H) ** -0.5
    s = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, np.einsum("qhd,khd->hqk", q, k) * (D // H) ** -0.5)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    mp = p * (1 + ms + (p * ms).sum(-1, keepdims=True))  # an error in a score moves its p and every p it shares
    mo = (np.einsum("hqk,khd->qhd", mp, np.abs(v)) + np.einsum("hqk,khd->qhd", p, mv)).reshape(T, D)
    return float((3 * np.abs(numpy_program(x, wq, wk, wv, wo)) * (mo @ np.abs(wo))).sum())  # y^2: 2 |y| dy


dry = dry_run_active()  # a dry run has no values to check: its references are not made
# The global tensors, once for all simulated ranks (spmdsim.runtime.sim.once; each MPI rank makes its own).
arrays = None if dry else once("causal_attention arrays", lambda: [s.full() for s in src])
verdicts = [y.check(lambda region: once("causal_attention y", numpy_program, *arrays)[region])]
# Central differences, 128 elements a call; the ranks share them, each computing 1/p
# (spmdsim.runtime.shared_numeric_grads: the same bits as one process computing them all).
numeric = [None] * 5 if dry else shared_numeric_grads(mesh, lambda *b: numpy_program(*b) ** 2, *arrays, batch=128)
# Their rounding follows what entered sum(y^2) over the step h
# (spmdsim.references.tolerances.central_difference_tolerance).
rtol, atol = (0.0, 0.0) if dry else central_difference_tolerance(magnitudes(*arrays), T * D)
verdicts += [t.grad.check(lambda region, r=r: r[region], rtol=rtol, atol=atol)
             for t, r in zip((x, wq, wk, wv, wo), numeric)]
if mesh.rank == 0:
    print(f"collectives: {trace.counts()}")
    print(f"forward and 5 gradients vs numpy: {'PASS' if all(verdicts) else 'FAILED'} "
          f"(max error {max(v.max_abs_error for v in verdicts):.1e})")
raise SystemExit(0 if all(verdicts) else 1)
