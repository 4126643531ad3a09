"""`spmdsim demo`: run every registered scenario under MPI and print one summary table.

    mpiexec -n 8 spmdsim demo            # table on rank 0
    mpiexec -n 8 spmdsim demo --json     # list of records instead
    mpiexec -n 4 spmdsim demo            # scenarios that need 8 ranks are listed as SKIP
    spmdsim demo --ranks 8               # 8 simulated ranks in this process, no mpiexec

Exit codes: 0 every scenario that ran passed and at least half of those chosen
ran; 1 a scenario failed; 2 bad input (an unknown --only name, ...); 3 every
scenario was skipped, or fewer than half ran (the world size does not fit
them: one line on stderr says which size does).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from ...errors import SpmdsimError, fold_message
from ...base.suggest import did_you_mean_each
from ...base.validate import counted
from .common import add_common_arguments, add_trace_out, check_seed, check_trace_out, check_watchdog, guarded, on_world
from ..demo.registry import Context, run_scenario, scenarios
from ...programs.viz.table import fold_cell, fold_table, nbytes, WIDTH, wrap_lines

__all__ = ["register", "run", "format_table", "coverage", "TOO_FEW_RAN"]

#: Exit code of a demo in which every scenario was skipped, or fewer than half ran.
TOO_FEW_RAN = 3


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo", help="run the scenarios of MindSpore's, OneFlow's and Paddle's docs, each checked",
        description="Run the scenarios of the source documents (MindSpore MatMul strategies and Layout tuples, "
                    "Paddle split / Megatron layers, the fused MLP) on generated data, each "
                    "checked against its numpy reference.",
    )
    add_common_arguments(parser)
    parser.add_argument("--json", action="store_true",
                        help="print a JSON list of records (scenario, passed, max_abs_error, "
                             "collectives, bytes_sent_per_rank)")
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="run only these scenarios (names as --list shows them, space- or comma-separated)")
    parser.add_argument("--list", action="store_true",
                        help="list the scenarios (those --only names) and exit; with --json, as a JSON list of "
                             "records (scenario, title)")
    parser.add_argument("--wide", action="store_true",
                        help="add the layouts column and keep each row on one line (wider than 100 columns); "
                             "with --list, each title on one line")
    add_trace_out(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    chosen = scenarios()
    if args.list:  # --only narrows the list (an unknown name refused as when running), --json makes it JSON
        listed = _only(chosen, args.only)
        if args.json:
            print(json.dumps([{"scenario": sc.name, "title": sc.title} for sc in listed], indent=1))
            return 0
        name_width = max(22, max(len(sc.name) for sc in listed))
        for sc in listed:  # a long title folds under itself, unless --wide
            lines = [sc.title] if args.wide else fold_cell(sc.title, WIDTH - name_width - 1)
            print(f"{sc.name:<{name_width}} {lines[0]}")
            for line in lines[1:]:
                print(f"{'':<{name_width}} {line}")
        return 0
    # Inside the guard: an unknown name is the same error on every rank, printed once; with --ranks (one
    # process) the checks also run before the banner, so that a bad value is the only line.
    # A dry run's coverage is known from the rank count alone: its 3 is passed on, as without --dry-run.
    return on_world(args, lambda comm: guarded(lambda: _run_all(_only(chosen, args.only), args, comm),
                                               comm, args), lambda n: _check(chosen, args), dry_codes=(TOO_FEW_RAN,))


def _check(chosen: Sequence[Any], args: argparse.Namespace) -> None:
    """The command line's checks that need no communicator (_run_all repeats them on every rank)."""
    _only(chosen, args.only)
    check_watchdog(args)
    check_trace_out(args)
    check_seed(args)


def _only(chosen: Sequence[Any], names: Sequence[str] | None) -> tuple[Any, ...]:
    """The scenarios `--only` names (space- or comma-separated), in registry order."""
    if not names:
        return tuple(chosen)
    wanted = [n for name in names for n in name.split(",") if n]
    known = {sc.name for sc in chosen}
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise SpmdsimError(f"unknown scenario(s) {unknown or names!r}{_hint(unknown, sorted(known))}; "
                           f"expected some of {sorted(known)!r}")
    return tuple(sc for sc in chosen if sc.name in wanted)


def _hint(unknown: Sequence[str], known: Sequence[str]) -> str:
    """`` (did you mean 'mlp'?)`` after the unknown scenario names (each's named when there are several), or ""."""
    hint = did_you_mean_each(list(unknown), known)
    return f" ({hint})" if hint else ""


