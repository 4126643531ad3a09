"""One submission on real MPI ranks: ``mpiexec -n N python -m spmdsim.tools.lab.mpi_child FOLDER NUM FILE OUT
[--stdout PATH]``.

Every process runs the exercise's cases with the submission's function on MPI.COMM_WORLD; rank 0
gathers the results, judges their values as on simulated ranks (the calls a submission makes, its
rules and bytes, are seen on simulated ranks only) and writes one JSON line per case to OUT, as the simulated
child does (spmdsim.tools.lab.child). A rank whose submission raises or exits writes its own line
and aborts the job: under MPI the others would wait for it forever. A deadlock or an endless loop
runs into the launcher's timeout (spmdsim launch --timeout), which the parent reports. What the
ranks print goes to PATH, a line at a time (what a rank printed before an abort or a kill is there), all
ranks appending to it and no more than FILE_BYTES in all, as the simulated child's output.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import time
from typing import Sequence

from ...runtime.mpi_library import load_mpi
from ...runtime.engines import engine_of
from .calls import Notes
from .exercise import LabError, find_exercise, helpers_of
from .harness import FILE_BYTES, PASS, call_submission, compile_submission, describe_failure, judge, make_case

__all__ = ["main", "cases_on"]


def _write(out: str, record: dict) -> None:
    with open(out, "a") as f:  # (a line each, appended: ranks that fail at once do not mix their lines)
        f.write(json.dumps(record) + "\n")


def cases_on(comm: object, exercise: object, path: str, out: str) -> bool:
    """Run every case of `exercise` on `comm` (its size the rank count); True where all pass."""
    rank, n = comm.Get_rank(), comm.Get_size()
    path = os.path.abspath(path)
    try:
        code = compile_submission(path)
    except (SyntaxError, LabError) as exc:  # (every rank alike: each reads the same file)
        where = f" at line {exc.lineno}" if getattr(exc, "lineno", None) else ""
        reason = f"syntax error{where}: {exc.msg}" if isinstance(exc, SyntaxError) else str(exc)
        if rank == 0:
            _write(out, {"event": "done", "ranks": n, "seed": exercise.seeds[0], "label": "",
                         "status": "unloadable", "reason": reason})
        return False
    for seed in exercise.seeds:
        if rank == 0:  # (then each stage, as the simulated child writes them: a time limit run out is put on the
            # exercise's case() or judging, or on the submission, whichever ran)
            _write(out, {"event": "start", "ranks": n, "seed": seed, "time": time.time()})
        case = make_case(exercise, seed, n)
        if rank == 0:
            _write(out, {"event": "stage", "stage": "run", "ranks": n, "seed": seed})
        notes = Notes()
        try:
            value = call_submission(exercise, code, path, comm, case["args"][rank], notes)
        except Exception as exc:  # noqa: BLE001 - the submission's failure: said, then the job ends
            exc.simulated_ranks = (rank,)  # (describe_failure names the rank that failed)
            failure = describe_failure(exc, path, n, exercise.signature)
            result = judge(exercise, case, seed, n, None, [notes], failure, rules=False)
            _write(out, {"event": "done", **dataclasses.asdict(result)})
            sys.stdout.flush()  # (a line it began and did not end: Abort ends the process, its buffers unwritten)
            comm.Abort(1)
            raise SystemExit(1) from None
        engine = engine_of(comm)  # control traffic through the engine, as spmdsim's front ends send it
        gathered = engine.gather_object(comm, (value, notes), 0)
        passed = None
        if rank == 0:
            _write(out, {"event": "stage", "stage": "judge", "ranks": n, "seed": seed})
            result = judge(exercise, case, seed, n, [g[0] for g in gathered], [g[1] for g in gathered], None,
                           rules=False)
            _write(out, {"event": "done", **dataclasses.asdict(result)})
            passed = result.status == PASS
        if not engine.broadcast_object(comm, passed, 0):
            return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spmdsim.tools.lab.mpi_child")
    for name in ("folder", "number", "file", "out"):
        parser.add_argument(name)
    parser.add_argument("--stdout", help="the file the ranks' printing is appended to")
    args = parser.parse_args(argv)
    exercise = find_exercise(args.number, args.folder)
    sys.argv[:] = [args.file]  # the submission's, as `python FILE` sets it: not this process's arguments
    world = load_mpi().COMM_WORLD
    if args.stdout:
        _print_to(args.stdout)
    with helpers_of(exercise, args.file):  # (the exercise's own file, checked: its helpers import)
        cases_on(world, exercise, args.file, args.out)
    return 0


def _print_to(path: str) -> None:
    """Send this rank's standard output to the end of `path`, a line at a time (a line each write: the ranks'
    lines do not mix), and let no file it writes grow past FILE_BYTES (the write fails with EFBIG, as the
    simulated child's does); set once MPI has made its shared-memory files."""
    sys.stdout.flush()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.dup2(fd, 1)
    os.close(fd)
    # a buffer of its own, written a line at a time (PYTHONUNBUFFERED, or -u, wrote each of print's pieces alone)
    sys.stdout = open(1, "w", buffering=1, encoding=sys.stdout.encoding, errors=sys.stdout.errors, closefd=False)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES, FILE_BYTES))


if __name__ == "__main__":
    sys.exit(main())
