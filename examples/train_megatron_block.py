"""A Megatron transformer block with sequence parallelism and vocab-parallel cross-entropy, trained.

Tokens -> VocabParallelEmbedding -> scattered along the sequence (Megatron's sequence
parallelism) -> x + attention(x) (the sequence Allgathered; Q, K, V column-parallel with
the heads split; the row-parallel output projection Reduce_scattered back onto the
sequence) -> + ParallelMLP(sequence_parallel) -> a column-parallel head whose logits stay
split over the vocabulary -> vocab-parallel cross-entropy (the logits are never gathered).
SGD on every parameter; each step's loss, gradients and updated parameters are checked
against the block in one process (numpy float64), from the run's parameters at the step's
start (anchored: differences in rounding do not compound over the steps). Any world size.

Run: timeout -k 5 300 mpiexec -n 8 python examples/train_megatron_block.py [--steps 20]
  or python examples/train_megatron_block.py --ranks 8   (8 simulated ranks in one process)
"""
import sys

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed by rank 0 only under mpiexec
from spmdsim.base.typed_numbers import flag_float  # --lr refused as typed ("--lr -1", not "lr -1.0")
from spmdsim.runtime.sim.launch import ranks_argument
from spmdsim.base.validate import counted
from spmdsim import Layout, SeededTensor
from spmdsim.references import backward as rg
from spmdsim.errors import SpmdsimError
from spmdsim.models.nets.train import PHASES, loss_trend, run_main
from spmdsim.nn.ops import (ColumnParallelLinear, ParallelMLP, RowParallelLinear, VocabParallelEmbedding, add,
                         cross_entropy, matmul, reshape, scale, softmax, transpose)
from spmdsim.nn.optim import SGD
from spmdsim import redistribute
from spmdsim import DTensor, Mesh, collect_trace
from spmdsim.runtime.sim import dry_run_active, once
from spmdsim.references.tolerances import sum_rtol
from spmdsim.models.nets.megatron_reference import megatron_block
import numpy as np  # noqa: E402

parser = OnceParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--lr", type=flag_float, default=None,
                    help="SGD step (default 0.05, and 0.05 * 64 / ranks above 64 ranks: the widths grow with the ranks)")
ranks_argument(parser)  # --ranks N (simulated ranks) and --dry-run beside it
args = parser.parse_args()


