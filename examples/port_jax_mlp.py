"""Coming from JAX: a two-layer MLP (column- then row-parallel), mean squared error, its gradients, one SGD step.

Each comment names the JAX line the spmdsim line replaces; PartitionSpecs are tuples (P("dp", None) is ("dp", None)).
Run: timeout -k 5 120 mpiexec -n 8 python examples/port_jax_mlp.py (or --ranks 8); every result is checked by numpy.
"""
import argparse

import numpy as np

import spmdsim.tools.cli.main  # spmdsim, and its OnceParser: usage and errors printed once, not by every rank
from spmdsim import DTensor, Layout, Mesh, RankCountError, SeededTensor, collect_trace, ops, dialects
from spmdsim.nn.autograd import no_grad

parser = spmdsim.tools.cli.main.OnceParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--ranks", metavar="N", help="run on N simulated ranks in this process (no mpiexec)")
parser.add_argument("--dry-run", action="store_true", help="with --ranks: shapes only, each rank's bytes and peak")
parser.parse_args()  # --help prints this docstring; any other argument is refused in one line, exit 2
spmdsim.script(__file__)  # with --ranks N: N simulated devices in one process (XLA's forced host device count)
comm = spmdsim.world()    # jax.distributed.initialize(): MPI's COMM_WORLD, or this simulated rank's
if comm.size % 2:  # the same on every rank: one line (script's guard) with how to get 8 ranks as launched, exit 2
    raise RankCountError(f"dp 2 x tp N/2 needs an even number of ranks, not {comm.size}", 2, comm.size, True
                         ).with_ways(spmdsim.runtime.engines.ways_out(8, comm.size))
mesh = Mesh(Layout((2, comm.size // 2), ("dp", "tp")), comm)  # mesh = jax.make_mesh((2, n // 2), ("dp", "tp"))
# NamedSharding(mesh, P("dp", None)), P(None, "tp"), P("tp", None): a mesh and a spec make one spmdsim TensorLayout
batch, cols, rows = (dialects.partition_spec_to_layout(s, mesh, 2) for s in (("dp", None), (None, "tp"), ("tp", None)))
B, D, F = 8, 8, 4 * mesh.layout.device_matrix[1]  # batch, width, hidden width (4 hidden units per tp device)
X, T, W1, W2 = (SeededTensor(s, "float64", seed=i).full() for i, s in enumerate([(B, D), (B, D), (D, F), (F, D)]))
x, t = (DTensor.from_global(mesh, a, batch) for a in (X, T))  # jax.device_put(X, NamedSharding(mesh, P("dp", None)))
w1 = DTensor.from_global(mesh, W1, cols).requires_grad_()  # params = {"w1": jax.device_put(W1, NamedSharding(...)),
w2 = DTensor.from_global(mesh, W2, rows).requires_grad_()  # "w2": ...}; requires_grad_(): what jax.grad differentiates


def loss_fn(w1, w2):  # def loss_fn(params, x, t), on global DTensors
    y = ops.matmul(ops.relu(x @ w1), w2, reduce=False)  # y = relu(x @ w1) @ w2, a sum over tp left pending
    y = y.redistribute(batch)  # y = jax.lax.with_sharding_constraint(y, NamedSharding(mesh, P("dp", None)))
    return ops.resolved(ops.mean((y - t) ** 2)), y  # return jnp.mean((y - t) ** 2), y: a sum over dp, resolved


with collect_trace() as forward:
    loss, y = loss_fn(w1, w2)  # (loss, y), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, t):
with collect_trace() as backward:
    loss.backward()  # its forward above, its backward here; grads are w1.grad and w2.grad
with no_grad():  # params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    new_w1, new_w2 = w1 - 0.1 * w1.grad, w2 - 0.1 * w2.grad
A = np.maximum(X @ W1, 0)  # the same step in one numpy process
Y, dY = A @ W2, 2 * (A @ W2 - T) / T.size  # dY: the gradient of the mean squared error
G1, G2 = X.T @ (dY @ W2.T * (A > 0)), A.T @ dY
verdicts = [y.check(Y), loss.check(np.array(((Y - T) ** 2).mean())), w1.grad.check(G1), w2.grad.check(G2),
            new_w1.check(W1 - 0.1 * G1), new_w2.check(W2 - 0.1 * G2)]  # each device checks its own block
passed = all(verdicts) and np.allclose(y.gather(), Y, rtol=1e-12, atol=1e-12)  # jax.device_get(y)
if mesh.rank == 0:  # below, x.local is the block a shard_map body gets for in_specs=P("dp", None)
    specs = [dialects.format_partition_spec(v.partition_spec) for v in (x, w1, w2, y, w1.grad)]
    print(f"JAX port: Mesh((2, {mesh.size // 2}), ('dp', 'tp')), y = relu(x @ w1) @ w2, mean squared error, SGD")
    print("specs: x {}, w1 {}, w2 {}, y {}, grad w1 {}".format(*specs).replace("PartitionSpec", "P"))
    print(f"device 0's shard_map blocks: x {x.local.shape}, w1 {w1.local.shape}, w2 {w2.local.shape}")
    print(f"collectives: forward {forward.counts()}, backward {backward.counts()}")
    print(f"loss {loss.item():.7f}; output, loss, gradients, updated weights vs numpy: "
          f"{'PASS' if passed else 'FAILED'} (max error {max(v.max_abs_error for v in verdicts):.1e})")
raise SystemExit(0 if passed else 1)
