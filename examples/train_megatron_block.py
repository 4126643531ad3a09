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
from spmdsim.base.typed_numbers import fixed, flag_float  # --lr refused as typed ("--lr -1", not "lr -1.0")
from spmdsim.runtime.sim.launch import ranks_argument
from spmdsim.base.validate import counted
from spmdsim import Layout, SeededTensor
from spmdsim.references import backward as rg
from spmdsim.errors import SpmdsimError, fold_message
from spmdsim.models.nets.train import PHASES, loss_trend, run_main
from spmdsim.models.gpt.step_check import QUIET  # numpy's overflow warnings: the check's line names non-finite values
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
parser.add_argument("--steps", type=int, default=20, metavar="N", help="training steps (default 20)")
parser.add_argument("--lr", type=flag_float, default=None,
                    help="SGD step (default 0.05, and 0.05 * 64 / ranks above 64 ranks: the widths grow with "
                         "the ranks)")
ranks_argument(parser)  # --ranks N (simulated ranks) and --dry-run beside it
args = parser.parse_args()


class MegatronBlock:
    """The block on a 1-D "tp" mesh of all the ranks (its widths grow with them), and the tokens it learns."""

    def __init__(self, comm):
        """Build the mesh, the layers (seeded: alike on every rank) and the tokens with their next-token labels."""
        p = comm.size
        seq, d_model, heads, width, ffn, vocab = 2 * p, 8, p, 4, 4 * p, 4 * p
        self.seq, self.d_model, self.heads, self.width, self.ffn, self.vocab = seq, d_model, heads, width, ffn, vocab
        self.mesh = mesh = Mesh(Layout((p,), ("tp",)), comm)
        self.emb = VocabParallelEmbedding(mesh, vocab, d_model, axes="tp", dtype="float64", seed=1)
        self.wq, self.wk, self.wv = (ColumnParallelLinear(mesh, d_model, heads * width, bias=False, axes="tp",
                                                          dtype="float64", seed=s) for s in (2, 4, 6))
        self.wo = RowParallelLinear(mesh, heads * width, d_model, bias=False, input_is_parallel=True,
                                    sequence_parallel=True, axes="tp", dtype="float64", seed=8)
        self.mlp = ParallelMLP(mesh, d_model, ffn, sequence_parallel=True, axes="tp", dtype="float64", seed=10)
        self.head = ColumnParallelLinear(mesh, d_model, vocab, bias=False, sequence_parallel=True, axes="tp",
                                         dtype="float64", seed=14)
        fc1, fc2 = self.mlp.linear_fc1, self.mlp.linear_fc2
        self.params = {"table": self.emb.weight, "Wq": self.wq.weight, "Wk": self.wk.weight, "Wv": self.wv.weight,
                       "Wo": self.wo.weight, "W1": fc1.weight, "b1": fc1.bias, "W2": fc2.weight, "b2": fc2.bias,
                       "Wh": self.head.weight}
        self.tokens_g = SeededTensor((seq,), "int64", 20, low=0, high=vocab).full()
        self.labels_g = np.roll(self.tokens_g, -1)  # next-token targets
        self.tokens = DTensor.from_global(mesh, self.tokens_g, mesh.layout(None))
        self.labels = DTensor.from_global(mesh, self.labels_g, mesh.layout(None))

    def per_head(self, t):
        """(seq, heads*width) split on columns -> (heads, seq, width) split on heads: no communication."""
        return transpose(reshape(t, (self.seq, self.heads, self.width)), (1, 0, 2))

    def loss(self):
        """The forward pass: the tokens' cross-entropy, the sequence split over tp between the layers."""
        L, seq, heads, width = self.mesh.layout, self.seq, self.heads, self.width
        x = redistribute(self.emb(self.tokens), L("tp", None))  # scatter to the sequence-parallel region
        h = redistribute(x, L(None, None))  # Allgather the sequence (its backward: Reduce_scatter)
        q, k, v = (self.per_head(layer(h)) for layer in (self.wq, self.wk, self.wv))
        ctx = matmul(softmax(scale(matmul(q, k, transpose_b=True), width ** -0.5)), v)
        x1 = add(x, self.wo(reshape(transpose(ctx, (1, 0, 2)), (seq, heads * width))))  # Reduce_scatter
        x2 = add(x1, self.mlp(x1))
        return cross_entropy(self.head(x2), self.labels)  # logits split over the vocabulary


def main(args):
    """One rank's training (MPI or simulated); returns the exit code every rank agrees on."""
    comm = spmdsim.world()  # MPI.COMM_WORLD under mpiexec, this thread's rank under --ranks
    block = MegatronBlock(comm)
    with np.errstate(**QUIET):
        losses, calls, checked, failed, worst, nonfinite = train_steps(args, block)
    trend, trend_ok = loss_trend(losses, lr=args.lr)
    if comm.rank == 0:
        report(args, trend, calls, (checked, failed, worst, nonfinite))
    block.mesh.close()
    return 0 if not failed and trend_ok else 1


