"""How a checked submission's child process that gave no result for its case ended, said as that case's result
(spmdsim.tools.lab.sandbox): a time limit run out (in the submission, in a thread it left running, in its
printing, or in the exercise file's own case() or judging), the CPU limit, a signal, a memory bomb, an exit,
or an exercise file's fault (LabError) said in its own words.
"""
from __future__ import annotations

import os
import signal
from typing import Optional

from ...base.threads import cores_available
from ...base.validate import counted
from .exercise import LabError
from .harness import CaseResult

__all__ = ["LOUD", "case_ended", "exercise_side", "exercise_fault"]

#: Printed bytes past which a timeout is said to be the printing's.
LOUD = 1 << 20


def _signal_name(signum: int) -> str:
    """'9 (SIGKILL)': a signal's number and name."""
    try:
        return f"{signum} ({signal.Signals(signum).name})"
    except ValueError:
        return str(signum)


def case_ended(code: int, limit: float, memory_mb: int, running: dict, timed_out: bool, errors: str,
               printed: int = 0, returns: int = 0, before: tuple = (0, 0.0, 0), cpu: Optional[float] = 0.0,
               hung: str = "") -> CaseResult:
    """The result of the case the child was running when it was killed or died (`running`: its start event;
    `printed`: the bytes the submission printed, which a time limit may have run out on; `returns`: how many
    of its ranks' functions had returned; `before`: the cases that ended before it, their seconds and the bytes
    they printed; `cpu`: the CPU seconds it used, None where its keeper was killed and gave none; `hung`: the
    exercise file's code that was running then, said, or "" for the submission's: `exercise_side`)."""
    n, seed = running.get("ranks", 0), running.get("seed", 0)
    where = f" at {n} rank{'s' if n != 1 else ''} (seed {seed})" if running else ""
    cases, seconds, loud = before
    out_of_cpu = code == -signal.SIGXCPU or code == -signal.SIGKILL and cpu is not None and cpu >= limit
    if hung and running and (timed_out or out_of_cpu):
        status, reason = "error", f"the grader stopped{where}: {hung}"
    elif timed_out and running and returns >= n:
        status, reason = "timeout", (f"ran past the time limit of {limit:g} s{where}: every rank returned its "
                                     "result, but a thread a rank started still runs (a rank ends with its "
                                     "threads): join the threads you start")
    elif timed_out and printed - loud >= LOUD:  # this case was printing megabytes: slow cases before it or not
        status, reason = "timeout", (f"ran past the time limit of {limit:g} s{where} while printing "
                                     f"{printed / 1e6:.1f} MB: print less (each line takes tens of us here)")
    elif timed_out and cases and seconds >= limit / 2:  # a slow solution, its cases right so far
        took = f"took {seconds:.1f} s of it" + (f", printing {loud / 1e6:.1f} MB" if loud >= LOUD else "")
        slow = "too slow (print less)" if loud >= LOUD else "too slow"  # (printing, or an endless loop here)
        status, reason = "timeout", (f"ran past the time limit of {limit:g} s{where}, a limit for all cases "
                                     f"together: the {counted(cases, 'case')} before it {took}: {slow}, or an "
                                     "endless loop in this case")
    elif timed_out:
        status, reason = "timeout", (f"ran past the time limit of {limit:g} s{where}: an endless loop, or a rank "
                                     "waiting for a message no rank sends")
    elif out_of_cpu:
        status, reason = "cpu", f"used more than its {limit:g} s of CPU time{where}: an endless loop?"
    elif code < 0 and cpu is None:  # its parent, the keeper (spmdsim.tools.lab.child), killed: not by a limit
        status, reason = "error", (f"the process that watches it was killed by signal {_signal_name(-code)}"
                                   f"{where}: a submission must not signal other processes")
    elif code < 0:
        status, reason = "error", f"the process was killed by signal {_signal_name(-code)}{where}"
    else:
        last = errors.strip().splitlines()[-1] if errors.strip() else ""
        stopped = "Error" in last.partition(":")[0]
        fault = exercise_fault(last)
        last = last if fault is None else fault
        status = "memory" if "MemoryError" in last else "exit" if code else "error"
        reason = (f"ran out of memory{where} (limit {memory_mb} MiB)" if status == "memory" else
                  f"the grader stopped{where}: {last}" if stopped else
                  f"the process ended{where} with exit code {code}" if code else
                  f"the process ended{where} without a result")
    if status == "timeout":
        reason += _busy()
    return CaseResult(ranks=n, seed=seed, label=f"seed {seed}", status=status, reason=reason)


def exercise_side(number: int, running: dict, events: list, limit: float) -> str:
    """What of the exercise file ran in the case `running` (its start event), by the child's last stage event
    for it (spmdsim.tools.lab.harness.run_case), said as having run past the time `limit`: its case(), before
    the submission ran; its judging, after (either said as the exercise file's endless loop); "" while the
    submission ran, or where no case was running."""
    if not running:
        return ""
    key = (running.get("ranks"), running.get("seed"))
    stage = next((e["stage"] for e in reversed(events) if e["event"] == "stage" and (e["ranks"], e["seed"]) == key),
                 "case")
    if stage == "case":
        ran = (f"exercise {number}'s case({key[1]}, {key[0]}) ran past the time limit of {limit:g} s before the "
               "submission ran")
    elif stage == "judge":
        ran = (f"exercise {number}'s judging of the results (its explain, sends, partners or optimal_bytes) ran "
               f"past the time limit of {limit:g} s after the submission returned")
    else:
        return ""
    return f"{ran}: an endless loop in the exercise file, not in the submission"


#: How a traceback's last line names LabError (spmdsim.tools.lab.exercise), whose message says all.
_LAB_ERROR = f"{LabError.__module__}.{LabError.__qualname__}: "


def exercise_fault(line: str) -> Optional[str]:
    """The exercise file's fault that a traceback's last `line` says, in its own words ("exercise 1: case(0, 2)
    raised KeyError: 'y'", LabError's message without its module's path), or None where `line` is no
    LabError's: on simulated ranks and under mpiexec alike."""
    return line[len(_LAB_ERROR):] if line.startswith(_LAB_ERROR) else None


def _busy() -> str:
    """Said after a time limit ran out where this machine's load is above twice its cores, else "": the limit is
    wall time, and a right submission that takes 1 s on an idle machine can take ten on such a one."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # (not on every system)
        return ""
    cores = cores_available()
    return "" if load <= 2 * cores else (f" (this machine is busy, load {load:.1f} on {counted(cores, 'core')}: "
                                         "check again when it is not, or give more time with --time-limit)")
