"""`spmdsim collective NAME`: run one collective algorithm step by step and check it against MPI's.

    mpiexec -n 8 spmdsim collective ring-allreduce --size 1M --show
    mpiexec -n 4 spmdsim collective bruck-alltoall --size 64K --json
    mpiexec -n 4 spmdsim collective ring-allreduce --size 64K --png rounds/

Every rank makes its own input (values in [-1, 1), integers for int dtypes),
runs the algorithm over point-to-point messages (spmdsim.runtime.algorithms)
and MPI's built-in collective on the same input, compares the results and
times both. Rank 0 prints the report; --show adds the rounds table and what
every rank holds after each round.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from ...programs.algorithms import NAMES, build, elements_for, parse_name
from ...errors import SpmdsimError
from ...base.threads import launcher_size
from ...programs.algorithms.formulas import FORMULAS, busiest_bytes_sent, predict_seconds, round_count
from ...runtime.debug import add_cli_arguments, configure_from_args
from ...runtime.engines import world
from .calibrate import byte_count
from ...programs.viz.png import require_matplotlib
from .paths import check_output_dir
from ...programs.algorithms.picture import check_picture_ranks, render_rounds_png
from .common import guarded
from ...runtime.sim.launch import note_mpiexec_flags
from ...programs.cost import DEFAULT_MODEL, load_or_default
from ...programs.algorithms.table import format_rounds, format_states
from ...programs.viz.table import wrap_lines

__all__ = ["register", "run", "report", "to_json", "MAX_SIZE"]

#: Largest --size: each rank holds about four buffers of it (p of them for allgather).
MAX_SIZE = 64 << 20
#: The most messages (rounds x ranks x --repeat) a run on simulated ranks sends: about 50 us each on a loaded core
#: (ring-allreduce of 4K on 400 ranks: 319,200 messages in 17 s), so under half a minute.
MAX_SIMULATED_MESSAGES = 500_000
_BUILTIN = {"allreduce": "Allreduce", "allgather": "Allgather", "reduce_scatter": "Reduce_scatter_block",
            "alltoall": "Alltoall", "bcast": "Bcast"}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "collective", help="run a collective algorithm round by round and check it against MPI's",
        description="Run one collective algorithm (ring, recursive doubling/halving, Rabenseifner, "
                    "Bruck, pairwise, binomial tree, scatter+allgather) over point-to-point "
                    "messages on every rank, compare its result with MPI's own collective, and "
                    "print its rounds, bytes per rank against the textbook formula, and times "
                    "next to MPI's and the cost model's. Launch with mpiexec -n N (N >= 2). "
                    f"Algorithms: {', '.join(NAMES)}.")
    parser.add_argument("name", metavar="NAME", help="the algorithm, e.g. ring-allreduce (any case: Ring-AllReduce)")
    parser.add_argument("--size", default="1M",
                        help="message size in bytes, e.g. 64K, 1M, 8M (default 1M): each rank's buffer; "
                             "for allgather the gathered result (each rank gives size/p)")
    parser.add_argument("--dtype", choices=("float32", "float64", "int32", "int64"), default="float32",
                        help="element type (default float32)")
    # None: not given (the root is 0), so that a --root given to an algorithm without one is refused.
    parser.add_argument("--root", type=int, default=None, help="the bcast root (default 0; bcast algorithms only)")
    parser.add_argument("--ranks", type=int, default=None, metavar="N",
                        help="run on N simulated ranks in this process instead of MPI ranks "
                             "(compared with the simulated ranks' own collective)")
    note_mpiexec_flags(parser)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs; the median is shown (default 3)")
    parser.add_argument("--show", action="store_true",
                        help="print every round as a table and what each rank holds after it (not with --json)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--png", metavar="DIR",
                        help="draw each round into DIR (round_NN.png, rounds.png; up to 16 ranks; needs the "
                             "'plot' extra)")
    add_cli_arguments(parser)
    parser.set_defaults(func=run)


def parse_size(text: str) -> int:
    """'64K' -> 65536 bytes; SpmdsimError naming the flag otherwise (a negative size and 0 alike: one range)."""
    try:
        size = byte_count(text)
    except argparse.ArgumentTypeError as exc:
        raise SpmdsimError(f"--size: {exc}") from None
    if not 0 < size <= MAX_SIZE:
        raise SpmdsimError(f"--size {text!r} must be between 1 byte and {MAX_SIZE >> 20}M, such as 64K or 1M")
    return size


def _check_args(args: argparse.Namespace, p: int) -> tuple[str, str, int, int]:
    """(collective, algorithm, element count, root) on `p` ranks, or the SpmdsimError every rank raises alike,
    before any MPI (and with --ranks, before the banner, so that a bad --root is not refused after it)."""
    import numpy as np

    collective, algorithm = parse_name(args.name)
    args.name = f"{algorithm}-{collective.replace('_', '-')}"  # as the output names it ("Ring-Allreduce" taken)
    size = parse_size(args.size)
    if args.repeat < 1:
        raise SpmdsimError(f"--repeat {args.repeat!r} must be at least 1")
    # An option given that this run would not use is refused, not silently dropped.
    if args.root is not None and collective != "bcast":
        rooted = ", ".join(n for n in NAMES if parse_name(n)[0] == "bcast")
        raise SpmdsimError(f"--root {args.root!r} applies only to the bcast algorithms ({rooted}); "
                           f"{args.name} has no root: leave out --root")
    if args.show and args.json:
        raise SpmdsimError("--show prints the rounds as tables, which --json replaces (its record lists each "
                           "round's transfers): give one of them")
    if args.png is not None:
        require_matplotlib()  # one line naming the extra when matplotlib is missing
        check_output_dir(args.png, "--png")
    if p < 2:
        raise SpmdsimError("spmdsim collective needs at least 2 ranks: mpiexec -n N, or --ranks N")
    if args.png is not None:
        check_picture_ranks(p, f"--png {args.png!r}: the pictures")  # before the run, not hours into drawing
    try:
        count = elements_for(collective, p, size, np.dtype(args.dtype).itemsize)
    except SpmdsimError as exc:
        raise SpmdsimError(f"--size {args.size!r}: {exc}") from None
    root = 0 if args.root is None else args.root
    if not 0 <= root < p:
        raise SpmdsimError(f"--root {root!r} must be a rank (0 <= root < {p})")
    return collective, algorithm, count, root


def run(args: argparse.Namespace) -> int:
    if args.ranks is not None:
        return _simulated(args)
    from ...runtime.mpi_library import load_mpi
    comm = load_mpi().COMM_WORLD
    return guarded(lambda: _execute(args, comm), comm, args)


def _simulated(args: argparse.Namespace) -> int:
    """--ranks N: every rank a thread of this process (spmdsim.runtime.sim); the report says so first."""
    from ...runtime.sim.launch import run_on_ranks

    if isinstance(args.ranks, bool) or not 2 <= args.ranks <= 1024:
        raise SpmdsimError(f"--ranks {args.ranks!r} must be between 2 and 1024")
    if launcher_size() == 1:  # under mpiexec, run_on_ranks refuses --ranks itself first
        _check_args(args, args.ranks)  # before the banner and the threads: one error line, alone
        _check_messages(args.name, args.ranks, args.repeat)
    configure_from_args(args)
    # The same launcher as every --ranks: its banner first (stderr with --json), errors by rank.
    return run_on_ranks(args.ranks, lambda: _execute(args, world()), as_json=args.json)


def _check_messages(name: str, p: int, repeat: int) -> None:
    """Refuse a run on `p` simulated ranks of more than MAX_SIMULATED_MESSAGES messages, before the schedule is
    built: a ring's rounds grow with p, each of p messages (ring-allreduce on 1,000 ranks would run for minutes)."""
    rounds = round_count(name, p)
    messages = rounds * p * repeat
    if messages > MAX_SIMULATED_MESSAGES:
        runs = "once" if repeat == 1 else f"{repeat} times (--repeat)"
        raise SpmdsimError(f"{name} on --ranks {p} sends up to {messages:,} messages ({rounds:,} rounds "
                           f"of up to {p:,}, {runs}); expected at most {MAX_SIMULATED_MESSAGES:,} on "
                           "simulated ranks (about 50 us each on one core): fewer --ranks or --repeat, or MPI "
                           "ranks (mpiexec -n N)")


