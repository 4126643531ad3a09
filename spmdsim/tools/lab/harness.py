"""One submission on one case: its function run on n simulated ranks, judged against the exercise.

`run_case` runs in the calling process, with no limit of time or memory: the grader calls it inside a
limited child process (spmdsim.tools.lab.sandbox); tests call it directly on submissions that end.
"""
from __future__ import annotations

import builtins
import copy
import dataclasses
import functools
import hashlib
import numbers
import os
from typing import Any, Callable, Optional

from ...base.source import SourceDecodeError, decode_source
from ...emulator.comm import world
from ...emulator.mpi4py_world import swapped
from ...emulator.rank_random import adopt, own_generators
from ...runtime.sim.os_exit import OsExit, os_exit_ends_the_rank
from ...runtime.sim.run import current_rank, simulate
from .calls import Notes, missing, strangers, too_many, unknown_rule, violation, watching
from .compare import first_difference
from .contents import uncarried
from .exercise import Exercise, LabError, guarded, helpers_of, meant_for
from .failure import FILE_BYTES, NOT_RUNNABLE, Exited, MissingFunction, at_line, describe_failure, ranks_text

__all__ = ["CaseResult", "EAGER_LIMIT", "FILE_BYTES", "run_case", "judge", "make_case", "compile_submission",
           "describe_failure", "call_submission", "PASS", "STOPS", "NOT_RUNNABLE"]

PASS = "pass"
#: The statuses that end a check at its first case: the same at every rank count (failure.NOT_RUNNABLE).
STOPS = ("not-implemented", *NOT_RUNNABLE)

#: The grader's eager limit (spmdsim.runtime.sim.run.simulate): no standard Send is buffered, each waits for its
#: receive, so that a submission relying on MPI buffering its Sends (unsafe, by the MPI standard: a ring of Send
#: then Recv) deadlocks at every message size, not only past MPICH's 8 KiB.
EAGER_LIMIT = 0


def _misuses(result: "CaseResult", results: Any, path: str) -> "CaseResult":
    """A wrong result's feedback with what the ranks did that MPI forbids and that leaves values undefined, as
    the simulation noted it (spmdsim.runtime.sim.run.simulate): the first send buffer written before its send
    completed, the first request never completed (an Irecv whose message never reached its buffer)."""
    notes = [at_line(lines[0], path) for lines in (getattr(results, "rewritten", ()),
                                                   getattr(results, "uncompleted", ())) if lines]
    return dataclasses.replace(result, detail="\n".join([result.detail, *notes]).strip()) if notes else result


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """How one case went: `status` is pass, not-implemented, unloadable, no-function, wrong, deadlock, error, exit,
    memory, forbidden, bytes, timeout or cpu; `reason` is one line (a CSV cell), `detail` the lines of feedback
    under it."""

    ranks: int
    seed: int
    label: str
    status: str
    reason: str = ""
    detail: str = ""
    sent: int = 0
    optimum: Optional[int] = None

    @property
    def passed(self) -> bool:
        return self.status == PASS