def main(args):
    """One rank's training (MPI or simulated); returns the exit code every rank agrees on."""
    comm = spmdsim.world()  # MPI.COMM_WORLD under mpiexec, this thread's rank under --ranks
    p = comm.size
    seq, d_model, heads, width, ffn, vocab = 2 * p, 8, p, 4, 4 * p, 4 * p
    mesh = Mesh(Layout((p,), ("tp",)), comm)
    L = mesh.layout

    emb = VocabParallelEmbedding(mesh, vocab, d_model, axes="tp", dtype="float64", seed=1)
    wq, wk, wv = (ColumnParallelLinear(mesh, d_model, heads * width, bias=False, axes="tp", dtype="float64",
                                       seed=s) for s in (2, 4, 6))
    wo = RowParallelLinear(mesh, heads * width, d_model, bias=False, input_is_parallel=True,
                           sequence_parallel=True, axes="tp", dtype="float64", seed=8)
    mlp = ParallelMLP(mesh, d_model, ffn, sequence_parallel=True, axes="tp", dtype="float64", seed=10)
    head = ColumnParallelLinear(mesh, d_model, vocab, bias=False, sequence_parallel=True, axes="tp",
                                dtype="float64", seed=14)
    params = {"table": emb.weight, "Wq": wq.weight, "Wk": wk.weight, "Wv": wv.weight, "Wo": wo.weight,
              "W1": mlp.linear_fc1.weight, "b1": mlp.linear_fc1.bias, "W2": mlp.linear_fc2.weight,
              "b2": mlp.linear_fc2.bias, "Wh": head.weight}
    tokens_g = SeededTensor((seq,), "int64", 20, low=0, high=vocab).full()
    labels_g = np.roll(tokens_g, -1)  # next-token targets
    tokens = DTensor.from_global(mesh, tokens_g, L(None))
    labels = DTensor.from_global(mesh, labels_g, L(None))


    def per_head(t):
        """(seq, heads*width) split on columns -> (heads, seq, width) split on heads: no communication."""
        return transpose(reshape(t, (seq, heads, width)), (1, 0, 2))


    def block_loss():
        x = redistribute(emb(tokens), L("tp", None))  # scatter to the sequence-parallel region
        h = redistribute(x, L(None, None))  # Allgather the sequence (its backward: Reduce_scatter)
        q, k, v = (per_head(layer(h)) for layer in (wq, wk, wv))
        ctx = matmul(softmax(scale(matmul(q, k, transpose_b=True), width ** -0.5)), v)
        x1 = add(x, wo(reshape(transpose(ctx, (1, 0, 2)), (seq, heads * width))))  # Reduce_scatter
        x2 = add(x1, mlp(x1))
        return cross_entropy(head(x2), labels)  # logits split over the vocabulary


    # A dry run (--dry-run) has shapes, not values: nothing to check, so no reference to hold.
    checking = not dry_run_active()
    # The widths grow with the ranks and the logits with them: a fixed step diverges at 128 ranks.
    lr = args.lr if args.lr is not None else 0.05 * min(1.0, 64 / p)
    # The loss and the gradients within 2 k eps (two computations, each summing in its own order; k the
    # longest sum, 4p) x the magnitudes that entered each element (docs/explanation/tolerances.md, "Tolerances").
    rtol = 2 * sum_rtol(max(seq, d_model, heads * width, ffn, vocab), "float64")
    # Anchored: the reference starts each step from the run's parameters (small: whole), those the step before
    # checked, so each check holds one step's rounding (a free-running reference's differences compound with
    # the steps), and whatever moved the run's parameters after that check shows in the next step's loss.
    start = {name: t.gather() for name, t in params.items()} if checking else {}
    optimizer = SGD(list(params.values()), lr=lr)
    losses, failed, worst, verdicts = [], 0, 0.0, []
    calls = {phase: [0, 0] for phase in PHASES}
    for step in range(args.steps):
        optimizer.zero_grad()
        traces = {}
        with collect_trace() as traces["forward"]:
            loss = block_loss()
        with collect_trace() as traces["backward"]:
            loss.backward()
        with collect_trace() as traces["optimizer"]:
            optimizer.step()
        if not np.isfinite(loss.local).all():  # replicated: every rank sees the same value
            raise SpmdsimError(f"the loss diverged at step {step} ({float(loss.local)}): "
                               f"lower --lr (now {lr})")
        if checking:
            x_ref = start["table"][tokens_g]
            # Simulated ranks (--ranks) run the reference once between them (spmdsim.runtime.sim.once).
            ref_loss, grads, loss_scale, scales = once(("megatron_block", step), megatron_block,
                                                       {k: v for k, v in start.items() if k != "table"}, x_ref,
                                                       labels_g, heads, True)
            grads["table"] = rg.embedding_grad(tokens_g, vocab, grads["x"])
            scales["table"] = rg.embedding_grad(tokens_g, vocab, scales["x"])
            # The loss and each gradient x the magnitudes that entered them (the step on absolute values: not
            # |loss| or max|grad|, which fall far below their terms as the block learns); each updated
            # parameter the run's own update, start - lr x the run's gradient: a few eps of its terms.
            verdicts = [loss.check(np.asarray(ref_loss), rtol=rtol, atol=0.0, scale=np.asarray(loss_scale))]
            sizes = [loss_scale]  # each tensor's largest entry (its magnitudes'), for the summary line
            for name, t in params.items():
                scale_g = float(np.abs(grads[name]).max())
                verdicts.append(t.grad.check(grads[name], rtol=rtol, atol=0.0, scale=scales[name]))
                run_grad = t.grad.gather()
                terms = np.abs(start[name]) + lr * np.abs(run_grad)
                verdicts.append(t.check(start[name] - lr * run_grad, rtol=4 * np.finfo(np.float64).eps, atol=0.0,
                                        scale=terms))
                sizes += [scale_g, float(terms.max())]
            failed += sum(not v for v in verdicts)
            worst = max([worst] + [v.max_abs_error / max(size, 1e-300) for v, size in zip(verdicts, sizes)])
            start = {name: t.gather() for name, t in params.items()}  # the next step's start: the run's
        losses.append(float(loss.local))
        for phase, trace in traces.items():
            calls[phase][0] += trace.totals()["calls"]
            calls[phase][1] += trace.totals()["bytes_sent"]
        if comm.rank == 0 and step % 5 == 0:
            print(f"step {step}: loss {losses[-1]:.7f}")
        if step == 0 and comm.rank == 0:
            for phase in PHASES:
                print(f"step 0 {phase} collectives: {traces[phase].counts()}")
    trend, trend_ok = loss_trend(losses)
    if comm.rank == 0:
        print(trend)
        print("per step (rank 0): " + ", ".join(f"{phase} {c[0] // args.steps} calls {c[1] // args.steps:,} B"
                                                 for phase, c in calls.items()))
        print(f"check: {len(verdicts) * args.steps} tensors over {counted(args.steps, 'step')} vs one process: "
              f"{'PASS' if not failed else f'FAILED ({failed})'}")
        print(f"largest difference {worst:.2e} of the tensor's largest entry")
    mesh.close()
    return 0 if not failed and trend_ok else 1


sys.exit(run_main(main, args, args.ranks))  # simulated ranks with --ranks, else MPI