def _execute(args: argparse.Namespace, comm: Any) -> int:
    import numpy as np

    from ...runtime.algorithms import compare_with_mpi

    p = comm.Get_size()
    collective, algorithm, count, root = _check_args(args, p)  # inside the guard: rank 0 prints one line
    dtype = np.dtype(args.dtype)
    schedule = build(collective, algorithm, p, count, dtype.itemsize, root)
    result = compare_with_mpi(comm, schedule, dtype, args.repeat)
    if comm.Get_rank() == 0:
        print(json.dumps(to_json(schedule, result)) if args.json else report(schedule, result, args.show))
        if args.png:
            paths = render_rounds_png(schedule, args.png)
            if not args.json:
                print(f"wrote {len(paths)} pictures to {args.png} (all rounds: {paths[-1]})")
    return 0 if result["matches_mpi"] else 1


def _predicted(schedule: Any) -> tuple[float | None, str]:
    """The cost model's seconds for the schedule's rounds and bytes, and where the model came from."""
    try:
        model = load_or_default()
    except (SpmdsimError, OSError) as exc:
        return None, f"unavailable, {exc}"
    origin = ("the built-in model; `spmdsim calibrate` fits this machine's" if model is DEFAULT_MODEL
              else "this machine's calibration")
    return predict_seconds(schedule, model), origin


