"""What the commands that run on ranks share (run, run redistribute, demo, autoshard --run, calibrate,
collective): the common flags, their checks before any work, the world they run on and the guard that ends
the whole job when some ranks fail.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from ...base.threads import launcher_size
from ...base.validate import counted
from ...errors import RankCountError, SpmdsimError
from ...layouts.layout import Layout
from ...runtime.debug import add_cli_arguments, configure_from_args, watchdog_setting
from ...runtime.engines import world
from ...runtime.sim.launch import DRY_RUN_NEEDS_RANKS, ranks_argument, ranks_problem, run_on_ranks
from .paths import check_output_file

__all__ = ["add_common_arguments", "on_world", "guarded", "add_trace_out", "check_trace_out", "check_watchdog",
           "check_seed", "check_ranks", "with_expected_ranks", "SEED_LIMIT", "DRY_RUN_EXPLAINS_NOTHING"]


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """--dtype, --seed, --ranks and the debug flags (--check, --watchdog), shared with `spmdsim demo`."""
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32",
                        help="element type of the generated tensors (default float32)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated data")
    add_cli_arguments(parser)
    ranks_argument(parser)


def on_world(args: argparse.Namespace, fn: Callable[[Any], int],
             check: Callable[[int], None] | None = None, dry_codes: tuple = ()) -> int:
    """`fn(comm)` on the MPI world, or with ``--ranks N`` on N simulated ranks in this process.

    `check(N)`: with --ranks, the arguments' own checks (raising SpmdsimError) before the banner, so that a bad
    value is the one line printed, as under mpiexec (where `fn` repeats them on every rank inside its guard).
    `dry_codes`: the exit codes a dry run passes on (run_on_ranks), else 0.
    """
    n = getattr(args, "ranks", None)
    if n is None:
        if getattr(args, "dry_run", False):
            raise SpmdsimError(DRY_RUN_NEEDS_RANKS)
        from ...runtime.mpi_library import load_mpi

        comm = load_mpi().COMM_WORLD
        code = fn(comm)
        if comm.Get_size() == 1 and code == 0:  # a PASS with nothing split: said after it, on stderr
            print(ONE_PROCESS, file=sys.stderr, flush=True)
        return code
    problem = ranks_problem(n, bool(getattr(args, "dry_run", False)))
    if problem:
        raise SpmdsimError(problem)
    if getattr(args, "dry_run", False) and getattr(args, "explain", False):
        raise SpmdsimError(DRY_RUN_EXPLAINS_NOTHING)
    if check is not None and launcher_size() == 1:  # under mpiexec, run_on_ranks refuses --ranks itself first
        check(n)
    return run_on_ranks(n, lambda: fn(world()), dry_run=args.dry_run, as_json=getattr(args, "json", False),
                        dry_codes=dry_codes)


#: A command run as one plain process: every check passes on one rank, where nothing is split or sent.
ONE_PROCESS = "spmdsim: that ran on 1 rank: nothing was split or sent; add --ranks 8 or use mpiexec -n 8"

#: --explain beside --dry-run: a dry run prints its bytes table in place of the program's output, so the per-rank
#: explanation would be built and thrown away, each rank's line naming every member of its group: O(ranks^2) text,
#: 317 s and 16.7 GB at 32,768 ranks for the table the dry run prints alone in 1.8 s.
DRY_RUN_EXPLAINS_NOTHING = ("--explain shows what each rank holds and which collectives it runs, from a run with "
                            "data; a dry run prints its table of bytes instead: leave out --explain (or --dry-run)")


def add_trace_out(parser: argparse.ArgumentParser) -> None:
    """--trace-out FILE (run, run redistribute, demo)."""
    parser.add_argument("--trace-out", metavar="FILE",
                        help="write a Chrome trace-event JSON file (one track per rank: local compute "
                             "and each collective with its bytes) to open in ui.perfetto.dev")


def check_trace_out(args: argparse.Namespace) -> None:
    """Refuse an unwritable --trace-out before any work (the same error on every rank)."""
    if getattr(args, "trace_out", None) is not None:
        check_output_file(args.trace_out, "--trace-out")


def guarded(fn: Callable[[], int], comm: Any, args: argparse.Namespace | None = None) -> int:
    """Run `fn` so that an error on some ranks only ends the job instead of hanging it.

    With `args`, their --check/--watchdog are applied first, inside the guard, so
    a bad value raises the same one-line error on every rank.
    """
    from ...runtime.guard import run_guarded  # (signal handling: not loaded for --help)

    def body() -> int:
        if args is not None:
            configure_from_args(args)
        return fn()

    return run_guarded(body, comm)


def check_watchdog(args: argparse.Namespace) -> None:
    """Refuse a bad --watchdog before the banner (configure_from_args repeats it on every rank)."""
    if getattr(args, "watchdog", None) is not None:
        watchdog_setting(args.watchdog, "--watchdog")


#: Largest --seed + 1: each generated tensor takes a seed of its own above --seed (seed + 1, seed + 2, ...), and
#: every one must stay below 2**63 (SeededTensor's range); past it a --seed near 2**63 would be refused naming a
#: seed the user never typed ("seed 9223372036854775808 must be ...").
SEED_LIMIT = 2 ** 62


def check_seed(args: argparse.Namespace) -> None:
    """Refuse a --seed outside [0, SEED_LIMIT), naming the flag (before any tensor is made)."""
    seed = getattr(args, "seed", None)
    if seed is not None and not 0 <= seed < SEED_LIMIT:
        raise SpmdsimError(f"--seed {seed} must be an integer in [0, 2**62)")


def check_ranks(layout: Layout, what: str, ranks: int | None) -> None:
    """Refuse a device matrix (`what`: its flag and value) of another device count than --ranks `ranks`."""
    if ranks is not None and layout.num_devices != ranks:
        said = f"{what} has {counted(layout.num_devices, 'device')} but --ranks is {ranks}"
        raise with_expected_ranks(RankCountError(said, layout.num_devices, ranks))


def with_expected_ranks(exc: RankCountError) -> RankCountError:
    """`exc`, a rank count other than --ranks gives, naming the --ranks its numbers fit ("expected --ranks 8")."""
    return exc.with_ways(f"; expected --ranks {exc.wanted()}")
