"""The command line bench_gpt's peers share (peer_dtensor_gpt.py, peer_mpi4py_gpt.py): the model's size,
the mesh, the timed and checked steps, each count checked in one line."""
from __future__ import annotations

import argparse
from typing import Optional

__all__ = ["add_model_arguments", "add_run_arguments", "refuse_small", "mesh_problem"]

#: The counts and the least each may be.
_LEAST = (("steps", 1), ("check", 0), ("layers", 1), ("d_model", 1), ("seq", 1), ("dp", 1), ("tp", 1))


def add_model_arguments(ap: argparse.ArgumentParser, check: int, check_help: str) -> None:
    """--steps, --check (default `check`), --layers, --d-model, --seq, --dp, --tp."""
    ap.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    ap.add_argument("--check", type=int, default=check, help=check_help)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--tp", type=int, default=4)


def add_run_arguments(ap: argparse.ArgumentParser) -> None:
    """--wait (busy, polite or auto) and --dropout: how a peer of blocking collectives waits, its dropout."""
    ap.add_argument("--wait", choices=("busy", "polite", "auto"), default="auto",
                    help="blocking MPI calls, or nonblocking ones polled politely (auto: as spmdsim decides)")
    ap.add_argument("--dropout", type=float, default=0.1)


def refuse_small(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """argparse's one-line error (exit 2) for a count below its least."""
    for name, low in _LEAST:
        if getattr(args, name) < low:
            ap.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be at least {low}")


def mesh_problem(args: argparse.Namespace, size: int, dropout: Optional[float] = None) -> Optional[str]:
    """Why the run cannot start on `size` ranks (one line), or None: --dp x --tp must be the ranks mpiexec
    started, and the GPT of the arguments' sizes (`dropout`: None for GPTConfig's) must split over that mesh
    with sequence parallelism (spmdsim.models.gpt.layouts.mesh_problem)."""
    from spmdsim.errors import SpmdsimError
    from spmdsim.models.gpt import GPTConfig
    from spmdsim.models.gpt.layouts import mesh_problem as split_problem

    if args.dp * args.tp != size:
        return f"--dp {args.dp} x --tp {args.tp} is {args.dp * args.tp} ranks; mpiexec started {size}"
    given = {} if dropout is None else {"dropout": dropout}
    try:
        cfg = GPTConfig(layers=args.layers, d_model=args.d_model, heads=4, seq=args.seq, batch=8, **given)
    except SpmdsimError as e:
        return str(e)
    return split_problem(cfg, args.dp, args.tp, sp=True)
