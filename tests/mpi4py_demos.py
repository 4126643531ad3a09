"""mpi4py's demo programs under ``spmdsim mpirun`` and under MPICH's ``mpiexec``, their outputs compared.

    python tests/mpi4py_demos.py                     # every run of RUNS
    python tests/mpi4py_demos.py --only cpi --verbose

The demos are those of the installed mpi4py's sdist (``demo/``, beside the ``test/`` that
tests/mpi4py_suite.py runs): from $SPMDSIM_MPI4PY_DEMOS, else ~/.cache/spmdsim/mpi4py-<version>/demo,
which ``--fetch`` fills (one ``pip download`` of the sdist for both). Each run is one demo at one count of
ranks, with the arguments and standard input its makefile gives; a run matches when both exit with the same
code and print the same lines (sorted where the ranks print at once, with the times a demo measures masked),
and, for a run that succeeds, the same text to stderr (unittest's reports: times masked, in any order).
OUT_OF_SCOPE lists the demos not run, with why.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import mpi4py_suite

#: A number with a decimal point or an exponent: a time or a rate a demo measures.
_MEASURED = re.compile(r"\d+\.\d*(e[+-]?\d+)?|\d+e[+-]?\d+")
#: A line MPICH's launcher (hydra) prints about its own sockets, now and then, when a rank aborts the job:
#: "[mpiexec@host] HYDU_sock_write (.../sock.c:250): write error (Bad file descriptor)". Not the program's.
_LAUNCHERS = re.compile(r"^\[mpiexec@[^\]]*\] .*\n?", re.M)


@dataclass(frozen=True)
class Run:
    """One demo at one count of ranks: its path under demo/, arguments, standard input and how to compare."""

    path: str
    ranks: int
    args: tuple = ()
    stdin: str = ""
    order: str = "lines"  # "lines": as printed; "sorted": the ranks print at once
    record: str = ""  # with "sorted": what one rank prints (a regular expression; MPICH may join ranks' lines)
    measured: bool = False  # times and rates masked
    digits: int = 0  # numbers cut to so many decimals (0: as printed)

    @property
    def name(self) -> str:
        return f"{self.path}{' ' + ' '.join(self.args) if self.args else ''} -n {self.ranks}"


def _runs() -> tuple:
    runs = []
    for n in (1, 2, 3, 4, 8):
        runs.append(Run("helloworld.py", n, order="sorted", record=r"Hello, World! I am process \d+ of \d+ on [^.]+\."))
    for n in (2, 3, 4, 8):  # the pi's last digits follow the order of the Reduce's additions
        runs.append(Run("compute-pi/cpi-cco.py", n, stdin="100\n100000\n0\n"))
        runs.append(Run("profiling/cpi.py", n))
    for n in (1, 2, 3, 4, 8):  # the pi's last digits follow the order the Accumulates arrive in (MPICH's vary)
        runs.append(Run("compute-pi/cpi-rma.py", n, stdin="100\n", digits=14))
    for n in (2, 5):
        for name in ("onesided", "scalable"):
            runs.append(Run(f"nxtval/nxtval-{name}.py", n))
    # Not at 5: its rank 0 writes its counter's 0 after Win.Allocate with no Barrier, racing the others'
    # Get_accumulate; MPICH's rank 0 wins by timing, a simulated one after the last to arrive only at times.
    runs.append(Run("nxtval/nxtval-mpi3.py", 2))
    for n in (2, 5):
        runs.append(Run("profiling/ring.py", n))
        runs.append(Run("profiling/threads.py", n))
        runs.append(Run("nxtval/nxtval-threads.py", n, order="sorted"))
        runs.append(Run("reductions/test_reductions.py", n, ("-q",)))
        runs.append(Run("sequential/test_seq.py", n))
        runs.append(Run("mandelbrot/mandelbrot.py", n, measured=True))
    runs.append(Run("threads/sendrecv.py", 1))
    for n in (2, 4):  # its parent and child mode, as its makefile runs it: a world of one spawns n children
        runs.append(Run("compute-pi/cpi-dpm.py", 1, (str(n),), stdin="100\n", measured=True))
    for n in (2, 5):  # each rank's counter is a rank it spawns
        runs.append(Run("nxtval/nxtval-dynproc.py", n))
    for name in ("ex-2.01", "ex-2.08", "ex-2.16", "ex-2.29", "ex-2.32", "ex-2.34", "ex-2.35", "ex-3.01", "ex-3.02",
                 "ex-3.03", "ex-3.04", "ex-3.05", "ex-3.06", "ex-3.07", "ex-3.08", "ex-3.09", "ex-3.11", "ex-3.12",
                 "ex-3.13"):
        for n in (2, 3):
            runs.append(Run(f"mpi-ref-v1/{name}.py", n))
    for name in ("osu_bw", "osu_bibw", "osu_latency", "osu_multi_lat", "osu_allgather", "osu_alltoall",
                 "osu_alltoallv", "osu_barrier", "osu_bcast", "osu_gather", "osu_scatter"):
        runs.append(Run(f"{name}.py", 2, measured=True))  # MPICH's collectives take minutes at 4 on 2 cores
    for arg in ("threads=true", "threads=false", "thread_level=single", "thread_level=funneled",
                "thread_level=serialized", "thread_level=multiple", "fast_reduce=true", "fast_reduce=false",
                "recv_mprobe=true", "recv_mprobe=false", "errors=default", "errors=exception", "errors=abort",
                "errors=fatal"):
        runs.append(Run("init-fini/test_0.py", 2, (arg,)))
    for name in ("test_1", "test_2", "test_4"):
        runs.append(Run(f"init-fini/{name}.py", 2))
    return tuple(runs)


#: Every run the script makes (the makefiles' demos that a simulated rank can run, at several counts).
RUNS = _runs()

#: mpi4py's demos not run, and why (docs/howto/simulate.md).
OUT_OF_SCOPE = {
    "Spawn of the executables their makefiles build (spawning/'s masters and workers, a script's copy after a "
    "#! line or compiled; mandelbrot-master's worker in Fortran)": (
        "spawning/cpi-master.py", "spawning/cpi-worker.py", "mandelbrot/mandelbrot-master.py"),
    "mpi4py.futures (its test_futures spawns workers with python options of their own, -O or -Xdev, which ranks "
    "of one interpreter cannot have; under `-m mpi4py.futures` it runs, but is not launched here)": (
        "futures/*.py",),
    "a compiler (C, C++, Fortran, Cython, SWIG, pybind11, nanobind, f2py, cffi, ctypes over a built library)": (
        "embedding/", "cython/", "libmpi-cffi/", "wrap-*/"),
    "GPU memory (CuPy, Numba's CUDA)": ("cuda-aware-mpi/*.py",),
    "mpiexec's own environment and launching (they run mpiexec and python as processes)": (
        "check-mpiexec/run.sh", "test-run/test_run.py"),
    "no MPI (the sequential version)": ("mandelbrot/mandelbrot-seq.py",),
    "MPI sessions (MPI.Session, Intracomm.Create_from_group)": ("init-fini/test_mpi40.py",),
    "what importing mpi4py.MPI does in a fresh process (reading MPI4PY_RC_* into mpi4py.rc, warning on bad "
    "values, a new mpi4py.rc after `del sys.modules['mpi4py.rc']`): the simulated ranks share one import of "
    "mpi4py and one sys.modules, made before they start, and a compiled module loads once a process": (
        "init-fini/test_3.py", "init-fini/test_5.py", "init-fini/test_6.py"),
}


def find_demos() -> Path | None:
    """The directory of mpi4py's demos, or None."""
    env = os.environ.get("SPMDSIM_MPI4PY_DEMOS")
    if env:
        return Path(env)
    found = mpi4py_suite.cache_dir() / "demo"
    return found if (found / "helloworld.py").exists() else None