def _run_all(chosen: Sequence[Any], args: argparse.Namespace, comm: Any) -> int:
    check_trace_out(args)
    check_seed(args)
    ctx = Context(comm, args.dtype, args.seed)
    if args.trace_out:
        outcomes = _run_traced(chosen, ctx, args.trace_out)
    else:
        outcomes = [run_scenario(sc, ctx) for sc in chosen]
    if comm.Get_rank() == 0:
        if args.json:
            print(json.dumps([o.record() for o in outcomes], indent=1))
        else:
            print(format_table(outcomes, comm.Get_size(), args.dtype, args.wide))
    # A dry run makes no check (no values): its verdicts say nothing, and what ran or was skipped is all it tells.
    if not getattr(args, "dry_run", False) and not all(o.passed for o in outcomes):
        return 1
    reason = coverage(outcomes, comm.Get_size(), chosen)
    if reason:
        if comm.Get_rank() == 0:
            print(fold_message(f"spmdsim demo: {reason}"), file=sys.stderr)
        return TOO_FEW_RAN
    return 0


def coverage(outcomes: Sequence[Any], world_size: int, chosen: Sequence[Any] = ()) -> str:
    """Why a demo that failed nothing still proves too little: "" when at least half ran.

    A pass in which every scenario was skipped checked nothing. With `chosen`
    (the scenarios), the reason names a world size that runs them all: the next at or above this one, else
    the smallest from 2 (1 only when no other does).
    """
    ran = sum(1 for o in outcomes if not o.skipped)
    if outcomes and 2 * ran >= len(outcomes):
        return ""
    what = "every scenario was skipped" if not ran else "fewer than half the scenarios ran"
    text = f"{what} ({ran} of {len(outcomes)} ran on {counted(world_size, 'rank')})"
    # The next count at or above this one, else the smallest from 2: 1 rank runs Paddle's split too, splitting nothing.
    nearest = [*range(max(world_size, 2), 1025), *range(2, min(world_size, 1025)), 1]
    fits = next((w for w in nearest if chosen and all(sc.needs(w) is None for sc in chosen)), None)
    if fits is not None:
        text += f"; {fits} run them all (mpiexec -n {fits}, or --ranks {fits})"
    return text


def _run_traced(chosen: Sequence[Any], ctx: Any, path: str) -> list[Any]:
    """Run the scenarios under one trace and write it, each scenario a named span per rank."""
    from time import perf_counter

    from ...runtime import collect_trace
    from ...runtime.trace_export import write_chrome_trace

    outcomes, spans = [], []
    with collect_trace() as trace:
        for sc in chosen:
            began = perf_counter()
            outcomes.append(run_scenario(sc, ctx))
            if not outcomes[-1].skipped:
                spans.append((sc.name, began, perf_counter()))
    start, end = (spans[0][1], spans[-1][2]) if spans else (None, None)
    write_chrome_trace(ctx.comm, trace, path, start, end, spans)
    return outcomes


def format_table(outcomes: Sequence[Any], world_size: int, dtype: str, wide: bool = False) -> str:
    """The summary table: op, collectives, bytes sent per rank, max error, result.

    Fits 100 columns (long cells fold onto more lines, skip reasons go below the
    table); `wide` adds the layouts column and keeps every row on one line.
    """
    head = ("scenario", "op") + (("layouts",) if wide else ()) + (
        "collectives", "sent/rank", "max error", "result")
    rows, reasons = [], []
    for o in outcomes:
        layouts = (o.layouts,) if wide else ()
        if o.skipped:
            rows.append((o.scenario, o.op) + layouts + ("-", "-", "-", "SKIP"))
            reasons.append(f"  {o.scenario}: {o.skipped}")
            continue
        colls = ", ".join(f"{op} x{n}" for op, n in sorted(o.collectives.items())) or "none"
        rows.append((o.scenario, o.op) + layouts + (colls, nbytes(o.bytes_sent_per_rank),
                     f"{o.max_abs_error:.2e}", "PASS" if o.passed else "FAIL"))
    right = (len(head) - 3,)
    lines = [f"spmdsim demo: {counted(world_size, 'rank')}, {dtype}"]
    lines += fold_table(head, rows, width=None if wide else 100, right=right, keep=(0,))
    passed = sum(1 for o in outcomes if o.passed and not o.skipped)
    skipped = sum(1 for o in outcomes if o.skipped)
    failed = len(outcomes) - passed - skipped
    if reasons:
        lines.append("skipped at this rank count:")
        lines += reasons if wide else wrap_lines(reasons)
    lines.append(f"{passed} passed, {failed} failed, {skipped} skipped")
    return "\n".join(lines)