def compile_submission(path: str) -> Any:
    """The submission's code; LabError naming it where it cannot be read, is empty or is not Python text."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError as exc:
        raise LabError(f"{name} cannot be read: {exc.strerror or exc}") from None
    if not source.strip():
        raise LabError(f"{name} is empty")
    if b"\0" in source:
        raise LabError(f"{name} is not a Python source file (it holds null bytes)")
    return compile(_text(name, source), os.path.abspath(path), "exec")


@functools.lru_cache(maxsize=4)
def _compiled_as(path: str, digest: str) -> Any:
    """compile_submission(path) for the file whose bytes have the SHA-256 `digest`: compiled once for all the
    cases of a check, not once a case (a 4 MB file took a second each, and ran a right check out of its time
    limit)."""
    return compile_submission(path)


def _compiled(path: str) -> Any:
    """The submission's code, compiled once while its bytes stay the same; LabError or SyntaxError as
    compile_submission raises them."""
    try:
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return compile_submission(path)  # (it says why the file cannot be read)
    return _compiled_as(path, digest)


def _text(name: str, source: bytes) -> str:
    """`source` decoded as ``python file.py`` reads it (spmdsim.base.source); LabError where python would refuse
    it."""
    try:
        return decode_source(source)
    except SourceDecodeError as exc:
        if exc.declaration:
            raise LabError(f"{name}: {exc.declaration} (on its first two lines), which Python refuses") from None
        raise LabError(f"{name} is not {exc.codec.upper()} text (byte {exc.byte:#04x} at line {exc.line}) "
                       "and Python refuses to run it: save it as UTF-8, or declare its coding on its first line "
                       "(# -*- coding: latin-1 -*-)") from None


def call_submission(exercise: Exercise, code: Any, path: str, comm: Any, args: tuple, notes: Notes) -> Any:
    """Load the submission's `code` as a module of this rank's own, and call its function on `comm` and a
    copy of `args`, its MPI calls noted in `notes`; sys.exit or os._exit in it raises Exited."""
    scope = {"__name__": "submission", "__file__": path, "__builtins__": builtins}
    try:
        exec(code, scope)
        function = scope.get(exercise.function)
        if not callable(function):
            own = [name for name, value in scope.items() if getattr(value, "__module__", "") == "submission"
                   and callable(value) and not name.startswith("_")]
            defines = f" (it defines {', '.join(own[:4])}{meant_for(exercise, own)})" if own else ""
            raise MissingFunction(f"{os.path.basename(path)} defines no function {exercise.function!r}{defines}: "
                           f"def {exercise.signature}")
        with watching(path, notes):
            return function(comm, *copy.deepcopy(tuple(args)))
    except SystemExit as exc:
        raise Exited("sys.exit", exc.code).with_traceback(exc.__traceback__) from None
    except OsExit as exc:  # os._exit on the rank (os_exit_ends_the_rank): ends the run, not the grader
        raise Exited("os._exit", exc.code).with_traceback(exc.__traceback__) from None


def _per_rank(exercise: Exercise, code: Any, path: str, case: dict, notes: list,
              returned: Optional[Callable[[int], None]] = None) -> Any:
    """What each simulated rank runs: the submission called on its world and its own arguments; `returned`
    told the rank once its function returned (the rank itself ends when the threads it started end)."""
    rank = current_rank()
    adopt()  # its own random and numpy.random generators, as an MPI process has: random.seed(0) seeds its own
    # The emulator's world itself: `from mpi4py import MPI` gives the real module where this process
    # imported it before (the package's attribute is read before sys.modules), a one-rank MPI world.
    value = call_submission(exercise, code, path, world(), case["args"][rank], notes[rank])
    if returned is not None:
        returned(rank)
    return value


def make_case(exercise: Exercise, seed: int, n: int) -> dict:
    case = guarded(exercise, "case")(seed, n)  # (raising: one line naming the instructor's generator)
    strange = unknown_rule({"FORBIDDEN": exercise.forbidden, "ALLOWED": exercise.allowed or (),
                            "REQUIRED": exercise.required, "MOST_CALLS": dict(exercise.most_calls)})
    if strange:
        raise LabError(f"exercise {exercise.number}: {strange}")
    given = _counts(case)
    if given != f"{n} 'args' and {n} 'expected'":
        raise LabError(f"exercise {exercise.number}: case({seed}, {n}) returned {given}; expected a dict with {n} "
                       f"'args' and {n} 'expected', one per rank")
    wanted = _parameters(exercise.signature)
    for rank, args in enumerate(case["args"]):
        if not isinstance(args, (tuple, list)) or (wanted is not None and len(args) != len(wanted)):
            shown = f"{len(args)} argument{'s' * (len(args) != 1)}" if isinstance(args, (tuple, list)) else \
                f"a value of type {type(args).__name__}"
            raise LabError(f"exercise {exercise.number}: case({seed}, {n}) gives rank {rank} {shown}; expected a "
                           f"tuple ({', '.join(wanted or ['...'])}{',' * (len(wanted or ()) == 1)}), the arguments "
                           f"{exercise.signature} takes after comm")
    return case


def _counts(case: Any) -> str:
    """What an exercise's case() returned, said by its count of 'args' and 'expected' ("2 'args' and 2
    'expected'"), or its type where it is not a dict of such lists."""
    if not isinstance(case, dict):
        return f"a {type(case).__name__}"
    try:
        return f"{len(case.get('args', ()))} 'args' and {len(case.get('expected', ()))} 'expected'"
    except TypeError:  # a value with no length
        return f"'args' of type {type(case.get('args')).__name__} and 'expected' of type " \
               f"{type(case.get('expected')).__name__}"


