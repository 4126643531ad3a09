"""Run seed networks and print their per-operator tables.

    timeout -k 5 120 mpiexec -n 8 python -m spmdsim.models.nets                 # every network that fits
    timeout -k 5 120 mpiexec -n 4 python -m spmdsim.models.nets net_paddle_tp --seed 3
    python -m spmdsim.models.nets --ranks 8                                     # simulated ranks, no mpiexec

Exits 1 when a value fails its check or a hop's collectives differ from its plan, 3 when every network
asked for was skipped at this rank count (as `spmdsim demo` when none ran): nothing was checked.
"""
from __future__ import annotations

import argparse
import sys

from . import NETWORKS
from .seeds import needs_eight, oneflow_needs, paddle_needs
from ...base.once_parser import OnceParser
from ...errors import fold_message
from ...runtime.engines import world
from ...runtime.guard import run_guarded
from ...runtime.sim.launch import run_on_ranks
from .run import NetworkRunner

__all__ = ["main"]

_NEEDS = {"net_mindspore_tutorial": needs_eight, "net_mindspore_layout": needs_eight,
          "net_paddle_tp": paddle_needs, "net_oneflow_2d_sbp": oneflow_needs,
          "net_oneflow_2d_signature": oneflow_needs}


def main(argv: list[str] | None = None) -> int:
    parser = OnceParser(prog="python -m spmdsim.models.nets", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"networks to run (default: all): {', '.join(NETWORKS)}")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ranks", type=int, metavar="N", default=None,
                        help="run on N simulated ranks in this process (no mpiexec)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in NETWORKS]
    if unknown:
        parser.error(f"unknown network(s) {unknown!r}; expected some of {sorted(NETWORKS)!r}")
    if args.ranks is not None:
        return run_on_ranks(args.ranks, lambda: _on_world(args))
    return _on_world(args)


def _on_world(args: argparse.Namespace) -> int:
    comm = world()  # MPI's COMM_WORLD, or the simulated rank's
    return run_guarded(lambda: _run(args.names or list(NETWORKS), args, comm), comm)


def _run(names: list[str], args: argparse.Namespace, comm: object) -> int:
    ok, ran = True, 0
    for name in names:
        reason = _NEEDS[name](comm.Get_size())
        if reason:
            if comm.Get_rank() == 0:
                print(f"{name}: SKIP ({reason})\n")
            continue
        ran += 1
        runner = NetworkRunner(NETWORKS[name](comm.Get_size(), dtype=args.dtype, seed=args.seed), comm)
        result = runner.forward()
        verdicts = result.check_all()
        rows = result.rows()
        passed = all(verdicts) and all(row.matches() for row in rows)
        text = result.table()
        runner.close()
        ok = ok and passed
        if comm.Get_rank() == 0:
            print(f"{text}\n{verdicts[-1]}\n{'PASS' if passed else 'FAIL'}\n")
    if not ran:  # an exit 0 here read as a pass: a script or a user checking the code saw nothing fail
        if comm.Get_rank() == 0:
            size = comm.Get_size()
            print(fold_message(f"python -m spmdsim.models.nets: no network ran on {size} "
                               f"rank{'s' if size != 1 else ''} ({len(names)} asked for, each skipped: its SKIP line "
                               f"says what it needs); 8 ranks run them all (mpiexec -n 8, or --ranks 8)"),
                  file=sys.stderr)
        return 3
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