def train_steps(args, block):
    """SGD for --steps steps, each checked; the losses, the calls per phase, tensors checked, failed, worst, and
    (step, tensor, Verdict) of each check that met non-finite values (NaN/Inf, in the run or its reference)."""
    p, rank0 = block.mesh.comm.size, block.mesh.comm.rank == 0
    # A dry run (--dry-run) has shapes, not values: nothing to check, so no reference to hold.
    checking = not dry_run_active()
    # The widths grow with the ranks and the logits with them: a fixed step diverges at 128 ranks.
    lr = args.lr if args.lr is not None else 0.05 * min(1.0, 64 / p)
    # The loss and the gradients within 2 k eps (two computations, each summing in its own order; k the
    # longest sum, 4p) x the magnitudes that entered each element (docs/explanation/tolerances.md, "Tolerances").
    rtol = 2 * sum_rtol(max(block.seq, block.d_model, block.heads * block.width, block.ffn, block.vocab), "float64")
    # Anchored: the reference starts each step from the run's parameters (small: whole), those the step before
    # checked, so each check holds one step's rounding (a free-running reference's differences compound with
    # the steps), and whatever moved the run's parameters after that check shows in the next step's loss.
    start = {name: t.gather() for name, t in block.params.items()} if checking else {}
    optimizer = SGD(list(block.params.values()), lr=lr)
    losses, failed, worst, verdicts, nonfinite = [], 0, 0.0, [], []
    calls = {phase: [0, 0] for phase in PHASES}
    for step in range(args.steps):
        optimizer.zero_grad()
        traces = {}
        with collect_trace() as traces["forward"]:
            loss = block.loss()
        with collect_trace() as traces["backward"]:
            loss.backward()
        with collect_trace() as traces["optimizer"]:
            optimizer.step()
        if not np.isfinite(loss.local).all():  # replicated: every rank sees the same value
            raise SpmdsimError(f"the loss diverged at step {step} ({float(loss.local)}): "
                               f"lower --lr (now {lr})")
        if checking:
            verdicts, sizes, labels = check_step(block, step, loss, start, lr, rtol)
            failed += sum(not v for v in verdicts)
            nonfinite += [(step, label, v) for v, label in zip(verdicts, labels) if v.nonfinite]
            worst = max([worst] + [v.max_abs_error / max(size, 1e-300) for v, size in zip(verdicts, sizes)])
            start = {name: t.gather() for name, t in block.params.items()}  # the next step's start: the run's
        losses.append(float(loss.local))
        for phase, trace in traces.items():
            calls[phase][0] += trace.totals()["calls"]
            calls[phase][1] += trace.totals()["bytes_sent"]
        if rank0 and step % 5 == 0:
            print(f"step {step}: loss {fixed(losses[-1], 7)}")
        if step == 0 and rank0:
            for phase in PHASES:
                print(f"step 0 {phase} collectives: {traces[phase].counts()}")
    return losses, calls, len(verdicts), failed, worst, nonfinite


def check_step(block, step, loss, start, lr, rtol):
    """The step's verdicts against the block in one process from the step's `start`, each tensor's size and what
    each checked ("the loss", "Wq's gradient", "Wq after the update")."""
    tokens_g, vocab = block.tokens_g, block.vocab
    x_ref = start["table"][tokens_g]
    # Simulated ranks (--ranks) run the reference once between them (spmdsim.runtime.sim.once).
    ref_loss, grads, loss_scale, scales = once(("megatron_block", step), megatron_block,
                                               {k: v for k, v in start.items() if k != "table"}, x_ref,
                                               block.labels_g, block.heads, True)
    grads["table"] = rg.embedding_grad(tokens_g, vocab, grads["x"])
    scales["table"] = rg.embedding_grad(tokens_g, vocab, scales["x"])
    # The loss and each gradient x the magnitudes that entered them (the step on absolute values: not
    # |loss| or max|grad|, which fall far below their terms as the block learns); each updated
    # parameter the run's own update, start - lr x the run's gradient: a few eps of its terms.
    verdicts = [loss.check(np.asarray(ref_loss), rtol=rtol, atol=0.0, scale=np.asarray(loss_scale))]
    sizes = [loss_scale]  # each tensor's largest entry (its magnitudes'), for the summary line
    labels = ["the loss"] + [f"{name}{what}" for name in block.params for what in ("'s gradient", " after the update")]
    for name, t in block.params.items():
        scale_g = float(np.abs(grads[name]).max())
        verdicts.append(t.grad.check(grads[name], rtol=rtol, atol=0.0, scale=scales[name]))
        run_grad = t.grad.gather()
        terms = np.abs(start[name]) + lr * np.abs(run_grad)
        verdicts.append(t.check(start[name] - lr * run_grad, rtol=4 * np.finfo(np.float64).eps, atol=0.0,
                                scale=terms))
        sizes += [scale_g, float(terms.max())]
    return verdicts, sizes, labels


def report(args, trend, calls, check):
    """Print (rank 0) the loss's trend, the collectives per step and the check's verdict: `check` is (tensors
    checked a step, failed, the largest difference, the checks that met non-finite values: train_steps')."""
    checked, failed, worst, nonfinite = check
    print(trend)
    print("per step (rank 0): " + ", ".join(f"{phase} {c[0] // args.steps} calls {c[1] // args.steps:,} B"
                                             for phase, c in calls.items()))
    where = ""
    if nonfinite:  # the differences below cover the finite values alone (spmdsim.runtime.check.Verdict)
        step, label, verdict = nonfinite[0]
        where = (f", {len(nonfinite)} of them with non-finite values (NaN/Inf), the first {label} at step {step} "
                 f"({verdict.nonfinite:,} of {verdict.elements:,} values): lower --lr")
    print(fold_message(f"check: {checked * args.steps} tensors over {counted(args.steps, 'step')} vs one process: "
                       f"{'PASS' if not failed else f'FAILED ({failed}){where}'}"))  # within 100 columns
    print(f"largest difference {worst:.2e} of the tensor's largest entry{' (finite values)' if nonfinite else ''}")


sys.exit(run_main(main, args, args.ranks))  # simulated ranks with --ranks, else MPI