def normalize(run: Run, out: str) -> list:
    lines = re.findall(run.record, out) if run.record else out.splitlines()
    if run.measured:
        lines = [" ".join(_MEASURED.sub("#", line).split()) for line in lines]
    if run.digits:
        lines = [re.sub(rf"(\d+\.\d{{{run.digits}}})\d+", r"\1", line) for line in lines]
    if run.order == "sorted":
        lines = sorted(lines)
    return lines


def stderr_text(err: str) -> str:
    """What a run printed to stderr, times masked and the launcher's own lines about its sockets dropped, as its
    sorted characters but spaces: the ranks' unittest reports come at once, and MPICH may join one rank's words
    into another's line."""
    return "".join(sorted("".join(_MEASURED.sub("#", _LAUNCHERS.sub("", err)).split())))


def launch(demo_dir: Path, run: Run, simulated: bool, timeout: int = 300) -> tuple:
    """(exit code, stdout, stderr) of one run, simulated or under mpiexec."""
    script = demo_dir / run.path
    if simulated:
        cmd = [sys.executable, "-m", "spmdsim", "mpirun", "-n", str(run.ranks), sys.executable, str(script)]
    else:
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        cmd = ["timeout", "-k", "5", str(timeout), mpiexec, "-n", str(run.ranks), sys.executable, str(script)]
    try:
        done = subprocess.run(cmd + list(run.args), input=run.stdin, capture_output=True, text=True,
                              cwd=script.parent, timeout=timeout + 10)
    except subprocess.TimeoutExpired as exc:
        return "timeout", exc.stdout or "", exc.stderr or ""
    return done.returncode, done.stdout, done.stderr


