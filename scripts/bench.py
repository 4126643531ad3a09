#!/usr/bin/env python
"""Benchmark spmdsim against raw mpi4py and single-process numpy, interleaved.

Run under MPI (8 ranks is the reference setup); every mpiexec under a timeout:

    timeout -k 5 120 mpiexec -n 8 python scripts/bench.py --quick
    timeout -k 5 900 mpiexec -n 8 python scripts/bench.py --json bench.json
    timeout -k 5 600 mpiexec -n 8 python scripts/bench.py --suite ops --repeats 9

Suites: ``collectives`` (each runtime collective), ``redistribute`` (the executor's
redistributions, one per kind of plan step) and ``ops`` (MatMul, column/row
Linear, the fused MLP, vocab-parallel Embedding). Every case runs three
contenders in turn, in a rotating order, after a barrier: spmdsim, raw mpi4py
(the same collectives on preallocated buffers of the same sizes; for ops the
same local numpy work too; its buffers placed in the page as spmdsim places
its own, spmdsim.base.buffers) and numpy in one process (rank 0 alone, the whole
op). A time is the median over repeats (after warm-up) of the slowest rank.
``comm`` columns are the time inside collectives (spmdsim's trace; the raw
code's own timers); ``model`` is spmdsim.programs.cost's prediction for those calls.
Peak RSS is VmHWM (spmdsim.programs.memory.peak_rss), the largest over ranks, so far in the run.

``--aa`` is the A/A control: every case is built twice and the spmdsim slot
runs the second copy's raw code, with its own buffers, against the first's.
Its ratios are what the harness and buffer placement alone make of identical
code: a spmdsim ratio inside that spread is not spmdsim's doing.
"""
from __future__ import annotations

import os

# One BLAS thread per rank: 8 ranks already oversubscribe the cores.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Any, Optional  # noqa: E402

from spmdsim.tools.cli.calibrate import parse_size  # noqa: E402
from spmdsim.tools.cli.collective_timing import Waiter  # noqa: E402
from spmdsim.programs.cost import CostModel, load_or_default, predict_plan  # noqa: E402
from spmdsim.errors import RuntimeMismatchError, SpmdsimError  # noqa: E402
from spmdsim.runtime.guard import run_guarded  # noqa: E402

# The shared argument types live beside this file (on sys.path when the script runs;
# added for imports of this file by path, as the tests do).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_args import (ArgumentParser, byte_sizes, existing_file, int_at_least,  # noqa: E402
                         output_path)
from _bench_comm_cases import collective_cases, redistribute_cases  # noqa: E402
from _bench_harness import Case, peak_rss, run_case, size_text  # noqa: E402
from _bench_op_cases import op_cases  # noqa: E402
from _bench_overhead import overhead_records, overhead_table  # noqa: E402
from spmdsim.base.threads import blas_kernels_text  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

SUITES = ("collectives", "redistribute", "ops", "overhead")
KEYS = ("name", "bytes_per_rank", "spmdsim_s", "raw_s", "numpy_s", "ratio_vs_raw", "peak_rss_bytes")


# -- driver ---------------------------------------------------------------------------------
FULL = dict(coll_sizes="64K,1M,8M", redist_shape=(4096, 1024), matmul=2048, batch=64,
            hidden=1024, ffn=4096, vocab=32000, emb_dim=1024, tokens=2048, repeats=7, warmup=2)
QUICK = dict(coll_sizes="16K", redist_shape=(256, 64), matmul=256, batch=8, hidden=128, ffn=512,
             vocab=1000, emb_dim=64, tokens=64, repeats=2, warmup=1)


def predicted_s(entries: list, model: CostModel) -> float:
    return sum(p.seconds for p in predict_plan(entries, model)) if entries else 0.0


def table(records: list[dict]) -> str:
    head = (f"{'case':<44}{'bytes/rk':>9}{'spmdsim':>9}{'raw':>9}{'numpy':>9}{'ratio':>7}"
            f"{'comm':>9}{'rawcomm':>9}{'cratio':>7}{'rawarr':>9}{'model':>9}{'RSS MiB':>8}")
    lines = [head, "-" * len(head)]
    ms = lambda v: "-" if v is None else f"{v * 1e3:.2f}"  # noqa: E731
    rt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for r in records:
        lines.append(
            f"{r['name'][:43]:<44}{size_text(r['bytes_per_rank']):>9}{ms(r['spmdsim_s']):>9}"
            f"{ms(r['raw_s']):>9}{ms(r['numpy_s']):>9}{rt(r['ratio_vs_raw']):>7}"
            f"{ms(r['spmdsim_comm_s']):>9}{ms(r['raw_comm_s']):>9}{rt(r['comm_ratio_vs_raw']):>7}"
            f"{ms(r.get('raw_comm_after_arrival_s')):>9}"
            f"{ms(r['predicted_comm_s']):>9}{r['peak_rss_bytes'] / 2**20:>8.0f}")
    lines.append("times in ms: median over repeats of the slowest rank; comm = time inside "
                 "collectives; rawarr = raw comm after the last rank arrived (no load-imbalance "
                 "wait); model = spmdsim.programs.cost prediction of those collectives")
    return "\n".join(lines)


