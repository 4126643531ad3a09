"""`spmdsim mpirun -n N python script.py ARGS...`: an unmodified mpi4py program on N simulated ranks.

One process, no mpiexec: each rank is a thread whose ``MPI.COMM_WORLD`` is its
simulated world (spmdsim.emulator.mpirun, docs/howto/mpi4py-lab.md).
"""
from __future__ import annotations

import argparse

from ...emulator.mpirun import add_arguments, run

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
    return run(args.ranks, args.command, args.eager_limit)
