#!/usr/bin/env python
"""What one meeting of simulated ranks costs: mpi4py calls on simulated ranks (spmdsim.runtime.sim), in one process.

    python scripts/bench_rendezvous.py                          # 5 launches of each case, 2,000 calls
    python scripts/bench_rendezvous.py --before /tmp/old        # another checkout's spmdsim beside, A/A too
    python scripts/bench_rendezvous.py --case Send+Recv@2 --repeat 9

Cases: Allreduce of 8 float64 at 2 and 8 ranks, Barrier and Bcast of 8 float64 at 8 ranks, and Send then
Recv of 8 float64 between 2 ranks (a round trip: a rank hands the interpreter to the other twice). Each
launch is a fresh process running `simulate(n, ...)`; a rank times its loop with `time.thread_time` (its
own CPU, with the system time of its waits and wake-ups), and the case's figure is the sum over ranks
per call: the CPU the simulation spends per collective or round trip, steadier than wall time on a
loaded machine. The wall time per call is the slowest rank's. It prints the median over launches and the
load average before and after. With --before each round runs this checkout, the other one and this one
again (an A/A control: the spread between two runs of the same thing).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from spmdsim.tools.cli.main import run_script

HERE = Path(__file__).resolve().parent
CASES = (("Allreduce", 2), ("Allreduce", 8), ("Barrier", 8), ("Bcast", 8), ("Send+Recv", 2))

_CHILD = r"""
import json, sys, time
import numpy as np
from spmdsim.runtime.sim import simulate, world

def body(case, calls):
    comm = world()
    a, b = np.ones(8), np.empty(8)
    me = comm.rank
    comm.Barrier()
    wall, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        if case == "Allreduce":
            comm.Allreduce(a, b)
        elif case == "Barrier":
            comm.Barrier()
        elif case == "Bcast":
            comm.Bcast(a, 0)
        elif me == 0:
            comm.Send(a, 1, 1)
            comm.Recv(b, 1, 1)
        elif me == 1:
            comm.Recv(b, 0, 1)
            comm.Send(a, 0, 1)
    return time.perf_counter() - wall, time.thread_time() - cpu

case, ranks, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times = simulate(ranks, body, case, calls)
print(json.dumps([max(w for w, _ in times) / calls * 1e6, sum(c for _, c in times) / calls * 1e6]))
"""


def _launch(case: str, ranks: int, calls: int, path: str) -> tuple[float, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    # Run from that checkout: `python -c` puts the working directory first on sys.path, before PYTHONPATH.
    out = subprocess.run([sys.executable, "-c", _CHILD, case, str(ranks), str(calls)], env=env, cwd=path,
                         capture_output=True, text=True, timeout=300)
    if out.returncode:
        raise SystemExit(f"{case} at {ranks} ranks failed ({path}):\n{out.stderr}")
    wall, cpu = json.loads(out.stdout.splitlines()[-1])
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="launches of each case (default 5)")
    parser.add_argument("--calls", type=int, default=2000, help="calls a launch times (default 2000)")
    parser.add_argument("--before", metavar="DIR", help="another checkout's spmdsim, timed beside this one")
    names = [f"{case}@{ranks}" for case, ranks in CASES]
    parser.add_argument("--case", action="append", choices=names, help="only this case (repeatable)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.calls < 1:
        parser.error(f"--repeat {args.repeat!r} and --calls {args.calls!r} must be 1 or more")
    if args.before is not None and not os.path.isdir(os.path.join(args.before, "spmdsim")):
        parser.error(f"--before {args.before!r} holds no spmdsim/ folder; expected another checkout")
    cases = [c for c, name in zip(CASES, names) if not args.case or name in args.case]
    trees = {"this checkout": str(HERE.parent)}
    if args.before:  # in turn each round: this one, the other, this one again (the A/A control)
        trees.update({"--before": args.before, "this checkout, A/A": str(HERE.parent)})
    print(f"load average {os.getloadavg()[0]:.1f}; {args.repeat} launches of {args.calls} calls, medians")
    print(f"{'case':<16}{'spmdsim':<20}{'wall us/call':>14}{'CPU us/call':>14}")
    for case, ranks in cases:
        got: dict = {name: [] for name in trees}
        for _ in range(args.repeat):
            for name, path in trees.items():
                got[name].append(_launch(case, ranks, args.calls, path))
        for name, runs in got.items():
            wall = statistics.median(w for w, _ in runs)
            cpu = statistics.median(c for _, c in runs)
            print(f"{case + ' @' + str(ranks):<16}{name:<20}{wall:>14.1f}{cpu:>14.1f}")
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