def compare(demo_dir: Path, run: Run) -> tuple:
    """(matched, detail, seconds simulated, seconds under mpiexec) of one run."""
    t0 = time.perf_counter()
    sim = launch(demo_dir, run, simulated=True)
    t1 = time.perf_counter()
    mpi = launch(demo_dir, run, simulated=False)
    t2 = time.perf_counter()
    problems = []
    if sim[0] != mpi[0]:
        problems.append(f"exit {sim[0]} simulated, {mpi[0]} under mpiexec")
    if normalize(run, sim[1]) != normalize(run, mpi[1]):
        problems.append(f"stdout differs:\n--- simulated\n{sim[1][-1500:]}\n--- mpiexec\n{mpi[1][-1500:]}")
    if sim[0] == 0 and stderr_text(sim[2]) != stderr_text(mpi[2]):
        problems.append("stderr differs")
    if problems:
        problems.append(f"--- simulated stderr\n{sim[2][-1500:]}\n--- mpiexec stderr\n{mpi[2][-800:]}")
    return not problems, "\n".join(problems), t1 - t0, t2 - t1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="a regular expression on the runs' names")
    parser.add_argument("--fetch", action="store_true", help="download mpi4py's sdist first")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    demo_dir = find_demos()
    if demo_dir is None and args.fetch:
        mpi4py_suite.fetch()
        demo_dir = find_demos()
    if demo_dir is None:
        print("mpi4py's demos are not here: run with --fetch, or set SPMDSIM_MPI4PY_DEMOS", file=sys.stderr)
        return 2
    runs = [r for r in RUNS if not args.only or re.search(args.only, r.name)]
    matched = 0
    for run in runs:
        ok, detail, t_sim, t_mpi = compare(demo_dir, run)
        matched += ok
        print(f"{'same' if ok else 'DIFF'} {run.name}  ({t_sim:.1f} s simulated, {t_mpi:.1f} s mpiexec)",
              flush=True)
        if not ok and args.verbose:
            print("   " + detail.strip().replace("\n", "\n   "))
    print(f"{matched} of {len(runs)} runs print what mpiexec prints")
    return 0 if matched == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
