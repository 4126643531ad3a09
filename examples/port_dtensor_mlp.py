"""Coming from PyTorch DTensor: a two-layer MLP (column- then row-parallel), MSE loss, backward, one SGD step.

Each comment names the PyTorch line that the spmdsim line replaces; layouts are DTensor placements ("S(0), R"),
made spmdsim layouts by spmdsim.layouts.dialects; output, loss, gradients and updated weights are checked against numpy.
Run: timeout -k 5 120 mpiexec -n 8 python examples/port_dtensor_mlp.py   (or: ... --ranks 8, no mpiexec)
"""
import argparse

import numpy as np

import spmdsim.tools.cli.main  # spmdsim, and its OnceParser: usage and errors printed once, not by every rank
from spmdsim import DTensor, Layout, Mesh, RankCountError, SeededTensor, collect_trace, ops, optim
from spmdsim.layouts.dialects import format_placements, placements_to_layout

parser = spmdsim.tools.cli.main.OnceParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--ranks", metavar="N", help="run on N simulated ranks in this process (no mpiexec)")
parser.add_argument("--dry-run", action="store_true", help="with --ranks: shapes only, each rank's bytes and peak")
parser.parse_args()  # --help prints this docstring; any other argument is refused in one line, exit 2
spmdsim.script(__file__)  # with --ranks N: N simulated ranks in this process (instead of torchrun)
comm = spmdsim.world()    # dist.init_process_group(): MPI's COMM_WORLD, or this simulated rank's
if comm.size % 2:  # the same on every rank: one line (script's guard) with how to get 8 ranks as launched, exit 2
    raise RankCountError(f"dp 2 x tp N/2 needs an even number of ranks, not {comm.size}", 2, comm.size, True
                         ).with_ways(spmdsim.runtime.engines.ways_out(8, comm.size))
mesh = Mesh(Layout((2, comm.size // 2), ("dp", "tp")), comm)  # init_device_mesh("cpu", (2, n // 2), ("dp", "tp"))
# [Shard(0), Replicate()], [Replicate(), Shard(1)], [Replicate(), Shard(0)] on this mesh, as spmdsim layouts
batch, cols, rows = (placements_to_layout(p, mesh, 2) for p in ("S(0), R", "R, S(1)", "R, S(0)"))
B, D, F = 8, 8, 4 * mesh.layout.device_matrix[1]  # batch, width, hidden width (4 hidden units per tp rank)
X, T, W1, W2 = (SeededTensor(s, "float64", seed=i).full() for i, s in enumerate([(B, D), (B, D), (D, F), (F, D)]))
x = DTensor.from_global(mesh, X, batch)  # x = distribute_tensor(X, mesh, [Shard(0), Replicate()])
t_local = T[batch.slices(mesh.rank, T.shape)]  # each rank loaded its own rows of the targets
t = DTensor.from_local(mesh, t_local, batch)  # t = DTensor.from_local(t_local, mesh, [Shard(0), Replicate()])
# parallelize_module(model, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}), weights stored
# (in, out) for x @ w: fc1's columns are Shard(1) (nn.Linear stores (out, in): ColwiseParallel shards its dim 0)
w1, w2 = (DTensor.from_global(mesh, W, layout).requires_grad_() for W, layout in ((W1, cols), (W2, rows)))
opt = optim.SGD([w1, w2], lr=0.1)  # opt = torch.optim.SGD(model.parameters(), lr=0.1)
with collect_trace() as forward:
    y = ops.matmul(ops.relu(x @ w1), w2, reduce=False)  # y = fc2(relu(fc1(x))), before RowwiseParallel's output hook
    partial = format_placements(y.placements)  # y.placements: (Shard(0), Partial())
    y = y.redistribute(batch)  # y = y.redistribute(mesh, [Shard(0), Replicate()]): one Allreduce
    loss = ops.mse_loss(y, t)  # loss = F.mse_loss(y, t)
with collect_trace() as backward:
    loss.backward()  # loss.backward(): weights replicated over dp get their gradients summed over dp
with collect_trace() as step:
    opt.step()  # opt.step(): each rank updates its own shards
A = np.maximum(X @ W1, 0)  # the same step in one numpy process
Y, dY = A @ W2, 2 * (A @ W2 - T) / T.size  # dY: the gradient of the mean squared error
G1, G2 = X.T @ (dY @ W2.T * (A > 0)), A.T @ dY
verdicts = [y.check(Y), loss.check(np.array(((Y - T) ** 2).mean())), w1.grad.check(G1), w2.grad.check(G2),
            w1.check(W1 - 0.1 * G1), w2.check(W2 - 0.1 * G2)]  # each rank checks its own block
full = y.gather()  # y.full_tensor(): the whole output on every rank
passed = all(verdicts) and np.allclose(full, Y, rtol=1e-12, atol=1e-12)
if mesh.rank == 0:  # below, x.local is x.to_local(): this rank's block
    print(f"PyTorch DTensor port: mesh dp 2 x tp {mesh.size // 2}, y = fc2(relu(fc1(x))), MSE loss, SGD")
    print(f"placements: x (S(0), R), w1 (R, S(1)), w2 (R, S(0)), y {partial}, then (S(0), R)")
    print(f"rank 0 to_local(): x {x.local.shape}, w1 {w1.local.shape}, w2 {w2.local.shape}; full_tensor() {full.shape}")
    print(f"collectives: forward {forward.counts()}, backward {backward.counts()}, step {step.counts()}")
    print(f"loss {loss.item():.7f}; output, loss, gradients, updated weights vs numpy: "
          f"{'PASS' if passed else 'FAILED'} (max error {max(v.max_abs_error for v in verdicts):.1e})")
raise SystemExit(0 if passed else 1)
