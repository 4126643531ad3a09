"""A verdict said for a student (lines within 100 columns) and for a grade book (one CSV row)."""
from __future__ import annotations

from typing import Optional, Sequence

from ...errors import fold_message
from .exercise import Exercise
from .harness import NOT_RUNNABLE, PASS, CaseResult
from .sandbox import Verdict
from .shown import file_name, printable

__all__ = ["bound_line", "verdict_lines", "csv_row", "CSV_HEADER", "VERDICTS"]

CSV_HEADER = ("file", "verdict", "passed", "cases", "reason", "seconds")

#: The verdict word of each status.
VERDICTS = {PASS: "PASS", "not-implemented": "NOT YET IMPLEMENTED", "incomplete": "INCOMPLETE"}


def _ranks(counts: Sequence[int]) -> str:
    counts = sorted(set(counts))
    return f"{', '.join(map(str, counts))} rank{'s' if counts != [1] else ''}"


def verdict_word(verdict: Verdict) -> str:
    return VERDICTS.get(verdict.status, "FAIL")


def _summary(verdict: Verdict) -> str:
    by_count: dict = {}
    for result in verdict.all_results:
        by_count.setdefault(result.ranks, []).append(result.passed)
    good = [n for n, passed in by_count.items() if all(passed)]
    bad = [n for n, passed in by_count.items() if not all(passed)]
    unrun = [n for n in verdict.ranks if n not in by_count]
    parts = [] if bad or good else ["no case ran"]
    bad = [n for n in bad if n]
    if good:
        parts.append(f"passes at {_ranks(good)}")
    if bad:
        parts.append(f"fails at {_ranks(bad)}")
    if unrun:
        parts.append(f"not run at {_ranks(unrun)}")
    return "; ".join(parts)


def bound_line(exercise: Exercise, path: str, ranks: Sequence[int], limit: Optional[float], mpiexec: bool) -> str:
    """What `check` says before it runs (on stderr): the cases it runs and when it stops them (`limit`, None:
    the exercise's), so that a submission that loops is no silent wait."""
    limit = exercise.time_limit if limit is None else limit
    cases = len(ranks) * len(exercise.seeds)
    stops = f"each job stopped {limit:g} s after it starts" if mpiexec else \
        f"stopped {limit:g} s after its first case starts"
    return fold_message(printable(f"checking {file_name(path)} at {_ranks(ranks)}{' under mpiexec' * mpiexec} "
                                  f"({cases} case{'s' * (cases != 1)}), {stops}"))


def verdict_lines(exercise: Exercise, verdict: Verdict) -> list:
    """The verdict of `check`: one line per rank count, then the verdict with the first failure's feedback."""
    name = file_name(verdict.file)
    lines = [f"exercise {exercise.number}, {exercise.title}: {name}"]
    if verdict.status == "not-implemented":
        lines.append(f"NOT YET IMPLEMENTED: {exercise.function}() in {name} still raises NotImplementedError; "
                     f"write it, then run this check again")
        return [fold_message(printable(line)) for line in lines]
    if verdict.status in NOT_RUNNABLE:  # the same at every rank count: said once, not once a rank count
        lines.append(f"FAIL: no case can run ({verdict.passed} of {verdict.cases} cases, {verdict.seconds:.1f} s): "
                     f"{verdict.failure.reason}")
        lines += list(verdict.notes) + _output(verdict)
        return [fold_message(printable(line)) for line in "\n".join(lines).split("\n")]
    by_count: dict = {}
    for result in verdict.all_results:
        by_count.setdefault(result.ranks, []).append(result)
    shown = False
    for n in verdict.ranks:
        results = by_count.get(n, [])
        failed = next((r for r in results if not r.passed), None)
        head = f"  {n:>2} rank{'s' if n != 1 else ' '}: "
        if failed:
            lines.append(head + f"FAIL {failed.reason}")
            if not shown:  # the first failure's feedback in full; the others' first line
                lines.extend(_detail(failed))
                shown = True
        elif results:
            best = results[-1]
            bytes_note = f", busiest rank sent {best.sent:,} B" if best.sent else ""
            bytes_note += f" (optimum {best.optimum:,} B)" if best.optimum is not None and best.sent else ""
            lines.append(head + f"pass ({len(results)} case{'s' if len(results) != 1 else ''}{bytes_note})")
        else:
            lines.append(head + "not run (an earlier rank count stopped the run)")
    if verdict.ended is not None and verdict.ended.ranks not in verdict.ranks:  # it ended before any case
        lines.append(f"  {verdict.ended.reason}")
    word = verdict_word(verdict)
    lines.append(f"{word}: {_summary(verdict)} ({verdict.passed} of {verdict.cases} cases, "
                 f"{verdict.seconds:.1f} s)")
    lines += verdict.notes
    lines += _output(verdict)
    return [fold_message(printable(line)) for line in "\n".join(lines).split("\n")]


def _output(verdict: Verdict) -> list:
    """What the submission's ranks printed, all cases together: its size and first lines (none: nothing)."""
    if not verdict.printed:
        return []
    shown = [line if len(line) <= 92 else line[:89] + "..." for line in verdict.output.splitlines()]
    return [f"its ranks printed {verdict.printed:,} B over the cases run; the first lines:"] + \
        [f"  | {line}" for line in shown]


def _detail(result: CaseResult) -> list:
    """The lines of a failure's feedback under its reason, without the lines the reason already says (a
    deadlock report's head, and its first call)."""
    lines = result.detail.splitlines()
    if lines and lines[0].startswith("simulated ranks"):
        lines = lines[1:]
    return ["       " + line.strip() for line in lines if line.strip() and line.strip() not in result.reason]


def csv_row(verdict: Verdict) -> tuple:
    """One grade-book row: file, verdict, passed cases, cases, the first failure's one-line reason (then the
    source's notes), seconds."""
    failure = verdict.failure
    reason = "" if failure is None else failure.reason.replace("\n", " ")
    if failure is not None and failure.status == "wrong" and failure.detail:  # the exercise's explanation
        reason += ": " + " ".join(failure.detail.split())
    if failure is not None and failure.status == "deadlock":  # why the ranks wait (no Send buffered, a tag)
        advice = [line.strip() for line in failure.detail.splitlines()[1:] if line.strip()]
        if advice and not advice[-1].startswith(("rank ", "ranks ", "a thread ")) and advice[-1] not in reason:
            reason += "; " + advice[-1]
    if verdict.status == "not-implemented":
        reason = "not yet implemented"
    elif verdict.notes:  # (advice beside the reason: the verdict is the cases')
        reason = "; ".join(([reason] if reason else []) + list(verdict.notes))
    return (file_name(verdict.file), verdict_word(verdict), verdict.passed, verdict.cases, printable(reason),
            f"{verdict.seconds:.2f}")
