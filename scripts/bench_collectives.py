#!/usr/bin/env python
"""spmdsim collectives vs the raw mpi4py calls, and the oversubscription launch test.

Overhead table (run under MPI; every mpiexec under a timeout):

    timeout -k 5 300 mpiexec -n 8 python scripts/bench_collectives.py
    timeout -k 5 300 mpiexec -n 8 python scripts/bench_collectives.py --json

For 64 KiB, 1 MiB and 16 MiB per rank, each spmdsim collective over the whole
mesh and the raw mpi4py buffer call run alternately on the same buffers
(spmdsim receives into the raw call's preallocated output with ``out=``;
``--alloc`` lets it allocate its result instead), each after a barrier; a
time is the median over repeats of the slowest rank. Both sides
wait the same way: ``--wait busy`` (default) blocks in MPI on both sides, so
the ratio is the Python overhead; with ``--wait polite`` (what ``spmdsim
launch`` picks when ranks outnumber cores) the raw side posts the nonblocking
call and completes it with the same `polite_wait` as spmdsim.

Launch test (run serially; it starts the mpiexec runs itself):

    python scripts/bench_collectives.py --launches 10 -n 8

runs one fixed job (a few hundred small and medium collectives, two ranks
computing more than the others) ``--launches`` times with MPICH defaults, with
one BLAS thread per rank but busy waits, and through ``spmdsim launch``
(one BLAS thread, polite wait), interleaved, and prints the table recorded in
docs/explanation/oversubscription.md. Each mode refuses the other's options (``-n`` and
``--iterations`` are the launch test's; the rest the overhead table's).
"""
from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from spmdsim.runtime.guard import run_guarded  # noqa: E402

# The shared argument types live beside this file (on sys.path when the script runs;
# added for imports of this file by path, as the tests do).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_args import ArgumentParser, byte_size, int_at_least  # noqa: E402
from spmdsim.base.threads import launcher_size  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

SIZES = (64 << 10, 1 << 20, 16 << 20)
OPS = ("allgather", "alltoall", "allreduce", "reduce_scatter", "bcast")


_PREPARED: list = []  # persistent requests to free before MPI finalizes


