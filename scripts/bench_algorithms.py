#!/usr/bin/env python
"""Every emulated collective algorithm next to MPI's built-in collective and the cost model.

    timeout -k 5 900 mpiexec -n 8 python scripts/bench_algorithms.py
    timeout -k 5 300 mpiexec -n 4 python scripts/bench_algorithms.py --sizes 64K --json

For each algorithm and message size (64 KiB, 1 MiB, 8 MiB by default; the
buffer of each rank, the gathered result for allgather, as the cost model
counts it) the algorithm (spmdsim.runtime.algorithms, point-to-point rounds)
and MPI's own collective run alternately on the same float32 input, each
after a barrier; a time is the median over --repeats of the slowest rank.
The table gives the rounds, the busiest rank's bytes sent and whether they
equal the textbook formula, both times, the cost model's prediction for the
schedule's rounds and bytes (the saved calibration, else the built-in model),
and whether the results match. Both sides wait as `spmdsim launch` would
(polite when ranks outnumber cores).
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import json  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_args import ArgumentParser, byte_sizes, int_at_least  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

SIZES = "64K,1M,8M"


def parse_args(argv=None):
    from spmdsim.programs.algorithms import NAMES

    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=byte_sizes(64), default=SIZES,
                        help=f"message sizes in bytes (default {SIZES})")
    parser.add_argument("--repeats", type=int_at_least(1), default=5, help="timed runs per case (default 5)")
    parser.add_argument("--algorithms", default=",".join(NAMES),
                        help="comma list of algorithm names (default all)")
    parser.add_argument("--json", action="store_true", help="print one JSON list instead of the table")
    args = parser.parse_args(argv)
    if isinstance(args.sizes, str):
        args.sizes = byte_sizes(64)(args.sizes)
    names = [n.strip() for n in args.algorithms.split(",")]
    unknown = [n for n in names if n not in NAMES]
    if unknown or not names:
        parser.error(f"--algorithms: unknown algorithm {unknown[0] if unknown else ''!r}; "
                     f"expected names from: {', '.join(NAMES)}")
    args.names = names
    return args


def measure(comm, names, sizes, repeats):
    """One row per (algorithm, size): the schedule's figures and the timed comparison."""
    import numpy as np

    from spmdsim.programs.algorithms import build, elements_for, parse_name
    from spmdsim.programs.algorithms.formulas import busiest_bytes_sent, predict_seconds
    from spmdsim.programs.cost import load_or_default
    from spmdsim.runtime.algorithms import compare_with_mpi

    model = load_or_default()
    p = comm.Get_size()
    rows = []
    for size in sizes:
        for name in names:
            collective, algorithm = parse_name(name)
            count = elements_for(collective, p, size, 4)
            schedule = build(collective, algorithm, p, count, 4)
            result = compare_with_mpi(comm, schedule, np.float32, repeats)
            sent = max(schedule.bytes_sent())
            rows.append({"algorithm": name, "size": size, "ranks": p, "rounds": len(schedule.rounds),
                         "bytes_sent_per_rank": sent,
                         "formula_bytes": busiest_bytes_sent(name, p, count * 4),
                         "seconds_emulated": result["seconds_emulated"], "seconds_mpi": result["seconds_mpi"],
                         "seconds_model": predict_seconds(schedule, model),
                         "matches_mpi": result["matches_mpi"], "wait_mode": result["wait_mode"]})
    return rows


def _size(n):
    return f"{n >> 20}M" if n >= 1 << 20 and not n % (1 << 20) else f"{n >> 10}K" if not n % 1024 else str(n)


def table(rows):
    """The rows as text (fits 100 columns)."""
    first = rows[0]
    lines = [f"collective algorithms on {first['ranks']} ranks ({first['wait_mode']} wait), float32; "
             "ms = median of the slowest rank",
             f"{'algorithm':<33}{'size':>5}{'rounds':>7}{'sent/rank B':>13}{'=formula':>9}"
             f"{'emulated':>10}{'MPI':>8}{'model':>8}{'same':>6}"]
    for r in rows:
        lines.append(f"{r['algorithm']:<33}{_size(r['size']):>5}{r['rounds']:>7}{r['bytes_sent_per_rank']:>13,}"
                     f"{'yes' if r['bytes_sent_per_rank'] == r['formula_bytes'] else 'NO':>9}"
                     f"{r['seconds_emulated'] * 1e3:>10.3f}{r['seconds_mpi'] * 1e3:>8.3f}"
                     f"{r['seconds_model'] * 1e3:>8.3f}{'yes' if r['matches_mpi'] else 'NO':>6}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    from mpi4py import MPI

    from spmdsim.runtime.guard import run_guarded

    comm = MPI.COMM_WORLD

    def body() -> int:
        rows = measure(comm, args.names, args.sizes, args.repeats)
        if comm.Get_rank() == 0:
            print(json.dumps(rows) if args.json else table(rows))
        return 0 if all(r["matches_mpi"] for r in rows) else 1

    return run_guarded(body, comm)


if __name__ == "__main__":
    sys.exit(run_script(main))
