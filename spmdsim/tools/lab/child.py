"""The child process that runs one submission: ``python -m spmdsim.tools.lab.child FOLDER N FILE OUT ...``.

The process the grader starts forks the one that runs the cases and only waits for it (the keeper): a
submission's parent is the keeper, so `os.kill(os.getppid(), 9)` cannot reach the grader, and the keeper
writes how the submission's process ended (its signal, its CPU seconds) to OUT's ``.exit`` file. The
process that runs the cases sets its own limits once its modules are loaded (memory: the address space it
holds then plus the exercise's MEMORY_MB; CPU seconds), then runs the cases rank count by rank count,
writing one JSON line to OUT as each case starts and ends, so the grader (spmdsim.tools.lab.sandbox) knows
which case was running if the process is killed. A rank count stops at its first failing case; a submission not
yet implemented, or that does not load, stops at once.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import resource
import sys
import threading
import time
from typing import Sequence

from ...runtime.process import release_segments_once
from ...runtime.sim import thread_limits
from .exercise import find_exercise
from .harness import FILE_BYTES, PASS, STOPS, run_case

__all__ = ["main", "set_limits", "keep", "FILE_BYTES"]


def _address_space() -> int:
    """The bytes of address space this process holds now (VmSize)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def set_limits(memory_mb: int, cpu_seconds: float, ranks: int) -> None:
    """Limit this process's further address space to `memory_mb` MiB, besides what `ranks` simulated ranks'
    threads reserve (spmdsim.runtime.sim.thread_limits: a stack each, the malloc arenas), the files it writes to
    FILE_BYTES, and its CPU time to `cpu_seconds` more."""
    if memory_mb > 0:
        stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
        stack = stack if 0 < stack < (1 << 30) else 8 << 20
        arenas = int(os.environ.get("MALLOC_ARENA_MAX", "2") or 2)
        threads = ranks * stack + arenas * thread_limits.ARENA
        room = _address_space() + threads + memory_mb * (1 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (room, room))
    # no file it writes grows past FILE_BYTES (Python ignores SIGXFSZ: the write fails with EFBIG instead)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))
    if cpu_seconds > 0:
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime + cpu_seconds) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1))


def keep(worker: int, path: str) -> int:
    """Wait for the process `worker` and write how it ended to `path` as JSON ({"code", "signal", "cpu": its
    CPU seconds}); return its exit code (128 + the signal where one killed it)."""
    _, status, usage = os.wait4(worker, 0)
    signum = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + signum
    with open(path, "w") as f:
        json.dump({"code": code, "signal": signum, "cpu": usage.ru_utime + usage.ru_stime}, f)
    return code


def _printed() -> int:
    """The bytes the submission has printed so far (its standard output, a file: spmdsim.tools.lab.sandbox), so
    that a time limit run out is put on the case that printed, not on the cases before it."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):  # past FILE_BYTES; a stdout the submission closed or replaced
        pass
    try:
        return os.fstat(1).st_size
    except OSError:
        return 0


def _start_mpi() -> None:
    """Start this process's MPI (importing mpi4py.MPI initializes it) before the first case's clock does:
    the cases' emulator reads it, and Open MPI's start as a singleton takes about a second, which the first
    case's time counted (a quarter of a 4 s limit). Where it does not load, the case says so, as before.
    MPICH's /dev/shm segment of this singleton is unlinked at once (the process keeps its mapping): it ends by
    os._exit, with no MPI_Finalize to unlink it, and a submission that never ran (a syntax error) left 1 MiB
    there until reboot, one for each such submission graded."""
    try:
        from mpi4py import MPI  # optional: its import starts MPI
    except (ImportError, RuntimeError):
        return
    release_segments_once(MPI.COMM_WORLD)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spmdsim.tools.lab.child")
    parser.add_argument("folder")
    parser.add_argument("number")
    parser.add_argument("file")
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, nargs="+", required=True)
    parser.add_argument("--memory-mb", type=int, default=512)
    parser.add_argument("--cpu-seconds", type=float, default=20.0)
    args = parser.parse_args(argv)
    worker = os.fork()  # (no thread runs yet: the ranks' threads start in run_case)
    if worker:
        return keep(worker, args.out + ".exit")
    exercise = find_exercise(args.number, args.folder)
    sys.argv[:] = [args.file]  # the submission's, as `python FILE` sets it: not this process's arguments
    lock = threading.Lock()  # (the ranks' threads each write their line)
    _start_mpi()
    with open(args.out, "a", buffering=1) as out:
        set_limits(args.memory_mb, args.cpu_seconds, max(args.ranks))
        for n in args.ranks:
            for seed in exercise.seeds:
                out.write(json.dumps({"event": "start", "ranks": n, "seed": seed, "time": time.time(),
                                      "printed": _printed()}) + "\n")

                def returned(rank: int, n: int = n, seed: int = seed) -> None:  # a rank's function returned
                    with lock:
                        out.write(json.dumps({"event": "returned", "ranks": n, "seed": seed, "rank": rank}) + "\n")

                def stage(what: str, n: int = n, seed: int = seed) -> None:  # (spmdsim.tools.lab.harness.run_case)
                    with lock:
                        out.write(json.dumps({"event": "stage", "stage": what, "ranks": n, "seed": seed}) + "\n")
                result = run_case(exercise, args.file, n, seed, returned=returned, stage=stage)
                if result.status == "memory":
                    result = dataclasses.replace(result, reason=f"{result.reason} (limit {args.memory_mb} MiB)")
                out.write(json.dumps({"event": "done", **dataclasses.asdict(result)}) + "\n")
                if result.status in STOPS:  # the same at every rank count: said once
                    return 0
                if result.status != PASS:
                    gc.collect()  # what the failed case held (a memory bomb's blocks, kept by its traceback)
                    break
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # Out at once: a thread a submission started and left running (a right answer, then a sleeping thread)
    # would hold the interpreter's exit until the time limit, as if the submission looped.
    os._exit(code)
