#!/usr/bin/env python
"""What ranks waiting for one rank's work cost the machine: spmdsim's polite wait against 100 us sleeps.

Run under MPI (every mpiexec under a timeout):

    timeout -k 5 120 mpiexec -n 8 python scripts/bench_polite_wait.py
    timeout -k 5 120 mpiexec -n 8 python scripts/bench_polite_wait.py --work 0.5 --rounds 3

In each round rank 0 computes for `--work` seconds of its own CPU (a Python loop) while the others have
posted an Iallreduce and wait for it; then rank 0 posts it too. Two waits take turns, round by round
(`--rounds` each): spmdsim's polite wait (spmdsim.runtime.engines.wait.polite_wait) and a hand-written peer
that polls Test() with sched_yield for 1 ms, then sleeps 100 us between polls however long it waits (the
polite wait's schedule for the first 2 ms of a wait). A line per wait gives the CPU the waiting ranks spent
in all (user and system, getrusage) and the slowest rank's wall time a round; the last line their ratio.
With more ranks than cores every poll of a waiting rank also takes a core the working rank could use.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from spmdsim.runtime.engines.wait import polite_wait  # noqa: E402
from spmdsim.runtime.guard import run_guarded  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_args import ArgumentParser, positive_float, int_at_least  # noqa: E402
from spmdsim.tools.cli.main import run_script  # noqa: E402

#: The peer's schedule: sched_yield between polls for the first millisecond, then sleeps of 100 us.
PEER_YIELD_S = 1e-3
PEER_SLEEP_S = 100e-6


def peer_wait(request) -> None:
    """Complete `request` as the polite wait's first 2 ms do, for however long it takes."""
    test, clock = request.Test, time.perf_counter
    deadline = clock() + PEER_YIELD_S
    while not test():
        if clock() > deadline:
            while not test():
                time.sleep(PEER_SLEEP_S)
            return
        os.sched_yield()


WAITS = {"spmdsim polite wait": polite_wait, "peer: 100 us sleeps": peer_wait}


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def _work(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def _round(comm, wait, work: float) -> tuple[float, float]:
    """(this rank's CPU, its wall seconds) for one round: rank 0 works, every rank completes one Iallreduce."""
    x, y = np.zeros(1), np.zeros(1)
    comm.Barrier()
    cpu, start = _cpu(), time.perf_counter()
    if comm.Get_rank() == 0:
        _work(work)
    wait(comm.Iallreduce(x, y))
    return _cpu() - cpu, time.perf_counter() - start


def bench(work: float, rounds: int) -> dict:
    """{wait's name: (the waiting ranks' CPU in all, the slowest rank's wall seconds a round)} on rank 0."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    names = list(WAITS)
    spent = {name: [0.0, 0.0] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:  # each wait first in half the rounds
            cpu, wall = _round(comm, WAITS[name], work)
            cpus, slowest = comm.gather(cpu), comm.allreduce(wall, op=MPI.MAX)
            if comm.Get_rank() == 0:
                spent[name][0] += sum(cpus[1:])
                spent[name][1] += slowest / rounds
    return {name: tuple(v) for name, v in spent.items()} if comm.Get_rank() == 0 else {}


def _table(spent: dict, ranks: int, work: float, rounds: int) -> str:
    lines = [f"{ranks} ranks on {len(os.sched_getaffinity(0))} cores: rank 0 works {work:g} s a round, "
             f"{ranks - 1} ranks wait; {rounds} rounds each",
             f"{'wait':<22}{'waiting CPU s':>15}{'wall s a round':>16}"]
    lines += [f"{name:<22}{cpu:>15.3f}{wall:>16.3f}" for name, (cpu, wall) in spent.items()]
    (polite, _), (peer, _) = spent.values()
    lines.append(f"waiting CPU, polite / peer: {polite / peer:.2f}" if peer > 0 else "the peer spent no CPU")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked before MPI starts (a bad value: one message, exit 2 on every rank)."""
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=positive_float, default=0.2, help="rank 0's CPU seconds a round (default 0.2)")
    p.add_argument("--rounds", type=int_at_least(1), default=5, help="rounds for each wait (default 5)")
    args = p.parse_args(argv)
    if args.work > 60:
        p.error(f"--work {args.work:g}: expected at most 60 seconds a round")
    return args


def run(args: argparse.Namespace) -> int:
    from mpi4py import MPI

    ranks = MPI.COMM_WORLD.Get_size()
    if ranks < 2:
        print("bench_polite_wait.py: error: needs 2 ranks or more (timeout -k 5 120 mpiexec -n 8 python "
              "scripts/bench_polite_wait.py)", file=sys.stderr)
        return 2
    spent = bench(args.work, args.rounds)
    if spent:
        print(_table(spent, ranks, args.work, args.rounds), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse before MPI starts, then run under spmdsim's guard (a failing rank ends the job)."""
    args = parse_args(argv)
    return run_guarded(lambda: run(args))


if __name__ == "__main__":
    sys.exit(run_script(main))