def split_table(records: list[dict]) -> str:
    """Where each call's time goes, spmdsim beside raw mpi4py: each rank's Python from the call to its first
    collective (`before`) and from its last collective to the return (`after`), medians over ranks and
    repeats, and the time in collectives between (`comm`, the slowest rank's): a regression shows where it
    is. Python before the call delays the whole group at several ranks to a core; Python after it, the rank."""
    us = lambda v: "-" if v is None else f"{v * 1e6:.1f}"  # noqa: E731
    head = f"{'case':<44}{'before':>9}{'raw':>9}{'comm':>10}{'raw':>10}{'after':>9}{'raw':>9}"
    lines = [head, "-" * len(head)]
    for r in records:
        lines.append(f"{r['name'][:43]:<44}{us(r.get('spmdsim_before_s')):>9}{us(r.get('raw_before_s')):>9}"
                     f"{us(r['spmdsim_comm_s']):>10}{us(r['raw_comm_s']):>10}"
                     f"{us(r.get('spmdsim_after_s')):>9}{us(r.get('raw_after_s')):>9}")
    lines.append("per-call split in us, spmdsim then raw mpi4py: before = Python from the call to its first "
                 "collective, after = from its last collective to the return (median over ranks and repeats); "
                 "comm = time in collectives (median of the slowest rank)")
    return "\n".join(lines)


def suite_cases(suite: str, comm: Any, waiter: Waiter, cfg: dict, args: argparse.Namespace) -> list[Case]:
    """The cases of one timed suite, built now (buffers, meshes, seeded tensors)."""
    if suite == "collectives":
        sizes = args.sizes or [parse_size(s) for s in cfg["coll_sizes"].split(",")]
        return collective_cases(comm, waiter, waiter.mode, sizes, args.alloc)
    if suite == "redistribute":
        return redistribute_cases(comm, waiter, waiter.mode, cfg["redist_shape"])
    return op_cases(comm, waiter, waiter.mode, cfg)


def aa_case(first: Case, twin: Case) -> Case:
    """`first` with the spmdsim slot running `twin`'s raw code (the A/A control)."""
    if twin.name != first.name:
        raise SystemExit(f"bench: --aa built {twin.name!r} where {first.name!r} was expected")
    return Case(first.name, first.bytes_per_rank, twin.raw, first.raw, first.numpy,
                {**first.extra, "_trace": [], "aa": True})


def split_dims(suite: str, cfg: dict) -> tuple[int, ...]:
    """The sizes the suite's cases split over all ranks (the rank count must divide each)."""
    return {"redistribute": tuple(cfg["redist_shape"]),
            "ops": (cfg["matmul"], cfg["ffn"], cfg["vocab"])}.get(suite, ())


def check_world(suites: list[str], cfg: dict, world: int) -> None:
    """Refuse a rank count some suite cannot use, before any suite runs (not halfway through)."""
    for suite in suites:
        dims = split_dims(suite, cfg)
        if any(d % world for d in dims):
            raise RuntimeMismatchError(
                f"the {suite} suite cannot run on {world} ranks: it splits sizes {dims} "
                f"over all ranks; expected a rank count that divides {math.gcd(*dims)} "
                "(or leave the suite out with --suite)")


def _suite_list(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SUITES]
    if bad or not names:
        what = f"unknown suite {bad[0]!r}" if bad else f"{text!r} names no suite"
        raise argparse.ArgumentTypeError(f"{what}; expected a comma list of {', '.join(SUITES)}")
    return names


