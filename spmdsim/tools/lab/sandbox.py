"""One submission checked in a child process of its own, under limits of wall time, CPU time and memory.

The child (spmdsim.tools.lab.child) runs the cases and writes each one's result as it ends; this
side waits for it, kills its whole process group once the exercise's time limit has passed since its
first case started, and turns how it ended into the verdict: an endless loop, a memory bomb, sys.exit,
os._exit, an exception or a signal to itself or to its parent (spmdsim.tools.lab.child's keeper) ends
that submission with its reason, never the grader. These are resource limits, not a security sandbox:
the submission runs with the grader's user and its files.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Optional, Sequence

from ...base.validate import counted
from ...errors import SpmdsimError
from ..cli.launch import find_mpiexec
from .ending import case_ended, exercise_fault, exercise_side
from .exercise import Exercise, LabError
from .harness import PASS, STOPS, CaseResult
from .source_notes import source_notes

__all__ = ["Verdict", "Stopped", "check", "check_mpiexec"]

#: Seconds the child may take to load its modules before its first case starts.
STARTUP_SECONDS = 60.0
#: Seconds between two looks at the child.
_POLL = 0.02
#: The lines of a submission's printed output a verdict keeps.
OUTPUT_LINES = 5


@dataclasses.dataclass(frozen=True)
class Verdict:
    """How a submission went on every rank count it ran: its cases' results, and `ended`, the reason a
    killed or crashed child gave no result for the case it was running ("" where it ended normally)."""

    file: str
    ranks: tuple
    cases: int
    results: tuple
    ended: Optional[CaseResult] = None
    seconds: float = 0.0
    printed: int = 0  # the bytes its ranks printed, all cases together
    output: str = ""  # its first lines of them (OUTPUT_LINES)
    notes: tuple = ()  # what its source says may change its grade from run to run (spmdsim.tools.lab.source_notes)

    @property
    def all_results(self) -> tuple:
        return self.results + ((self.ended,) if self.ended else ())

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.results)

    @property
    def failure(self) -> Optional[CaseResult]:
        """The first case that failed, or None."""
        return next((r for r in self.all_results if not r.passed), None)

    @property
    def status(self) -> str:
        failure = self.failure
        return failure.status if failure else PASS if self.passed == self.cases else "incomplete"


def _events(path: str) -> list:
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    events = []
    for line in lines:
        try:
            events.append(json.loads(line))
        except ValueError:  # a line cut short by a kill
            break
    return events


def _exit_status(path: str, code: int) -> tuple:
    """(exit code, CPU seconds) of the process that ran the cases, as its keeper wrote them to `path` (a
    signal's code negative, as subprocess gives it); (`code`, None) where the keeper wrote none (killed)."""
    try:
        with open(path) as f:
            found = json.load(f)
        return (-found["signal"] if found["signal"] else found["code"]), float(found["cpu"])
    except (OSError, ValueError, KeyError, TypeError):
        return code, None


class Stopped(Exception):
    """The grade was stopped (Ctrl-C) while this check ran: its child was killed, it has no verdict."""


def _wait(proc: subprocess.Popen, out: str, limit: float, stop: Optional[threading.Event] = None) -> bool:
    """Wait for the child; kill its process group once `limit` seconds have passed since its first case
    started (or STARTUP_SECONDS before that). Returns whether it was killed; raises Stopped, the child
    killed, once `stop` is set (a grade's Ctrl-C, which reaches only the grader's main thread)."""
    spawned, started = time.monotonic(), None
    try:
        while proc.poll() is None:
            if started is None and os.path.exists(out) and os.path.getsize(out):
                started = time.monotonic()
            deadline = started + limit if started is not None else spawned + STARTUP_SECONDS
            if time.monotonic() > deadline:
                _kill(proc)
                return True
            if stop is not None and stop.is_set():
                raise Stopped()  # (the except below kills the child)
            time.sleep(_POLL)
    except BaseException:  # Ctrl-C: the child, in a session of its own, would outlive the grader
        _kill(proc)
        raise
    return False


def _kill(proc: subprocess.Popen) -> None:
    """Kill the child's whole process group (the processes a submission started too) and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def check(exercise: Exercise, path: str, ranks: Sequence[int] = (), time_limit: Optional[float] = None,
          memory_mb: Optional[int] = None, stop: Optional[threading.Event] = None) -> Verdict:
    """Run the submission at `path` on each rank count in a limited child process; return its verdict (raise
    Stopped, its child killed, once `stop` is set)."""
    ranks = tuple(ranks) or exercise.ranks
    limit = exercise.time_limit if time_limit is None else time_limit
    memory = exercise.memory_mb if memory_mb is None else memory_mb
    folder = os.path.dirname(os.path.abspath(exercise.path))
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="spmdsim-lab-") as tmp:
        out, err, said = (os.path.join(tmp, name) for name in ("cases.jsonl", "stderr", "stdout"))
        command = [sys.executable, "-m", "spmdsim.tools.lab.child", folder, str(exercise.number),
                   os.path.abspath(path), out, "--ranks", *map(str, ranks), "--memory-mb", str(memory),
                   "--cpu-seconds", str(limit)]
        # one BLAS thread and two malloc arenas: the ranks' threads must not reserve the memory limit away
        env = dict(os.environ, MALLOC_ARENA_MAX="2", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        with open(err, "wb") as errors, open(said, "wb") as printing:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=printing, stderr=errors,
                                    cwd=tmp, env=env, start_new_session=True)
            timed_out = _wait(proc, out, limit, stop)
            _kill(proc)  # what the submission started and left running (a `sleep 100` it spawned) ends too
        events, (code, cpu) = _events(out), _exit_status(out + ".exit", proc.returncode)
        with open(err, errors="replace") as f:
            stderr = f.read()[-4000:]
        printed, output = _printed(said)
    results = tuple(CaseResult(**{k: v for k, v in e.items() if k != "event"}) for e in events
                    if e["event"] == "done")
    starts = [e for e in events if e["event"] == "start"]
    running = starts[-1] if len(starts) > len(results) else {}
    if code < 0 and cpu is None and not timed_out and starts:  # its keeper killed: the process ran on, orphaned,
        # till the grader killed it, through as many more cases as the machine's load let it: the kill came from
        # the first case that did not pass (its result, None say, is not the reason; those after it the orphan's)
        results = tuple(itertools.takewhile(lambda r: r.status == PASS, results))
        running = starts[len(results)] if len(results) < len(starts) else {}
    ended = None
    if timed_out or code or running or (not results and not timed_out):
        returns = sum(e["event"] == "returned" and e["ranks"] == running.get("ranks") and
                      e["seed"] == running.get("seed") for e in events)
        before = (len(results), running["time"] - starts[0]["time"], running.get("printed", 0)) if running \
            else (0, 0.0, 0)
        ended = case_ended(code, limit, memory, running, timed_out, stderr, printed, returns, before, cpu,
                           exercise_side(exercise.number, running, events, limit))
        if not starts and stderr.strip() and not timed_out:  # it never began: a bad exercise, say, in its words
            ended = dataclasses.replace(ended, reason=stderr.strip().splitlines()[-1])
    return Verdict(file=path, ranks=ranks, cases=len(ranks) * len(exercise.seeds), results=results, ended=ended,
                   seconds=time.monotonic() - began, printed=printed, output=output,
                   notes=source_notes(path, exercise.function))


def reference_failure(exercise: Exercise, limits: dict) -> Optional[str]:
    """Why the exercise file's own solution, checked as a submission under `limits` (check's), fails its first
    case, or None where it passes or is named `reference` (no submission defines that function)."""
    if getattr(exercise.reference, "__name__", None) != exercise.function:
        return None
    failure = check(exercise, exercise.path, **limits).failure
    return None if failure is None else failure.reason


def _printed(path: str) -> tuple:
    """(bytes, the first OUTPUT_LINES lines) of what the submission printed, read from `path`."""
    size = os.path.getsize(path)
    with open(path, errors="replace") as f:
        head = [f.readline() for _ in range(OUTPUT_LINES)]
    return size, "".join(head)


def _mpi_results(events: list, code: int, n: int, limit: float, errors: str, number: int = 0) -> list:
    """The results of one mpiexec job at `n` ranks of exercise `number`: its lines (the first for each case: ranks
    that fail at once each write one), then, where the job ended mid-case or with an error none of them
    explains, why."""
    results, seen = [], set()
    for event in events:
        key = (event.get("ranks"), event.get("seed"))
        if event["event"] == "done" and key not in seen:
            seen.add(key)
            results.append(CaseResult(**{k: v for k, v in event.items() if k != "event"}))
    starts = [e for e in events if e["event"] == "start"]
    running = starts[-1] if starts and (starts[-1]["ranks"], starts[-1]["seed"]) not in seen else None
    hung = exercise_side(number, running, events, limit) if code == 124 and running is not None else ""
    if hung:  # the exercise file's case() or judging ran on
        results.append(CaseResult(ranks=n, seed=running["seed"], label=f"seed {running['seed']}", status="error",
                                  reason=f"the grader stopped at {counted(n, 'rank')} under mpiexec: {hung}"))
    elif code == 124 and running is not None:  # spmdsim launch's timeout
        results.append(CaseResult(ranks=n, seed=running["seed"], label=f"seed {running['seed']}", status="timeout",
                                  reason=f"ran past the time limit of {limit:g} s at {counted(n, 'rank')} under "
                                         "mpiexec: a deadlock (MPI ranks wait forever) or an endless loop"))
    elif code and (running is not None or all(r.status == PASS for r in results)):
        # A job that ended with an error fails where no case it wrote says why, even after its cases passed:
        # MPICH's MPI_Abort can return before the launcher ends the job, so a rank that called comm.Abort may
        # go on, return its value and have its case written as passed (that case's row is this one instead).
        seed = running["seed"] if running is not None else results.pop().seed if results else 0
        last = _job_said(errors) or f"exit code {code}"
        fault = exercise_fault(last)  # (said as on simulated ranks: exercise 1: case(0, 2) raised ...)
        reason = f"the mpiexec job at {counted(n, 'rank')} ended: {last}" if fault is None else \
            f"the grader stopped at {counted(n, 'rank')}: {fault}"
        results.append(CaseResult(ranks=n, seed=seed, label="", status="exit", reason=reason))
    return results


def _job_said(errors: str) -> str:
    """The last line a job's processes wrote on stderr (MPICH's on an Abort: `application called MPI_Abort(...)`),
    not `spmdsim launch`'s own after them (`spmdsim: removed 1 shared-memory segment the job left: ...`, folded
    over indented lines), nor Open MPI's: its reports between lines of dashes that name it (prterun's on a
    non-zero exit or an abort, MPI_ABORT's), the NUL byte prterun writes after an abort's, its PMIx server's
    line; "" where there is none."""
    lines, launchs, i = [], False, 0
    given = errors.replace("\0", "").strip().splitlines()
    while i < len(given):
        line = given[i]
        end = next((j for j in range(i + 1, len(given)) if _RULE.match(given[j])), None) \
            if _RULE.match(line) else None
        if end is not None and _OPEN_MPI.search("\n".join(given[i:end])):
            i = end + 1
            continue
        launchs = line.startswith("spmdsim: removed ") or launchs and line[:1].isspace()
        if not launchs and line.strip() and not _PMIX_SERVER.match(line):
            lines.append(line)
        i += 1
    return lines[-1] if lines else ""


#: A line of dashes, as Open MPI frames its reports with.
_RULE = re.compile(r"\s*-{20,}\s*$")
#: What names such a report Open MPI's.
_OPEN_MPI = re.compile(r"prterun|mpirun|Open MPI")
#: A line of Open MPI's launcher's PMIx server (its host and pid, then the error and its source file).
_PMIX_SERVER = re.compile(r"\[[\w.-]+:\d+\] PMIX ERROR: \w+ in file \S*/server/\S+ at line \d+$")


def _end_line(path: str) -> None:
    """End the last line of `path` where a job's rank left it unended (print(..., end=''), then an Abort or the
    job's end): a line of its own, as on simulated ranks, not run into the next job's first line."""
    with open(path, "rb+") as f:
        if f.seek(0, os.SEEK_END) and (f.seek(-1, os.SEEK_END), f.read(1))[1] != b"\n":
            f.write(b"\n")


def _tail(file: Any, size: int) -> str:
    """The last `size` bytes of the open binary `file`, as text (undecodable bytes replaced)."""
    file.seek(0, os.SEEK_END)
    file.seek(max(0, file.tell() - size))
    return file.read().decode("utf-8", errors="replace")


def mpiexec_found() -> None:
    """Refuse in one line (LabError) where no mpiexec is found, as `spmdsim launch`, run with this Python, finds
    it: before any job, and before `check --mpiexec` says what it runs."""
    try:
        find_mpiexec()
    except SpmdsimError:
        raise LabError("--mpiexec runs each rank count as an MPI job, and no mpiexec was found beside this Python or "
                       "on PATH: install the 'mpi' extra, or check without --mpiexec (on simulated ranks)") from None


def check_mpiexec(exercise: Exercise, path: str, ranks: Sequence[int] = (), time_limit: Optional[float] = None
                  ) -> Verdict:
    """Run the submission under `spmdsim launch` (mpiexec with a timeout), one job per rank count; its values
    are judged as on simulated ranks, its calls and bytes not (spmdsim.tools.lab.mpi_child), and what its ranks
    print is kept as there. LabError, before any job, where no mpiexec is found: every job failed with launch's
    refusal, a right submission FAIL."""
    mpiexec_found()
    ranks = tuple(ranks) or exercise.ranks
    limit = exercise.time_limit if time_limit is None else time_limit
    folder = os.path.dirname(os.path.abspath(exercise.path))
    began, results = time.monotonic(), []
    with tempfile.TemporaryDirectory(prefix="spmdsim-lab-") as tmp:
        said = os.path.join(tmp, "stdout")  # what the ranks print, every job's (mpiexec's own lines: not theirs)
        open(said, "wb").close()
        for n in ranks:
            out = os.path.join(tmp, f"cases-{n}.jsonl")
            command = [sys.executable, "-m", "spmdsim", "launch", "-n", str(n), "--timeout", str(limit), "--",
                       "python", "-m", "spmdsim.tools.lab.mpi_child", folder, str(exercise.number),
                       os.path.abspath(path), out, "--stdout", said]
            with open(os.path.join(tmp, f"stderr-{n}"), "w+b") as errors:  # a file: megabytes stay on disk
                done = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                                      cwd=tmp)
                found = _mpi_results(_events(out), done.returncode, n, limit, _tail(errors, 4000), exercise.number)
            _end_line(said)
            results.extend(found)
            if any(r.status in STOPS for r in found):  # the same at every rank count
                break
            if any(r.status == "timeout" for r in found):  # as on simulated ranks: a deadlock at every count
                break  # took a time limit at each (50 s, not 10), and the limit bounds the check
        printed, output = _printed(said)
    return Verdict(file=path, ranks=ranks, cases=len(ranks) * len(exercise.seeds), results=tuple(results),
                   seconds=time.monotonic() - began, printed=printed, output=output,
                   notes=source_notes(path, exercise.function))