def _parameters(signature: str) -> Optional[list]:
    """The parameters an exercise's SIGNATURE names after the communicator ("dot(comm, x, y)": x, y), or None where
    one has a default or is a * or ** parameter (any count of arguments may do), or an annotation whose brackets
    may hold commas."""
    inside = signature[signature.index("(") + 1:-1]
    names = [name.strip() for name in inside.split(",") if name.strip()][1:]
    return None if any(mark in inside for mark in "=*[(:") else names


def run_case(exercise: Exercise, path: str, n: int, seed: int, eager_limit: int = EAGER_LIMIT,
             returned: Optional[Callable[[int], None]] = None,
             stage: Optional[Callable[[str], None]] = None) -> CaseResult:
    """Run the submission at `path` on `n` simulated ranks on the exercise's case `seed`, and judge it; a
    standard Send of `eager_limit` bytes or more waits for its receive. `returned(rank)`: as `_per_rank`'s;
    `stage(what)`: told "run" once the exercise's case() is made, "judge" once the ranks ended (so that a time
    limit run out is put on the exercise file's functions or on the submission, whichever ran)."""
    stage = stage or (lambda what: None)
    path = os.path.abspath(path)
    case = make_case(exercise, seed, n)
    stage("run")
    label = str(case.get("label", f"seed {seed}"))
    try:
        code = _compiled(path)
    except SyntaxError as exc:
        where = f" at line {exc.lineno}" if exc.lineno else ""
        return CaseResult(n, seed, label, status="unloadable", reason=f"syntax error{where}: {exc.msg}")
    except LabError as exc:  # unreadable, empty, not text: the submission's verdict, not the grader's stop
        return CaseResult(n, seed, label, status="unloadable", reason=str(exc))
    notes = [Notes(payloads=[] if exercise.sends else None) for _ in range(n)]
    failure, results = None, None
    try:
        with helpers_of(exercise, path), swapped(), os_exit_ends_the_rank(), own_generators():
            results = simulate(n, _per_rank, exercise, code, path, case, notes, returned, eager_limit=eager_limit)
    except Exception as exc:  # noqa: BLE001 - any failure of the submission is its verdict
        failure = describe_failure(exc, path, n, exercise.signature)
    except BaseException as exc:  # a rank's KeyboardInterrupt, or a class of its own on BaseException: its
        if not getattr(exc, "simulated_ranks", None):  # verdict (a real Ctrl-C, in no rank, stops the check)
            raise
        failure = describe_failure(exc, path, n, exercise.signature)
    stage("judge")
    result = judge(exercise, case, seed, n, results, notes, failure)
    return _misuses(result, results, path) if result.status == "wrong" else result


def judge(exercise: Exercise, case: dict, seed: int, n: int, results: Optional[list], notes: list,
          failure: Optional[tuple], rules: bool = True) -> CaseResult:
    """The verdict of one case from the ranks' `results` (or the `failure` that ended the run: status,
    reason, detail) and the calls in `notes`: not implemented, a forbidden call, the failure, a wrong value, a
    required call never made, one call too many, more bytes than the optimum, a send to a rank the exercise's
    algorithm does not address, or a pass. Without `rules` (under mpiexec, where the calls are not seen) the
    values alone."""
    label = str(case.get("label", f"seed {seed}"))
    result = dict(ranks=n, seed=seed, label=label)
    if failure and failure[0] == "not-implemented":
        return CaseResult(**result, status=failure[0], reason=failure[1], detail=failure[2])
    sent = max(note.sent for note in notes)
    broken = violation(notes, exercise.forbidden, exercise.allowed) if rules else None
    if broken:  # first: a forbidden call may well give the right answer
        hint = f": {exercise.hint}" if exercise.hint and "not allowed" in broken else ""
        return CaseResult(**result, status="forbidden", reason=broken + hint, sent=sent)
    if failure:
        return CaseResult(**result, status=failure[0], reason=failure[1], detail=failure[2], sent=sent)
    wrong = first_difference(results, case["expected"], case["args"], exercise.rtol, exercise.atol,
                             _explainer(exercise), case, array_like=exercise.array_like)
    if wrong:
        reason, _, detail = wrong.partition("\n")
        return CaseResult(**result, status="wrong", reason=f"wrong at {ranks_text(n)} ({label}): {reason}",
                          detail=detail.strip(), sent=sent)
    unmade = missing(notes, exercise.required) if rules else None
    if unmade:
        return CaseResult(**result, status="forbidden", reason=unmade, sent=sent)
    extra = too_many(notes, dict(exercise.most_calls)) if rules else None
    if extra:
        return CaseResult(**result, status="forbidden", reason=extra + (f": {exercise.hint}" if exercise.hint else ""),
                          sent=sent)
    optimum = _budget(exercise, case, n) if exercise.optimal_bytes and rules else None
    if optimum and not sent and n > 1:  # right values no message carried: the ranks' threads shared memory (one
        # rank has no other to share with: a budget above 0 there is the exercise's, as Scan's at 1 rank)
        return CaseResult(**result, status="bytes", sent=0, optimum=optimum,
                          reason=f"no rank sent a byte at {ranks_text(n)} ({label}), yet the algorithm needs "
                                 f"{optimum:,} B from its busiest rank: the values went through memory the "
                                 "simulated ranks share (threads of one process), which MPI ranks do not")
    if optimum is not None and sent > optimum:
        return CaseResult(**result, status="bytes", sent=sent, optimum=optimum,
                          reason=_too_many_bytes(notes, optimum, n, label, exercise.hint))
    astray = strangers(notes, guarded(exercise, "partners")) if rules and exercise.partners else None
    if astray:  # right values within the bytes, by another algorithm's messages
        return CaseResult(**result, status="forbidden", reason=astray + (f": {exercise.hint}" if exercise.hint else ""),
                          sent=sent, optimum=optimum)
    idle = _idle(exercise, case, notes, n, label) if rules and exercise.sends else None
    if idle:  # right values, the messages there, another rank's work in them
        return CaseResult(**result, status="forbidden", reason=idle, sent=sent, optimum=optimum)
    return CaseResult(**result, status=PASS, sent=sent, optimum=optimum)