def _json_target(text: str) -> str:
    return text if text == "-" else output_path(text)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    """The command line, checked before MPI starts (a bad value: one message, exit 2 on every rank)."""
    p = ArgumentParser(
        description=__doc__,
        epilog="run under MPI with a timeout, e.g.: timeout -k 5 120 mpiexec -n 8 python "
               "scripts/bench.py --quick   |   timeout -k 5 900 mpiexec -n 8 python "
               "scripts/bench.py --json bench.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny sizes, few repeats (smoke test)")
    p.add_argument("--suite", type=_suite_list, default=",".join(SUITES[:3]),
                   help=f"comma list of {SUITES} (default: the first three)")
    p.add_argument("--loops", type=int_at_least(1), default=2000,
                   help="calls per timing in the overhead suite (default 2000)")
    p.add_argument("--profile", action="store_true",
                   help="overhead suite: also print a cProfile of the tiny-message loop")
    p.add_argument("--sizes", type=byte_sizes(1), default=None,
                   help="collective buffer sizes, e.g. 64K,1M,8M")
    p.add_argument("--repeats", type=int_at_least(1), default=None)
    p.add_argument("--warmup", type=int_at_least(0), default=None)
    p.add_argument("--wait", choices=("busy", "polite", "auto"), default=None,
                   help="wait mode of spmdsim's mesh and the raw code (default $SPMDSIM_WAIT/auto)")
    p.add_argument("--cost-file", type=existing_file, default=None,
                   help="cost model JSON (default: the saved calibration, else the built-in model)")
    p.add_argument("--alloc", action="store_true",
                   help="collectives suite: both sides allocate a fresh result per call "
                        "(default: both receive into the same preallocated buffers)")
    p.add_argument("--aa", action="store_true",
                   help="A/A control: the spmdsim slot runs a separately built copy of the raw code")
    p.add_argument("--json", type=_json_target, default=None,
                   help="write the records to this file ('-' = stdout)")
    p.add_argument("--filter", default=None,
                   help="only cases whose name contains this text (timed suites)")
    args = p.parse_args(argv)
    if args.filter and set(args.suite) == {"overhead"}:
        p.error(f"--filter {args.filter!r} selects cases of the timed suites; "
                "the overhead suite has none to select")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    """Parse before MPI starts, then run under spmdsim's guard (a failing rank ends the job)."""
    args = parse_args(argv)
    return run_guarded(lambda: run(args))


def run(args: argparse.Namespace) -> int:
    """The benchmark for parsed `args` (collective: every rank calls it)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    cfg = dict(QUICK if args.quick else FULL)
    repeats = args.repeats or cfg["repeats"]
    warmup = cfg["warmup"] if args.warmup is None else args.warmup
    suites = args.suite
    check_world(suites, cfg, comm.Get_size())
    # A named file must load (a missing one is an error, not the built-in model).
    model = CostModel.load(args.cost_file) if args.cost_file else load_or_default()
    waiter = Waiter(comm, args.wait)
    say = (lambda m: print(m, file=sys.stderr, flush=True)) if rank == 0 else (lambda m: None)
    say(f"bench: {comm.Get_size()} ranks, wait={waiter.mode}, repeats={repeats}, "
        f"warmup={warmup}, {blas_kernels_text()}, model {model}")
    if args.aa:
        say("bench: A/A control: the spmdsim columns time a second, separately built copy of the raw code")
    baseline = comm.allreduce(peak_rss(), op=MPI.MAX)
    records = []
    matched = 0  # timed cases that pass --filter (the same count on every rank)
    for suite in suites:
        say(f"bench: building {suite} cases")
        if suite == "overhead":
            recs = overhead_records(comm, waiter.mode, args.loops, args.profile)
            if rank == 0:
                print(overhead_table(recs))
            records.extend(recs)
            continue
        cases = suite_cases(suite, comm, waiter, cfg, args)
        if args.aa:
            # A second build of every case has its own buffers (and meshes); its
            # raw code takes the spmdsim slot.
            cases = [aa_case(first, twin) for first, twin in
                     zip(cases, suite_cases(suite, comm, waiter, cfg, args))]
        if args.filter:
            cases = [c for c in cases if args.filter in c.name]
            if not cases:
                say(f"bench: no {suite} case matches --filter {args.filter!r}")
        matched += len(cases)
        for i, case in enumerate(cases, 1):
            t0 = time.perf_counter()
            rec = run_case(comm, waiter, case, warmup, repeats)
            trace = rec.pop("_trace", [])
            # Ranks move different amounts (e.g. an exchange): the busiest rank counts.
            rec["predicted_comm_s"] = (None if args.aa else
                                       comm.allreduce(predicted_s(trace, model), op=MPI.MAX))
            rec["collectives"] = (None if args.aa else
                                  "+".join(e.op for e in trace if e.group_size > 1) or "none")
            rec["suite"] = suite
            records.append(rec)
            say(f"bench: [{suite} {i}/{len(cases)}] {case.name}: spmdsim "
                f"{rec['spmdsim_s'] * 1e3:.2f} ms, raw {rec['raw_s'] * 1e3:.2f} ms "
                f"({time.perf_counter() - t0:.1f} s)")
    if args.filter and not matched:
        timed_suites = [s for s in suites if s != "overhead"]
        raise SpmdsimError(f"no case matches --filter {args.filter!r} in the suites "
                           f"{', '.join(timed_suites)}; expected part of a case name")
    timed = [r for r in records if r.get("suite") != "overhead"]
    if rank == 0 and timed:
        print(table(timed))
        print(split_table(timed))
        if args.aa:
            print("A/A control: the spmdsim columns are a second copy of the raw code")
        print(f"interpreter baseline peak RSS {baseline / 2**20:.0f} MiB (max over ranks, at start)")
    if rank == 0 and args.json:  # the overhead suite's records too
        text = json.dumps(records, indent=1)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as fh:
                fh.write(text + "\n")
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
