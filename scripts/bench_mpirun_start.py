#!/usr/bin/env python
"""A short mpi4py program's launches: `spmdsim mpirun -n N` beside MPICH's `mpiexec -n N`.

    python scripts/bench_mpirun_start.py                          # hello world and cpi at 4 ranks
    python scripts/bench_mpirun_start.py --repeat 9 --ranks 8
    python scripts/bench_mpirun_start.py --before /tmp/old        # another checkout's spmdsim beside
    python scripts/bench_mpirun_start.py --ranks 2 --demo osu_bw.py --demo osu_latency.py --repeat 3

Each round launches every configuration once, in turn (so a change of the machine's load falls on
all of them alike): `spmdsim mpirun` twice (an A/A control: the spread between two runs of the same
thing), under `timeout -k 5 120 mpiexec`, and with --before the spmdsim of that checkout (its
folder on PYTHONPATH). It prints the median wall time of each over the rounds, the median CPU
time (user and system, of every process of the launch: on a loaded machine the steadier of the
two), every launch's wall time and the load average before and after. Each run must print what
mpiexec prints, compared as the characters printed in any order (ranks print at once, and MPICH
may join two ranks' lines), the OSU benchmarks' times and rates masked. The programs are mpi4py's demos helloworld.py
(no numpy) and compute-pi/cpi-cco.py (numpy) by default, and, with --demo, the OSU benchmarks osu_bw.py (windows
of 64 small Isends and Irecvs) and osu_latency.py (Send and Recv in turn) at 2 ranks, from the sdist
that tests/mpi4py_suite.py --fetch keeps.
"""
from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from spmdsim.tools.cli.main import run_script

HERE = Path(__file__).resolve().parent
DEMOS = {"helloworld.py": "", "compute-pi/cpi-cco.py": "100\n100000\n0\n"}  # the stdin its makefile gives
MEASURED = ("osu_bw.py", "osu_latency.py")  # they print times and rates (masked); 2 ranks, no stdin
_NUMBER = re.compile(r"\d+\.\d*(e[+-]?\d+)?|\d+e[+-]?\d+")


def _demo_dir() -> Path:
    sys.path.insert(0, str(HERE.parent / "tests"))
    import mpi4py_suite

    found = mpi4py_suite.find_tests()
    if found is None or not (found.parent / "demo").is_dir():
        raise SystemExit("mpi4py's demos are not here: run `python tests/mpi4py_suite.py --fetch` first")
    return found.parent / "demo"


def _configs(ranks: int, script: Path, before: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    ours = dict(env, PYTHONPATH=str(HERE.parent))
    mpirun = [sys.executable, "-m", "spmdsim", "mpirun", "-n", str(ranks), "python", str(script)]
    configs = {"spmdsim mpirun": (ours, mpirun)}
    if before:
        configs["--before's spmdsim mpirun"] = (dict(env, PYTHONPATH=before), mpirun)
    beside = Path(sys.executable).with_name("mpiexec")  # the venv's (the `mpich` wheel), else the one on PATH
    mpiexec = str(beside) if os.access(beside, os.X_OK) else (shutil.which("mpiexec") or "mpiexec")
    configs["mpiexec"] = (env, ["timeout", "-k", "5", "120", mpiexec, "-n", str(ranks), sys.executable, str(script)])
    configs["spmdsim mpirun, A/A"] = (ours, mpirun)
    return configs


def _children_cpu() -> float:
    """User and system seconds of the processes this one ran and waited for (mpiexec's ranks too)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def bench(demo: str, ranks: int, repeat: int, before: str | None) -> None:
    script = _demo_dir() / demo
    configs = _configs(ranks, script, before)
    walls: dict = {name: [] for name in configs}
    cpus: dict = {name: [] for name in configs}
    printed = set()
    load = os.getloadavg()[0]
    for _ in range(repeat):
        for name, (env, cmd) in configs.items():
            t0, used = time.perf_counter(), _children_cpu()
            # from a folder of its own: `python -m spmdsim` imports the working folder's spmdsim first
            run = subprocess.run(cmd, env=env, input=DEMOS.get(demo, ""), capture_output=True, text=True,
                                 cwd=script.parent, timeout=180)
            walls[name].append(time.perf_counter() - t0)
            cpus[name].append(_children_cpu() - used)
            if run.returncode != 0:
                raise SystemExit(f"{name} failed on {demo}: {run.stderr[-800:]}")
            out = _NUMBER.sub("#", run.stdout) if demo in MEASURED else run.stdout
            printed.add(tuple(sorted("".join(out.split()))))  # MPICH may join two ranks' lines
    print(f"{demo} at {ranks} ranks, median of {repeat} launches each (load average {load:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after):")
    for name, times in walls.items():
        print(f"  {name:27s} {statistics.median(times):5.2f} s, CPU {statistics.median(cpus[name]):5.2f} s   "
              f"({' '.join(f'{t:.2f}' for t in times)})")
    if len(printed) != 1:
        raise SystemExit(f"{demo}: the runs printed different lines")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--before", help="a folder holding another spmdsim/ (an older checkout) to time beside")
    parser.add_argument("--demo", choices=sorted([*DEMOS, *MEASURED]), action="append",
                        help="default: hello world and cpi-cco")
    args = parser.parse_args()
    for name in ("ranks", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} {getattr(args, name)} must be at least 1")
    if args.before is not None and not os.path.isdir(os.path.join(args.before, "spmdsim")):
        parser.error(f"--before {args.before!r} holds no spmdsim/ folder; expected an older checkout")
    for demo in args.demo or sorted(DEMOS, reverse=True):
        bench(demo, args.ranks, args.repeat, args.before)


if __name__ == "__main__":
    sys.exit(run_script(main))