def _explainer(exercise: Exercise) -> Optional[Callable[..., Optional[str]]]:
    """The exercise's explain(case, n, rank, got), said where it raises as the exercise file's fault
    ("exercise 1: explain(case, 2, 0, <ndarray>) raised KeyError: 'y'") under the wrong result it was asked
    about, which stays the verdict; None where the exercise has none."""
    if exercise.explain is None:
        return None
    explain = guarded(exercise, "explain")

    def call(*args: Any) -> Optional[str]:
        try:
            return explain(*args)
        except LabError as exc:
            return str(exc)

    return call


def _budget(exercise: Exercise, case: dict, n: int) -> Optional[int]:
    """The exercise's optimal_bytes(case, n): a count of bytes, or None (no budget at n); LabError naming what it
    returned where it is neither ("48", a str, compared with the bytes sent raised TypeError)."""
    optimum = guarded(exercise, "optimal_bytes")(case, n)
    if optimum is not None and (not isinstance(optimum, numbers.Real) or isinstance(optimum, bool)
                                or not optimum >= 0):
        raise LabError(f"the exercise's optimal_bytes(case, {n}) returned {optimum!r}: expected a count of bytes "
                       "(a number, 0 or more)")
    return optimum


def _idle(exercise: Exercise, case: dict, notes: list, n: int, label: str) -> Optional[str]:
    """The reason of a case in which a rank's messages carried none of a value the exercise's `sends` names as
    its work (spmdsim.tools.lab.contents), or None."""
    if any(note.payloads is None for note in notes):  # (notes made without payloads: nothing to judge)
        return None
    missed = uncarried([note.payloads for note in notes], guarded(exercise, "sends"), case, exercise.rtol,
                       exercise.atol)
    if missed is None:
        return None
    rank, what = missed
    return (f"rank {rank}'s messages at {ranks_text(n)} ({label}) carried no {what}: in this exercise's algorithm "
            f"rank {rank} computes it and sends it, not another rank")


def _too_many_bytes(notes: list, optimum: int, n: int, label: str, hint: Optional[str]) -> str:
    """The reason of a case whose busiest rank sent more than `optimum` bytes: that rank, its bytes, the call
    (and line) that carried the most of them, the optimum and the exercise's `hint`."""
    busiest = max(range(n), key=lambda r: notes[r].sent)
    sent = notes[busiest].sent
    heaviest, by = notes[busiest].heaviest(), ""
    if heaviest:
        call, line, most = heaviest
        by = f"; {call} at line {line} sent {'all' if most == sent else f'{most:,} B'} of them"
    return (f"rank {busiest} sent {sent:,} B at {ranks_text(n)} ({label}); the algorithm needs {optimum:,} B from "
            f"its busiest rank{by}" + (f": {hint}" if hint else ""))
