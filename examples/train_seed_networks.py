"""Paddle's Embedding > column Linear > row Linear and OneFlow's 2D SBP model, trained.

Each network learns seeded labels for its own seeded input (cross-entropy over its
last dim, SGD); every step's loss, gradients and updated parameters are compared with
the same step in one process (numpy float64) from the run's parameters at the step's
start, within 1e-12 of the magnitudes that entered each element. Paddle's network runs
where 960 and 240 divide by the rank count, OneFlow's on an even count (a 2 x n placement);
a network that cannot run is skipped, saying why, and a rank count where none can is refused.
With --zero 3 every parameter is fully sharded over the axis that splits the batch (ZeRO-3, FSDP):
gathered before its stage, freed after it, its gradient reduce-scattered onto the shard SGD steps.

Run: timeout -k 5 300 mpiexec -n 4 python examples/train_seed_networks.py [--steps 10]
  or python examples/train_seed_networks.py --ranks 4   (4 simulated ranks in one process)
"""
import sys

import spmdsim
from spmdsim.tools.cli.main import OnceParser  # usage and errors printed by rank 0 only under mpiexec
from spmdsim.base.typed_numbers import flag_float  # --lr refused as typed ("--lr -1", not "lr -1.0")
from spmdsim.runtime.sim.launch import ranks_argument
from spmdsim.models.nets import seeds
from spmdsim.models.nets.train import PHASES, NetworkTrainer, loss_trend, refuse, run_main
from spmdsim.models.nets.reference import ReferenceTrainer
from spmdsim.models.nets.sharded import zero_problem
import numpy as np  # noqa: E402

NETWORKS = {"paddle_tp": seeds.paddle_needs, "oneflow_2d_sbp": seeds.oneflow_needs,
            "oneflow_2d_signature": seeds.oneflow_needs}

parser = OnceParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=10, metavar="N", help="training steps (default 10)")
parser.add_argument("--lr", type=flag_float, default=0.1, help="SGD's learning rate (default 0.1)")
parser.add_argument("--net", choices=tuple(NETWORKS), nargs="+", default=list(NETWORKS),
                    help="the networks to train (default: all that run on the rank count)")
parser.add_argument("--bucket", action="store_true",
                    help="sum the replicas' gradients pending over the same axes in one Allreduce")
parser.add_argument("--zero", type=int, choices=(0, 3), default=0,
                    help="3: every parameter fully sharded over the axis that splits the batch (ZeRO-3, FSDP)")
ranks_argument(parser)  # --ranks N (simulated ranks) and --dry-run beside it
args = parser.parse_args()
if args.bucket and args.zero == 3:
    refuse("--bucket sums whole gradients in one Allreduce; with --zero 3 each gradient is reduce-scattered onto "
           "its shard: give one of them")


def why_skipped(size):
    """{reason: the networks asked for that cannot run on `size` ranks for it}, in the order asked."""
    skipped = {}
    for name in dict.fromkeys(args.net):
        why = NETWORKS[name](size) or (zero_problem(getattr(seeds, name)(size)) if args.zero == 3 else None)
        if why:
            skipped.setdefault(why, []).append(name)
    return skipped


def none_runs(size):
    """Why no network asked for runs on `size` ranks (refused in one line, exit 2), or None."""
    skipped = why_skipped(size)
    return "; ".join(skipped) if sum(map(len, skipped.values())) == len(set(args.net)) else None


def train(name, comm):
    """Train one network; returns (passed, losses) on every rank alike."""
    net = getattr(seeds, name)(comm.size, dtype="float64")
    x = net.source.full()
    rows = int(np.prod(net.out_shape[:-1]))
    labels = np.random.default_rng(1).integers(0, net.out_shape[-1], rows)
    trainer = NetworkTrainer(net, comm, lr=args.lr, bucket=args.bucket, zero=args.zero)
    reference = ReferenceTrainer(net, lr=args.lr)
    failed, losses = 0, []
    for step in range(args.steps):
        result = trainer.step(x, labels, anchor=True)
        failed += sum(not v for v in trainer.check(result, reference.step(x, labels, anchor=result.anchor), 1e-12))
        losses.append(result.value)
    counts = {phase: (trace.counts(), trace.totals()["bytes_sent"]) for phase, trace in result.traces.items()}
    trainer.close()
    trend, trend_ok = loss_trend(losses, lr=args.lr)
    if comm.rank == 0:
        print(f"{net.title}, {comm.size} rank{'s' * (comm.size > 1)}")
        print(f"  {trend}; every step vs one process: {'PASS' if not failed else f'FAILED ({failed})'}")
        for phase in PHASES:
            calls, sent = counts[phase]
            print(f"  {phase} collectives per step: {calls}" + (f", {sent:,} B sent by rank 0" if calls else ""))
    return not failed and trend_ok


def main(args):
    """One rank's run (MPI or simulated); returns the exit code every rank agrees on."""
    comm = spmdsim.world()
    skipped = why_skipped(comm.size)
    ran = [train(name, comm) for name in dict.fromkeys(args.net) if not any(name in n for n in skipped.values())]
    for why, names in skipped.items():
        if comm.rank == 0:
            print(f"skipped: {', '.join(names)} ({why})")
    return 0 if ran and all(ran) else 1


FITS = 4 if args.zero == 3 else 8  # ranks where some network runs
sys.exit(run_main(main, args, args.ranks, needs=none_runs, fits=FITS))  # simulated ranks with --ranks, else MPI
