"""`spmdsim demo`: run every registered scenario under MPI and print one summary table.

    mpiexec -n 8 spmdsim demo            # table on rank 0
    mpiexec -n 8 spmdsim demo --json     # list of records instead
    mpiexec -n 4 spmdsim demo            # scenarios that need 8 ranks are listed as SKIP
    spmdsim demo --ranks 8               # 8 simulated ranks in this process, no mpiexec

Exits 1 when any scenario fails.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from ..errors import SpmdsimError
from .run import add_common_arguments, guarded, on_world

__all__ = ["register", "run", "format_table"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="run every seed scenario under MPI and print a summary table",
        description="Run the seed scenarios (MindSpore MatMul strategies and Layout tuples, "
                    "Paddle split / Megatron layers, the fused MLP) on generated data, each "
                    "checked against its numpy reference.",
    )
    add_common_arguments(parser)
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list of records (scenario, passed, max_abs_error, "
                             "collectives, bytes_sent_per_rank)")
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="run only these scenarios (names as --list shows them, space- or comma-separated)")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..demo.registry import scenarios

    chosen = scenarios()
    if args.list:
        for sc in chosen:
            print(f"{sc.name:<22} {sc.title}")
        return 0
    # Inside the guard: an unknown name is the same error on every rank, printed once.
    return on_world(args, lambda comm: guarded(lambda: _run_all(_only(chosen, args.only), args, comm),
                                               comm, args))


def _only(chosen: Sequence[Any], names: Sequence[str] | None) -> tuple[Any, ...]:
    """The scenarios `--only` names (space- or comma-separated), in registry order."""
    if not names:
        return tuple(chosen)
    wanted = [n for name in names for n in name.split(",") if n]
    known = {sc.name for sc in chosen}
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise SpmdsimError(f"unknown scenario(s) {unknown or names!r}; expected some of {sorted(known)!r}")
    return tuple(sc for sc in chosen if sc.name in wanted)


def _run_all(chosen: Sequence[Any], args: argparse.Namespace, comm: Any) -> int:
    from ..demo.registry import Context, run_scenario

    ctx = Context(comm, args.dtype, args.seed)
    outcomes = [run_scenario(sc, ctx) for sc in chosen]
    if comm.Get_size() == 1 and comm.Get_rank() == 0:
        print("spmdsim demo: one process is one rank; run the scenarios with `timeout -k 5 600 mpiexec "
              "-n 8 spmdsim demo`, or on 8 simulated ranks in this process with `spmdsim demo --ranks 8`",
              file=sys.stderr)
    if comm.Get_rank() == 0:
        if args.json:
            print(json.dumps([o.record() for o in outcomes], indent=1))
        else:
            print(format_table(outcomes, comm.Get_size(), args.dtype))
    return 0 if all(o.passed for o in outcomes) else 1


def format_table(outcomes: Sequence[Any], world_size: int, dtype: str) -> str:
    """The summary table: op, layouts, collectives, bytes/rank, max error, result."""
    head = ("scenario", "op", "layouts", "collectives", "bytes/rank", "max error", "result")
    rows = []
    for o in outcomes:
        if o.skipped:
            rows.append((o.scenario, o.op, o.layouts, "-", "-", "-", f"SKIP ({o.skipped})"))
            continue
        colls = ", ".join(f"{op} x{n}" for op, n in sorted(o.collectives.items())) or "none"
        rows.append((o.scenario, o.op, o.layouts, colls, str(o.bytes_sent_per_rank),
                     f"{o.max_abs_error:.2e}", "PASS" if o.passed else "FAIL"))
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head) - 1)]
    lines = [f"spmdsim demo: {world_size} ranks, {dtype}"]
    for r in [head] + rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    passed = sum(1 for o in outcomes if o.passed and not o.skipped)
    skipped = sum(1 for o in outcomes if o.skipped)
    failed = len(outcomes) - passed - skipped
    lines.append(f"{passed} passed, {failed} failed, {skipped} skipped")
    return "\n".join(lines)
