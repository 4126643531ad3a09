"""MindSpore's operator-parallel network on handwritten digits, checked every step.

Flatten > MatMul1 shard((2,4),(4,1)) > ReLU1 ((4,1)) > MatMul2 ((1,8),(8,1)) > ReLU2 ((8,1))
> MatMul3 (data parallel), cross-entropy, SGD(lr 1e-2), batch 32, on 8 ranks. Every step's
loss, every gradient and every updated parameter is compared, on each rank's own slices, with
the same step in one process (numpy float64) from the run's parameters and optimizer state at the
step's start. `--net layout` trains the Layout-tuple variant.

Run: timeout -k 5 300 mpiexec -n 8 python examples/train_mindspore_tutorial.py [--steps 100]
  or python examples/train_mindspore_tutorial.py --ranks 8   (8 simulated ranks in one process)
     [--dtype float64|float32] [--net tutorial|layout] [--optimizer sgd|adam] [--synthetic]
"""
import sys
import time

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed by rank 0 only under mpiexec
from spmdsim.base.typed_numbers import flag_float  # --lr refused as typed ("--lr -1", not "lr -1.0")
from spmdsim.runtime.sim.launch import ranks_argument
from spmdsim.base.validate import counted
from spmdsim.models.nets import mindspore_layout, mindspore_tutorial, needs_eight
from spmdsim.models.nets.digits import load_digits
from spmdsim.models.nets.train import PHASES, NetworkTrainer, explain_backward, loss_trend, run_main
from spmdsim.models.nets.shared import SharedReferenceTrainer

# rtol of the loss, the gradients and the updated parameters, x the magnitudes that entered each
# element (ReferenceStep's scales; docs/explanation/tolerances.md, "Tolerances"), not x the result: Adam drives
# the loss to 1e-8, far below the terms of its sums. Each step's reference starts from the run's
# parameters and optimizer state and updates with the run's gradients (anchored: docs/howto/train.md),
# so each figure is one step's rounding. float64: the sums differ from one process's only in their
# order (a sum of k terms can round by k eps, about 4e-13 here); float32 is held to the float64
# reference. Measured worst over 100 steps, SGD and Adam: float64 gradients 4e-18 and parameters 6e-16 of
# their magnitudes, float32 6e-9 and 3e-7.
TOLERANCE = {"float64": 1e-12, "float32": 1e-4}

parser = OnceParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=100, metavar="N", help="training steps (default 100)")
parser.add_argument("--dtype", choices=tuple(TOLERANCE), default="float64",
                    help="the network's dtype, its check's tolerance with it (default float64)")
parser.add_argument("--net", choices=("tutorial", "layout"), default="tutorial",
                    help="the tutorial's shard strategies (default) or its Layout-tuple variant")
parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd", help="the optimizer (default sgd)")
parser.add_argument("--lr", type=flag_float, default=None, help="default 1e-2 (SGD) or 1e-3 (Adam)")
parser.add_argument("--synthetic", action="store_true", help="seeded synthetic digits instead of MNIST")
parser.add_argument("--explain", action="store_true", help="say what each backward collective answers")
ranks_argument(parser)  # --ranks N (simulated ranks) and --dry-run beside it
args = parser.parse_args()
data = load_digits(seed=0, synthetic=args.synthetic)  # every rank's copy (one for all simulated ranks)


def main(args):
    """One rank's training (MPI or simulated); returns the exit code every rank agrees on."""
    comm = spmdsim.world()  # MPI.COMM_WORLD under mpiexec, this thread's rank under --ranks
    lr = args.lr if args.lr is not None else (1e-2 if args.optimizer == "sgd" else 1e-3)
    build = mindspore_tutorial if args.net == "tutorial" else mindspore_layout
    net = build(comm.size, dtype=args.dtype, seed=0)
    trainer = NetworkTrainer(net, comm, optimizer=args.optimizer, lr=lr)
    reference = SharedReferenceTrainer(net, optimizer=args.optimizer, lr=lr, comm=comm)  # MPI: rank 0 steps it
    rtol = TOLERANCE[args.dtype]
    batch = net.source.shape[0]
    if comm.rank == 0:
        print(f"{net.title}, {args.dtype}, {comm.size} ranks")
        print(f"data: {data.source}")
        # anchored: docs/howto/train.md, "MindSpore's tutorial network trained"
        print(f"{args.optimizer}(lr {lr:g}), batch {batch}, {counted(args.steps, 'step')}; "
              "each step checked against one process")
        print(f"from the run's parameters at its start (rtol {rtol:g} x the magnitudes that entered each element)")

    losses, worst, failed = [], 0.0, 0
    bytes_by_phase = {phase: [0, 0] for phase in PHASES}  # calls, bytes sent (this rank)
    start = time.perf_counter()
    for step in range(args.steps):
        x, labels = data.batch(step, batch)
        explain = [] if args.explain and step == 0 else None
        result = trainer.step(x, labels, explain, anchor=True)
        if explain and comm.rank == 0:
            print(explain_backward(explain))
        ref = reference.step(x, labels, anchor=result.anchor)
        verdicts = trainer.check(result, ref, rtol)
        failed += sum(not v for v in verdicts)
        worst = max([worst] + [v.max_abs_error for v in verdicts])
        losses.append(result.value)
        for phase, trace in result.traces.items():
            totals = trace.totals()
            bytes_by_phase[phase][0] += totals["calls"]
            bytes_by_phase[phase][1] += totals["bytes_sent"]
        if comm.rank == 0 and step % 10 == 0:
            print(f"epoch: 0 step: {step}, loss is {result.value:.7f}")
    seconds = time.perf_counter() - start
    counts = comm.gather(bytes_by_phase, root=0)
    trainer.close()
    trend, trend_ok = loss_trend(losses, lr=args.lr)
    if comm.rank == 0:
        print(trend)
        print("collectives per step (busiest rank): " + ", ".join(
            f"{phase} {max(c[phase][0] for c in counts) / args.steps:g}" for phase in PHASES))
        print("bytes sent per step (busiest rank): " + ", ".join(
            f"{phase} {max(c[phase][1] for c in counts) // args.steps:,}" for phase in PHASES))
        checked = len(verdicts) * args.steps
        verdict = "PASS" if not failed else f"FAILED ({failed} of {checked})"
        print(f"check: {checked} tensors over {counted(args.steps, 'step')} (loss, {len(ref.grads)} gradients, "
              f"{len(ref.params)} parameters per step) vs one process: {verdict}")
        print(f"largest difference {worst:.2e} (absolute); {seconds:.1f} s")
    return 0 if not failed and trend_ok else 1


sys.exit(run_main(main, args, args.ranks, needs=needs_eight))  # --ranks N: simulated; else MPI