def _phases(schedule: Any) -> str:
    counts: dict[str, int] = {}
    for rnd in schedule.rounds:
        phase = rnd.phase.split(" ")[0]
        counts[phase] = counts.get(phase, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def _cut_text(schedule: Any) -> str:
    """How the buffer is cut. Recursive doubling and the trees send the whole buffer as one slot:
    say so, rather than "cut into 1 slots" (exercise 12 of docs/tutorials/lab-part2.md reads this line)."""
    n = len(schedule.slot_counts)
    return "cut into {:,} slots".format(n) if n > 1 else "sent whole (one slot, not cut)"


def report(schedule: Any, result: dict, show: bool = False) -> str:
    """The text report: bytes against the formula, the check against MPI, times; with `show` the rounds."""
    p, me_bytes = schedule.group_size, schedule.input_count(schedule.root) * schedule.itemsize
    elements = me_bytes // schedule.itemsize
    sent = max(schedule.bytes_sent())
    formula = busiest_bytes_sent(schedule.name, p, me_bytes)
    builtin = _BUILTIN[schedule.collective]
    library = "the simulated ranks'" if result.get("simulated") else "MPI's"
    gathered = f", {me_bytes * p:,} B gathered" if schedule.collective == "allgather" else ""
    lines = [f"{schedule.name} on {p} ranks: {me_bytes:,} B from each rank{gathered}",
             f"  {elements:,} element{'s' if elements != 1 else ''} of {schedule.itemsize} B, {_cut_text(schedule)}",
             f"rounds: {len(schedule.rounds)} ({_phases(schedule)})",
             f"bytes sent by the busiest rank: {sent:,} B; textbook {formula:,} B "
             f"({'equal' if sent == formula else 'the buffer does not divide evenly into slots'})",
             f"  formula: {FORMULAS[schedule.name][0]} (n: bytes from each rank)"]
    verdict = "matches" if result["matches_mpi"] else "DIFFERS FROM"
    summed = schedule.collective in ("allreduce", "reduce_scatter")  # "rounded": a float sum, within its rounding
    why = ("" if not summed else ": integer sums, exact in any order" if not result.get("rounded", True) else
           ": sums in another order" if result["max_abs_difference"] else "")  # (a difference of 0 needs none)
    lines.append(f"result: {verdict} {library} {builtin} (max abs difference {result['max_abs_difference']:.3g}{why})")
    seconds, origin = _predicted(schedule)
    model = f", cost model {seconds * 1e3:.3f} ms" if seconds is not None else ""
    lines.append(f"time (slowest rank, median, {result['wait_mode']} wait): emulated "
                 f"{result['seconds_emulated'] * 1e3:.3f} ms, {'built-in' if result.get('simulated') else 'MPI'} "
                 f"{result['seconds_mpi'] * 1e3:.3f} ms" + model)
    lines.append(f"cost model: {origin}")
    lines = wrap_lines(lines)  # a Reduce_scatter_block's result line ran to 110 columns
    if show:
        lines += ["", format_rounds(schedule, result["round_seconds"]), "", format_states(schedule)]
    return "\n".join(lines)


def to_json(schedule: Any, result: dict) -> dict:
    """The --json record: rounds with their transfers and times, bytes, the check and the times."""
    n = schedule.input_count(schedule.root) * schedule.itemsize
    rounds = [{"round": i + 1, "phase": rnd.phase, "seconds_max": result["round_seconds"][i],
               "transfers": [{"src": t.src, "dst": t.dst, "slots": list(t.piece), "reduce": t.reduce,
                              "bytes": schedule.slot_bytes(t.piece)} for t in rnd.transfers]}
              for i, rnd in enumerate(schedule.rounds)]
    seconds, _ = _predicted(schedule)
    return {
        "algorithm": schedule.name, "collective": schedule.collective, "ranks": schedule.group_size,
        "bytes_per_rank": n, "slot_counts": list(schedule.slot_counts), "rounds": rounds,
        "bytes_sent_per_rank": max(schedule.bytes_sent()),
        "bytes_sent_by_rank": list(schedule.bytes_sent()),
        "bytes_received_by_rank": list(schedule.bytes_received()),
        "formula": FORMULAS[schedule.name][0],
        "formula_bytes": busiest_bytes_sent(schedule.name, schedule.group_size, n),
        "matches_mpi": result["matches_mpi"], "max_abs_difference": result["max_abs_difference"],
        "seconds_emulated": result["seconds_emulated"], "seconds_mpi": result["seconds_mpi"],
        "seconds_model": seconds, "wait_mode": result["wait_mode"],
        "simulated": bool(result.get("simulated")),
    }