def _pairs(mesh, n_bytes, alloc, prepared=False):
    """op -> (spmdsim callable, raw callable) on the same float32 buffers.

    spmdsim receives into the raw call's output buffer (``out=``) unless
    `alloc`, where it allocates its result as plain calls do. With `prepared`
    the spmdsim side is a prepared (persistent) collective bound to those
    buffers (`spmdsim.runtime.prepared`); bcast has no prepared form and keeps
    the per-call one.
    """
    from mpi4py import MPI

    from spmdsim.base import buffers
    from spmdsim.runtime import collectives as C

    comm, g, _ = mesh.group_info(("x",))
    n = max(g, (n_bytes // 4) // g * g)
    # Buffers placed in the page as spmdsim places its own (spmdsim.base.buffers), so
    # every launch compares the same placement.
    x = buffers.placed_copy(np.random.default_rng(mesh.rank).random(n, dtype=np.float32))
    gathered = buffers.empty(n * g, np.float32)
    same = buffers.empty(n, np.float32)
    block = buffers.empty(n // g, np.float32)
    bbuf = buffers.placed_copy(x)
    if mesh.polite:
        # The same wait as spmdsim's polite mesh: the nonblocking call, then polite_wait.
        from spmdsim.runtime.engines.wait import polite_wait as pw

        raw = {
            "allgather": lambda: pw(comm.Iallgather(x, gathered)),
            "alltoall": lambda: pw(comm.Ialltoall(x, same)),
            "allreduce": lambda: pw(comm.Iallreduce(x, same, MPI.SUM)),
            "reduce_scatter": lambda: pw(comm.Ireduce_scatter_block(x, block, MPI.SUM)),
            "bcast": lambda: pw(comm.Ibcast(bbuf, 0)),
        }
    else:
        raw = {
            "allgather": lambda: comm.Allgather(x, gathered),
            "alltoall": lambda: comm.Alltoall(x, same),
            "allreduce": lambda: comm.Allreduce(x, same, MPI.SUM),
            "reduce_scatter": lambda: comm.Reduce_scatter_block(x, block, MPI.SUM),
            "bcast": lambda: comm.Bcast(bbuf, 0),
        }
    if prepared:
        from spmdsim.runtime import prepared as P

        steps = {
            "allgather": P.prepare_allgather(mesh, x, ("x",), 0, out=gathered),
            "alltoall": P.prepare_alltoall(mesh, x, ("x",), 0, out=same),
            "allreduce": P.prepare_allreduce(mesh, x, ("x",), out=same),
            "reduce_scatter": P.prepare_reduce_scatter(mesh, x, ("x",), 0, out=block),
        }
        _PREPARED.extend(steps.values())
        ours = {op: step.run for op, step in steps.items()}
    else:
        # The `out` buffers are bound now, not looked up per call: the spmdsim side
        # must not pay for harness work the raw side does not do.
        out_g, out_s, out_b = (None, None, None) if alloc else (gathered, same, block)
        ours = {
            "allgather": lambda: C.allgather(mesh, x, ("x",), 0, out=out_g),
            "alltoall": lambda: C.alltoall(mesh, x, ("x",), 0, 0, out=out_s),
            "allreduce": lambda: C.allreduce(mesh, x, ("x",), out=out_s),
            "reduce_scatter": lambda: C.reduce_scatter(mesh, x, ("x",), 0, out=out_b),
        }
    ours["bcast"] = lambda: C.bcast(mesh, bbuf, ("x",), 0)  # no prepared form
    return {op: (ours[op], raw[op]) for op in OPS}, n * 4, g


def bench(args) -> list[dict]:
    from mpi4py import MPI

    from spmdsim import Layout
    from spmdsim.errors import SpmdsimError
    from spmdsim import Mesh

    world = MPI.COMM_WORLD
    # Below one float32 per rank in each rank's block the buffers would be padded up
    # silently; refused on every rank alike before any collective.
    small = [n for n in args.sizes if n < 4 * world.size]
    if small:
        raise SpmdsimError(f"--sizes {small[0]}: below one float32 per rank for {world.size} ranks; "
                           f"expected at least {4 * world.size} bytes")
    mesh = Mesh(Layout((world.size,), ("x",)), wait=args.wait)
    records = []
    for n_bytes in args.sizes:
        pairs, real_bytes, g = _pairs(mesh, n_bytes, args.alloc, args.prepared)
        # Even counts: each contender goes first equally often (order matters on 2 cores).
        repeats = args.repeats or (80 if n_bytes <= 64 << 10 else 40 if n_bytes <= 1 << 20 else 16)
        repeats += repeats % 2
        for op in args.ops:
            ours, raw = pairs[op]
            if args.aa:
                ours = raw  # A/A control: the harness's own noise, raw against raw
            ours(), raw()  # warm-up: groups, allocator, MPI buffers
            times = np.empty((repeats, 2))
            for i in range(repeats):
                order = ((0, ours), (1, raw)) if i % 2 == 0 else ((1, raw), (0, ours))
                for slot, fn in order:
                    world.Barrier()
                    t0 = time.perf_counter()
                    fn()
                    times[i, slot] = time.perf_counter() - t0
            slowest = np.empty_like(times)
            world.Allreduce(times, slowest, MPI.MAX)
            s, r = (float(np.median(slowest[:, k])) for k in (0, 1))
            records.append({"op": op, "group_size": g, "bytes_per_rank": real_bytes,
                            "spmdsim_s": s, "raw_s": r, "ratio": s / r if r > 0 else float("nan")})
    for step in _PREPARED:
        step.free()
    mesh.close()
    return records if world.rank == 0 else []


def _table(records: list[dict]) -> str:
    lines = [f"{'op':<15}{'g':>3}{'bytes/rank':>12}{'spmdsim ms':>12}{'raw ms':>10}{'ratio':>8}"]
    for r in records:
        lines.append(f"{r['op']:<15}{r['group_size']:>3}{r['bytes_per_rank']:>12}"
                     f"{r['spmdsim_s'] * 1e3:>12.3f}{r['raw_s'] * 1e3:>10.3f}{r['ratio']:>8.2f}")
    return "\n".join(lines)


# -- the oversubscription launch test ------------------------------------------------
def workload(iterations: int) -> None:
    """The fixed job: per iteration, imbalanced compute then five small/medium collectives."""
    from mpi4py import MPI

    from spmdsim import Layout
    from spmdsim import Mesh
    from spmdsim.runtime import collectives as C

    world = MPI.COMM_WORLD
    mesh = Mesh(Layout((2, world.size // 2), ("dp", "mp")))
    a = np.ones((160, 160))
    small, med, big = np.ones(256), np.ones(8192), np.ones(131072)
    world.Barrier()
    t0 = time.perf_counter()
    for _ in range(iterations):
        for _ in range(1 + 60 * (mesh.rank < 2)):  # ranks 0-1 compute 61x more
            a @ a
        C.allreduce(mesh, small, ("mp",))
        C.allgather(mesh, med, ("dp", "mp"), 0)
        C.alltoall(mesh, big, ("mp",), 0, 0)
        C.allreduce(mesh, big, ("dp",))
        C.reduce_scatter(mesh, big, ("dp", "mp"), 0)
    seconds = world.allreduce(time.perf_counter() - t0, MPI.MAX)
    if world.rank == 0:
        print(json.dumps({"seconds": seconds, "wait": mesh.wait_mode}), flush=True)


def launches(args) -> None:
    """Run the fixed job repeatedly with MPICH defaults and with spmdsim launch settings."""
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    job = [sys.executable, os.path.abspath(__file__), "--workload", str(args.iterations)]
    configs = {
        # "default": what a user gets from plain mpiexec: blocking waits, BLAS threads per core.
        "default": [*_timeout(), mpiexec, "-n", str(args.ranks), *job],
        "busy, 1 BLAS thread": [*_timeout(), mpiexec, "-n", str(args.ranks), *job],
        "spmdsim launch": [sys.executable, "-m", "spmdsim", "launch", "-n", str(args.ranks),
                           "--timeout", "300", "--", *job],
    }
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "SPMDSIM_WAIT")}
    one = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env_of = {"default": {**base, "SPMDSIM_WAIT": "busy"},
              "busy, 1 BLAS thread": {**base, **one, "SPMDSIM_WAIT": "busy"},
              "spmdsim launch": dict(base)}
    results: dict[str, list] = {k: [] for k in configs}
    for i in range(args.launches):
        for name, cmd in configs.items():
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, env=env_of[name], capture_output=True, text=True, timeout=330)
                how = f"exit code {proc.returncode}"
            except subprocess.TimeoutExpired:  # the job's own 300 s timeout should end it first
                proc, how = subprocess.CompletedProcess(cmd, None, "", ""), "still running after 330 s"
            wall = time.perf_counter() - t0
            job_s = _job_seconds(proc)
            if job_s is None:
                # One failed job makes the whole table meaningless: show why, stop, exit 1.
                tail = "\n".join(f"{what}: {text[-3000:]}" for what, text in
                                 (("stdout", proc.stdout), ("stderr", proc.stderr)) if text.strip())
                sys.stderr.write(tail + "\n")
                raise SystemExit(f"bench_collectives: launch {i + 1} ({name}) failed ({how}): "
                                 f"{' '.join(cmd)}")
            results[name].append((wall, job_s, load))
            print(f"launch {i + 1:>2} {name:<15} wall {wall:7.2f} s  job {job_s:7.2f} s  load {load:5.2f}",
                  flush=True)
    print()
    print("| settings | launches | job s median | min | max | max/min | wall s median | load (1-min avg) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, rows in results.items():
        job = [r[1] for r in rows]
        wall = [r[0] for r in rows]
        loads = [r[2] for r in rows]
        print(f"| {name} | {len(rows)} | {statistics.median(job):.2f} | {min(job):.2f} | {max(job):.2f} | "
              f"{max(job) / min(job):.2f} | {statistics.median(wall):.2f} | {min(loads):.1f}-{max(loads):.1f} |")


def _job_seconds(proc: subprocess.CompletedProcess) -> float | None:
    """The job's time from its last output line, or None when the job failed."""
    lines = proc.stdout.strip().splitlines() if proc.returncode == 0 else []
    try:
        return float(json.loads(lines[-1])["seconds"])
    except (IndexError, ValueError, KeyError, TypeError):
        return None


def _timeout() -> list[str]:
    return ["timeout", "-k", "5", "300"]


def _even_ranks(text: str) -> int:
    """An argparse type: the launch test's rank count (its job's mesh is 2 x n/2)."""
    value = int_at_least(2)(text)
    if value % 2:
        raise argparse.ArgumentTypeError(f"expected an even rank count >= 2, got {text!r}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked before MPI starts (a bad value: one message, exit 2 on every rank)."""
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print a JSON list of records")
    # The defaults of the two modes' options are filled in below: None says the option was not given.
    p.add_argument("--sizes", type=byte_size, nargs="+", default=None,
                   help="bytes per rank (K/M suffixes)")
    p.add_argument("--ops", nargs="+", choices=OPS, default=None)
    p.add_argument("--repeats", type=int_at_least(1), default=None,
                   help="repeats per case (default by size)")
    p.add_argument("--alloc", action="store_true", help="spmdsim allocates its results (no out=)")
    p.add_argument("--wait", choices=("busy", "polite", "auto"), default=None, help="(default busy)")
    p.add_argument("--prepared", action="store_true",
                   help="time spmdsim's prepared (persistent) collectives instead of the per-call ones")
    p.add_argument("--aa", action="store_true",
                   help="A/A control: time raw mpi4py against itself (ratios show the harness noise)")
    p.add_argument("--launches", type=int_at_least(1), default=0,
                   help="run the launch test this many times (without it: the overhead table)")
    p.add_argument("-n", "--ranks", type=_even_ranks, default=None,
                   help="ranks for the launch test (even; default 8)")
    p.add_argument("--iterations", type=int_at_least(1), default=None,
                   help="iterations of the launch test's fixed job (default 60)")
    p.add_argument("--workload", type=int_at_least(1), default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.launches and not args.workload and launcher_size() > 1:
        # Each rank ran the whole launch test at once: N tables, N copies of every job on the same cores.
        p.error(f"--launches {args.launches} starts its own mpiexec runs, but this is one of {launcher_size()} "
                "ranks of an MPI launcher, each of which would run the whole test at once; expected it run "
                "serially: python scripts/bench_collectives.py --launches N")
    if not args.workload:
        # Each mode took the other's options and ignored them: `--launches 1 --json` printed the markdown
        # table, an overhead run with `-n 4` timed the ranks mpiexec started.
        table = [flag for flag, given in (("--json", args.json), ("--sizes", args.sizes is not None),
                                          ("--ops", args.ops is not None), ("--repeats", args.repeats is not None),
                                          ("--alloc", args.alloc), ("--wait", args.wait is not None),
                                          ("--prepared", args.prepared), ("--aa", args.aa)) if given]
        launch = [flag for flag, given in (("-n/--ranks", args.ranks is not None),
                                           ("--iterations", args.iterations is not None)) if given]
        if args.launches and table:
            p.error(f"{', '.join(table)}: {'options' if len(table) > 1 else 'an option'} of the overhead table, "
                    f"not of the launch test (--launches {args.launches}: a fixed job); expected "
                    f"{'them' if len(table) > 1 else 'it'} without --launches")
        if not args.launches and launch:
            p.error(f"{', '.join(launch)}: {'options' if len(launch) > 1 else 'an option'} of the launch test "
                    f"only; expected {'them' if len(launch) > 1 else 'it'} with --launches N (the overhead table "
                    "runs on the ranks mpiexec started)")
    args.sizes = list(SIZES) if args.sizes is None else args.sizes
    args.ops = list(OPS) if args.ops is None else args.ops
    args.wait = "busy" if args.wait is None else args.wait
    args.ranks = 8 if args.ranks is None else args.ranks
    args.iterations = 60 if args.iterations is None else args.iterations
    if args.prepared and args.alloc:
        p.error("--prepared and --alloc conflict: a prepared collective is bound to its output "
                "buffer; expected one of them")
    return args


def run(args: argparse.Namespace) -> int:
    if args.workload:
        workload(args.workload)
        return 0
    records = bench(args)
    if records:
        print(json.dumps(records, indent=1) if args.json else _table(records), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse before MPI starts, then run under spmdsim's guard (a failing rank ends the job)."""
    args = parse_args(argv)
    if args.launches and not args.workload:
        launches(args)  # serial: it starts the mpiexec runs itself, so no MPI here
        return 0
    return run_guarded(lambda: run(args))


if __name__ == "__main__":
    sys.exit(run_script(main))
