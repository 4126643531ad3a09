"""`spmdsim mpirun -n N python script.py ARGS...`: an unmodified mpi4py program on N simulated ranks.

One process, no mpiexec: each rank is a thread whose ``MPI.COMM_WORLD`` is its
simulated world (spmdsim.emulator.mpirun, docs/howto/mpi4py-lab.md).
"""
from __future__ import annotations

import argparse
import sys

from ...base.threads import after_rank0_says, launcher_rank, launcher_size
from ...emulator.mpirun import add_arguments, run
from ...errors import fold_message

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "mpirun",
        help="run an unmodified mpi4py program on N simulated ranks in this process",
        description=__doc__.split("\n\n")[0],
    )
    add_arguments(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    launched = launcher_size()
    if launched > 1:  # each process would run all N simulated ranks: the output `launched` times
        if launcher_rank() == 0:
            print(fold_message(f"spmdsim mpirun: error: mpiexec started {launched} processes, and each would run "
                               "every simulated rank; run spmdsim mpirun without mpiexec, or the program under "
                               f"mpiexec alone (mpiexec -n {launched} python prog.py)"), file=sys.stderr)
        return after_rank0_says(2)
    return run(args.ranks, args.command, args.eager_limit)
