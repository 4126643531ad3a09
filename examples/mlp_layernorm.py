"""A LayerNorm and a 2-layer MLP, column -> row parallel over the ranks, forward and gradients checked.

LayerNorm over a hidden dim split across the ranks (mean and variance: an
Allreduce of one number per row), Megatron's column-parallel fc1, GELU,
row-parallel fc2 (a pending sum); every parameter's gradient against central
differences of the same numpy program. The operators pick the collectives.
Run: python examples/mlp_layernorm.py --ranks 4   (or: timeout -k 5 120 mpiexec -n 4 python ...)
"""
import argparse

import numpy as np

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed once, not by every rank
from spmdsim import Layout, SeededTensor, ops
from spmdsim.references.forward import gelu
from spmdsim import DTensor, Mesh, collect_trace
from spmdsim.runtime import shared_numeric_grads
from spmdsim.runtime.sim import dry_run_active
from spmdsim.references.tolerances import central_difference_tolerance

# --help prints this docstring; an argument other than --ranks N and --dry-run is refused (exit 2)
parser = OnceParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--ranks", metavar="N", help="run on N simulated ranks in this process (no mpiexec)")
parser.add_argument("--dry-run", action="store_true", help="with --ranks: shapes only, each rank's bytes and peak")
parser.parse_args()
spmdsim.script(__file__, ranks=4)  # --ranks N: N simulated ranks here (1 process alone: says how to get 4)
mesh = Mesh(Layout((spmdsim.world().size,), ("tp",)), spmdsim.world())  # one axis over every rank
L, p = mesh.layout, mesh.size
src = [SeededTensor(s, "float64", seed=i) for i, s in enumerate([(8, 4 * p), (4 * p,), (4 * p, 8 * p), (8 * p, 4 * p)])]
maps = [(None, "tp"), ("tp",), (None, "tp"), ("tp", None)]  # x split on hidden; fc1 columns, fc2 rows
x, g, w1, w2 = [DTensor.from_seeded(mesh, L(*m), s).requires_grad_() for m, s in zip(maps, src)]
with collect_trace() as trace:
    y = ops.einsum("bf,fd->bd", ops.gelu(ops.einsum("bd,df->bf", ops.layer_norm(x, g), w1)), w2)
    ops.sum(y).backward()


def numpy_program(x, g, w1, w2):  # any argument may carry a leading axis of copies
    h = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g[..., None, :]
    return gelu(h @ w1) @ w2


def magnitudes(x, g, w1, w2):  # what entered sum(y), each carried to it as an error in it would be
    d = x - x.mean(-1, keepdims=True)
    var = (d * d).mean(-1, keepdims=True)  # the mean's and the variance's rounding move every d / sd
    md = np.abs(x) + np.abs(x).mean(-1, keepdims=True)
    mh = (md + np.abs(d) * (1 + (np.abs(d) * md).mean(-1, keepdims=True) / var)) / np.sqrt(var + 1e-5) * np.abs(g)
    ma = mh @ np.abs(w1)
    return float(((1.13 * ma + np.abs(gelu(ma))) @ np.abs(w2)).sum())  # GELU's slope at most 1.13


dry = dry_run_active()  # a dry run has no values to check: its references are not made
arrays = None if dry else [s.full() for s in src]
verdicts = [y.check(lambda region: numpy_program(*arrays)[region])]
# Central differences, 128 elements a call; the ranks share them, each computing 1/p
# (spmdsim.runtime.shared_numeric_grads: the same bits as one process computing them all). Their rounding
# follows what entered sum(y) over the step h, and the shapes grow with the ranks (a sum of 8 x 4p outputs).
numeric = [None] * 4 if dry else shared_numeric_grads(mesh, numpy_program, *arrays, batch=128)
rtol, atol = (0.0, 0.0) if dry else central_difference_tolerance(
    magnitudes(*arrays), max(8 * 4 * p, 8 * p + 1), step=float(np.abs(arrays[0]).max()))
verdicts += [t.grad.check(lambda region, r=r: r[region], rtol=rtol, atol=atol) for t, r in zip((x, g, w1, w2), numeric)]
if mesh.rank == 0:
    print(f"collectives: {trace.counts()}")
    print(f"forward and 4 gradients vs numpy: {'PASS' if all(verdicts) else 'FAILED'} "
          f"(max error {max(v.max_abs_error for v in verdicts):.1e})")
raise SystemExit(0 if all(verdicts) else 1)
