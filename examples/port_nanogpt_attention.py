"""Coming from nanoGPT: its CausalSelfAttention forward, line for line, on DTensors with the heads split over tp.

The fused c_attn weight (C, 3C) is split on its columns over tp, so `split(C, dim=2)` cuts across ranks'
blocks: each of q, k and v moves only the columns each rank's share lacks (an Alltoallv each). Each comment
names the nanoGPT line the spmdsim line replaces; output and both weights' gradients are checked against
numpy (central differences); the global arrays and the reference are made once for all simulated ranks
(spmdsim.runtime.sim.once), and a dry run makes no reference (it has no values to check). The batch is 2 sequences per
dp replica (weak scaling, as data parallelism is: more ranks, more rows): the work, the gradients (sums over the batch)
and so their check's absolute error grow with --ranks; its tolerance is relative to the gradients' size.
Run: python examples/port_nanogpt_attention.py --ranks 8   (or: timeout -k 5 120 mpiexec -n 8 python ...)
"""
import argparse
import math

import numpy as np

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim import DTensor, Layout, Mesh, SeededTensor, collect_trace, ops
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
tp = 4 if world.size % 4 == 0 else 2 if world.size % 2 == 0 else 1
mesh = Mesh(Layout((world.size // tp, tp), ("dp", "tp")), world)
L = mesh.layout
B, T, C, nh = 2 * (world.size // tp), 8, 8 * tp, 2 * tp  # 2 sequences per dp replica, 2 heads of width 4 per tp rank
# The global arrays every rank cuts its block from, once for all simulated ranks (each MPI rank makes its own).
X, WA, WP = once("nanoGPT arrays", lambda shapes: [SeededTensor(s, "float64", seed=i).full()
                                                   for i, s in enumerate(shapes)], [(B, T, C), (C, 3 * C), (C, C)])
x = DTensor.from_global(mesh, X, L("dp", None, None))
c_attn = DTensor.from_global(mesh, WA, L(None, "tp")).requires_grad_()  # ColwiseParallel
c_proj = DTensor.from_global(mesh, WP, L("tp", None)).requires_grad_()  # RowwiseParallel
with collect_trace() as trace:
    B, T, C = x.size()  # B, T, C = x.size()
    q, k, v = (x @ c_attn).split(C, dim=2)  # q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
    k = k.view(B, T, nh, C // nh).swapaxes(1, 2)  # k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
    q = q.view(B, T, nh, C // nh).swapaxes(1, 2)  # q = q.view(...).transpose(1, 2)
    v = v.view(B, T, nh, C // nh).swapaxes(1, 2)  # v = v.view(...).transpose(1, 2)
    att = (q @ k.swapaxes(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # att = (q @ k.transpose(-2, -1)) * ...
    att = att.masked_fill(ops.causal_mask(mesh, (T, T)), float("-inf"))  # att.masked_fill(self.bias[...] == 0, ...)
    att = att.softmax(dim=-1)  # att = F.softmax(att, dim=-1)
    y = (att @ v).swapaxes(1, 2).contiguous().view(B, T, C)  # y = y.transpose(1, 2).contiguous().view(B, T, C)
    y = y @ c_proj  # y = self.c_proj(y): one Allreduce
    ops.sum(y * y).backward()


def numpy_program(x, wa, wp):  # a weight may carry a leading axis of copies (before the batch's)
    wa, wp = (w[:, None] if w.ndim == 3 else w for w in (wa, wp))
    heads = [t.reshape(t.shape[:-1] + (nh, C // nh)).swapaxes(-3, -2) for t in np.split(x @ wa, 3, axis=-1)]
    s = heads[0] @ heads[1].swapaxes(-1, -2) / math.sqrt(C // nh)
    s = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    y = ((p / p.sum(-1, keepdims=True)) @ heads[2]).swapaxes(-3, -2)
    return y.reshape(y.shape[:-2] + (C,)) @ wp


def magnitudes(x, wa, wp):  # what entered sum(y^2), each carried to it as an error in it would be
    heads = lambda a: a.reshape(B, T, nh, C // nh).swapaxes(1, 2)  # noqa: E731
    (q, k, v), (mq, mk, mv) = ([heads(t) for t in np.split(a, 3, axis=-1)] for a in (x @ wa, np.abs(x) @ np.abs(wa)))
    ms = (mq @ np.abs(k).swapaxes(-1, -2) + np.abs(q) @ mk.swapaxes(-1, -2)) / math.sqrt(C // nh)
    s = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, q @ k.swapaxes(-1, -2) / math.sqrt(C // nh))
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    mp = p * (1 + ms + (p * ms).sum(-1, keepdims=True))  # an error in a score moves its p and every p it shares
    mo = (mp @ np.abs(v) + p @ mv).swapaxes(1, 2).reshape(B, T, C)
    return float((3 * np.abs(numpy_program(x, wa, wp)) * (mo @ np.abs(wp))).sum())  # y^2: 2 |y| dy


dry = dry_run_active()  # a dry run has no values to check: its references are not made
verdicts = [y.check(lambda region: once("nanoGPT y", numpy_program, X, WA, WP)[region])]
squares = lambda x, wa, wp: numpy_program(x, wa, wp) ** 2  # noqa: E731  # the loss's addends
# The weights' only, 128 elements a call, each rank computing 1/p of them (spmdsim.runtime.shared_numeric_grads).
grads = [np.zeros(0)] * 2 if dry else shared_numeric_grads(mesh, lambda wa, wp: squares(X, wa, wp), WA, WP, batch=128)
# Their rounding follows what entered sum(y^2) over the step h
# (spmdsim.references.tolerances.central_difference_tolerance).
rtol, atol = (0.0, 0.0) if dry else central_difference_tolerance(magnitudes(X, WA, WP), max(B * T * C, 3 * C))
verdicts += [t.grad.check(lambda region, g=g: g[region], rtol=rtol, atol=atol) for t, g in zip((c_attn, c_proj), grads)]
if mesh.rank == 0:
    print(f"nanoGPT attention: mesh dp {mesh.size // tp} x tp {tp}, {nh} heads, batch {B} (2 a dp replica), "
          "c_attn's columns over tp")
    print(f"collectives: {trace.counts()}")
    print(f"output and 2 weight gradients vs numpy: {'PASS' if all(verdicts) else 'FAILED'} "
          f"(max error {max(v.max_abs_error for v in verdicts):.1e})")
raise SystemExit(0 if all(verdicts) else 1)
