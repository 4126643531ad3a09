"""The time and memory limits a check runs with (`spmdsim lab check` and `grade`), each refused in one line where
the grader cannot run with it: a limit that fails every submission alike, given as an option or taken from the
exercise file (its TIME_LIMIT and MEMORY_MB, where no option is given)."""
from __future__ import annotations

from typing import Optional

from ...base.typed_numbers import shown  # a refusal names the value as typed: "0", not "0.0"
from .exercise import Exercise, LabError

__all__ = ["MOST_SECONDS", "MOST_MEMORY_MB", "memory_floor", "checked_limits"]

#: The longest --time-limit taken: a day (the child's CPU limit is a whole number of seconds).
MOST_SECONDS = 86_400
#: The most --memory-mb taken: 1 TiB (a limit the system's RLIMIT_AS, a C long of bytes, holds with room).
MOST_MEMORY_MB = 1 << 20


def memory_floor(ranks: int) -> int:
    """The least --memory-mb a check at `ranks` simulated ranks runs with: the check's own ranks map part of
    it (at 8 ranks 128 MiB failed every case with a ThreadLimitError, 160 passed); 128 + 16 per rank."""
    return 128 + 16 * ranks


def _memory_problem(memory_mb: int, ranks: int) -> Optional[str]:
    """Why a memory limit of `memory_mb` MiB cannot run a check at `ranks` simulated ranks, after the value
    named ("is too little for 8 ranks: ..."), or None."""
    if memory_mb < memory_floor(ranks):
        return (f"is too little for {ranks} ranks: expected at least {memory_floor(ranks)} (the check's own ranks "
                "take part of it)")
    if memory_mb > MOST_MEMORY_MB:
        return f"is out of range; expected {memory_floor(ranks)} to {MOST_MEMORY_MB:,} (1 TiB)"
    return None


def checked_limits(time_limit: Optional[float], memory_mb: Optional[int], ranks: int, exercise: Exercise,
                   simulated: bool = True) -> dict:
    """The time and memory limits given (None: the exercise's), refused in one line (LabError) where the grader
    cannot run with one: `ranks`, the most the check runs on; `simulated`: on simulated ranks, whose memory
    is limited (under --mpiexec it is not, and the exercise's MEMORY_MB is not taken)."""
    if time_limit is not None and not 0 < time_limit <= MOST_SECONDS:
        raise LabError(f"--time-limit {shown(time_limit)} must be a number of seconds above 0 and at most "
                       f"{MOST_SECONDS:,}")
    if memory_mb is not None:
        problem = _memory_problem(memory_mb, ranks)
        if problem:
            raise LabError(f"--memory-mb {memory_mb!r} {problem}")
    elif simulated:
        problem = _memory_problem(exercise.memory_mb, ranks)
        if problem:
            raise LabError(f"exercise {exercise.number}'s MEMORY_MB = {shown(exercise.memory_mb)} {problem}: raise "
                           f"it in {exercise.path}, or give --memory-mb")
    return {"time_limit": time_limit, "memory_mb": memory_mb}
