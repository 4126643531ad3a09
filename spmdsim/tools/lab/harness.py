"""One submission on one case: its function run on n simulated ranks, judged against the exercise.

`run_case` runs in the calling process, with no limit of time or memory: the grader calls it inside a
limited child process (spmdsim.tools.lab.sandbox); tests call it directly on submissions that end.
"""
from __future__ import annotations

import builtins
import contextlib
import copy
import dataclasses
import errno
import functools
import hashlib
import os
import re
import traceback
from typing import Any, Callable, Iterator, Optional

from ...base.source import SourceDecodeError, decode_source
from ...emulator.comm import world
from ...emulator.mpi4py_world import swapped
from ...errors import RuntimeMismatchError
from ...runtime.sim.run import current_rank, simulate
from .calls import COLLECTIVES, POINT_TO_POINT, Notes, missing, too_many, violation, watching
from .compare import first_difference
from .exercise import Exercise, LabError

__all__ = ["CaseResult", "EAGER_LIMIT", "run_case", "judge", "make_case", "compile_submission", "describe_failure",
           "call_submission", "PASS"]

PASS = "pass"

#: The grader's eager limit (spmdsim.runtime.sim.run.simulate): no standard Send is buffered, each waits for its
#: receive, so that a submission relying on MPI buffering its Sends (unsafe, by the MPI standard: a ring of Send
#: then Recv) deadlocks at every message size, not only past MPICH's 8 KiB.
EAGER_LIMIT = 0

#: A call of the emulator's deadlock report: "recv from group rank 1 (any tag) on the world: rank 0 waits in it;
#: rank 1 finished; at prog.py:9", said here "rank 0 waits in recv from ... (rank 1 finished) at line 9".
_WAITS = re.compile(r"(\s*)(.+?): ((?:rank|ranks) .+?) (waits?) in it((?:; .*)?)")


def _deadlock_text(report: str, path: str) -> str:
    """The emulator's deadlock report (spmdsim.runtime.sim.report), each waiting call said from the rank's side, its
    program line as the submission's line number."""
    lines = []
    for line in report.replace("\n    ", " ").split("\n"):  # its folded calls, one a line again
        match = _WAITS.fullmatch(line)
        if match:
            indent, what, who, verb, tail = match.groups()
            parts = [part for part in tail.split("; ") if part]
            at = [part for part in parts if part.startswith("at ")]
            others = [part for part in parts if not part.startswith("at ")]
            line = (f"{indent}{who} {verb} in {what}" + (f" ({'; '.join(others)})" if others else "")
                    + (f" {at[-1]}" if at else ""))
        lines.append(_at_line(line, path))
    return "\n".join(lines)


def _at_line(text: str, path: str) -> str:
    """`text` with each place in the submission, "prog.py:9", said as "line 9"."""
    return re.sub(rf"(?<![\w/]){re.escape(os.path.basename(path))}:(\d+)", r"line \1", text)


def _misuses(result: "CaseResult", results: Any, path: str) -> "CaseResult":
    """A wrong result's feedback with what the ranks did that MPI forbids and that leaves values undefined, as
    the simulation noted it (spmdsim.runtime.sim.run.simulate): the first send buffer written before its send
    completed, the first request never completed (an Irecv whose message never reached its buffer)."""
    notes = [_at_line(lines[0], path) for lines in (getattr(results, "rewritten", ()),
                                                   getattr(results, "uncompleted", ())) if lines]
    return dataclasses.replace(result, detail="\n".join([result.detail, *notes]).strip()) if notes else result


@dataclasses.dataclass(frozen=True)
class CaseResult:
    """How one case went: `status` is pass, not-implemented, wrong, deadlock, error, exit, memory, forbidden,
    bytes, timeout or cpu; `reason` is one line (a CSV cell), `detail` the lines of feedback under it."""

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


class _Exited(Exception):
    """A rank called sys.exit or os._exit: it ends the run, not the grader."""

    def __init__(self, call: str, code: Any) -> None:
        super().__init__(f"{call}({code!r})")
        self.call = call
        self.code = code


class _Missing(Exception):
    """The submission defines no function of the exercise's name."""


@contextlib.contextmanager
def _os_exit_raises() -> Iterator[None]:
    """While the ranks run, os._exit on a simulated rank raises _Exited there; elsewhere it is Python's."""
    real = os._exit

    def _exit(code: int) -> None:
        if current_rank() is None:
            real(code)
        raise _Exited("os._exit", code)

    os._exit = _exit
    try:
        yield
    finally:
        os._exit = real


def _ranks(n: int) -> str:
    return f"{n} rank{'s' if n != 1 else ''}"


#: The most bytes a submission may write to its files and its output together (spmdsim.tools.lab.child's limit).
FILE_BYTES = 64 << 20


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


def _line(exc: BaseException, path: str) -> Optional[int]:
    """The submission's line where `exc` was raised (its innermost frame in the file)."""
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    if isinstance(exc, SyntaxError) and exc.filename == path:
        return exc.lineno
    return lines[-1] if lines else None


def _beside(path: str, module: str) -> str:
    """The file or folder beside the submission at `path` that holds `module` ("helpers.py"), or ""."""
    top = module.split(".")[0]
    where = os.path.join(os.path.dirname(path), top)
    return "" if not top else f"{top}.py" if os.path.isfile(where + ".py") else f"{top}/" if os.path.isdir(where) \
        else ""


#: What a communicator has that an argument in its place (an array) has not: `x.Get_size()` on the wrong argument.
_COMM_ATTRIBUTES = COLLECTIVES | POINT_TO_POINT | {"Get_size", "Get_rank", "size", "rank", "Create_cart", "Split"}


def _call_hint(exc: BaseException, line: Optional[int], signature: str) -> str:
    """How the check calls the function, where `exc` says the submission takes its arguments otherwise: a
    TypeError of the call itself (no line of the submission), or a communicator's method asked of another
    argument (`def f(x, comm)`); else ""."""
    if not signature:
        return ""
    if isinstance(exc, TypeError) and line is None:
        return f": the check calls {signature}"
    if isinstance(exc, AttributeError) and getattr(exc, "name", None) in _COMM_ATTRIBUTES and \
            not hasattr(getattr(exc, "obj", None), "Get_rank"):
        return f": the check calls {signature}, the communicator first"
    return ""


def describe_failure(exc: BaseException, path: str, n: int, signature: str = "") -> tuple:
    """(status, reason, detail) of a run that ended with `exc`, with the exercise's `signature`
    ("ring_pass(comm, x)"); a NotImplementedError is the starter's (not yet implemented) where it says
    nothing or the function's name, as the starter's does, and the submission's own error where it says
    something else ("only powers of two")."""
    function = signature.partition("(")[0]
    ranks = getattr(exc, "simulated_ranks", ()) or ()
    who = f"rank {ranks[0]}" if len(ranks) == 1 else "every rank" if len(ranks) == n and n > 1 else \
        f"ranks {', '.join(map(str, ranks))}" if ranks else "a rank"
    line = _line(exc, path)
    at = f" at line {line}" if line else ""
    if isinstance(exc, NotImplementedError) and str(exc) in ("", function):
        return "not-implemented", "not yet implemented", "the function still raises NotImplementedError: write it"
    if isinstance(exc, _Missing):
        return "error", str(exc), ""
    if isinstance(exc, RuntimeMismatchError):
        text = _deadlock_text(str(exc), path)
        head, _, rest = text.partition("\n")
        first = rest.strip().splitlines()[0] if rest.strip() else ""
        status = "deadlock" if "deadlock" in head else "mismatch"
        return status, f"{status} at {_ranks(n)}: {first or head}", text
    if getattr(exc, "abort_code", None) is not None:  # comm.Abort(code): MPI ends the job
        return "exit", f"{who} called comm.Abort({exc.abort_code}){at}: return the result instead", ""
    if isinstance(exc, _Exited):
        return "exit", f"{who} called {exc}{at}: return the result instead of exiting", ""
    if isinstance(exc, MemoryError):
        return "memory", f"{who} ran out of memory{at}", ""
    if isinstance(exc, EOFError):
        return "error", f"{who} read standard input{at}, which a check does not give: take the function's " \
                        "arguments instead", ""
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        return "error", f"{who} wrote past the {FILE_BYTES >> 20} MiB a submission may write{at} (its " \
                        "printed output and files together): print less", ""
    if isinstance(exc, SyntaxError) and line:
        return "error", f"syntax error at line {line}: {exc.msg}", ""
    beside = _beside(path, exc.name or "") if isinstance(exc, ModuleNotFoundError) else ""
    if beside:  # `python prog.py` finds it there; a check, as a grade, takes the one file
        return "error", f"{who} raised ModuleNotFoundError{at}: no module named {exc.name!r}: a submission is " \
                        f"one file, and {beside} beside it is not on the path: put what it uses into " \
                        f"{os.path.basename(path)}", ""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = "MPI.Exception" if type(exc).__module__ == "mpi4py.MPI" else type(exc).__name__
    return "error", f"{who} raised {name}{at}" + (f": {message}" if message else "") + \
        _call_hint(exc, line, signature), ""


def call_submission(exercise: Exercise, code: Any, path: str, comm: Any, args: tuple, notes: Notes) -> Any:
    """Load the submission's `code` as a module of this rank's own, and call its function on `comm` and a
    copy of `args`, its MPI calls noted in `notes`; sys.exit in it raises _Exited."""
    scope = {"__name__": "submission", "__file__": path, "__builtins__": builtins}
    try:
        exec(code, scope)
        function = scope.get(exercise.function)
        if not callable(function):
            own = [name for name, value in scope.items() if getattr(value, "__module__", "") == "submission"
                   and callable(value) and not name.startswith("_")]
            defines = f" (it defines {', '.join(own[:4])})" if own else ""
            raise _Missing(f"{os.path.basename(path)} defines no function {exercise.function!r}{defines}: "
                           f"def {exercise.signature}")
        with watching(path, notes):
            return function(comm, *copy.deepcopy(tuple(args)))
    except SystemExit as exc:
        raise _Exited("sys.exit", exc.code).with_traceback(exc.__traceback__) from None


def _per_rank(exercise: Exercise, code: Any, path: str, case: dict, notes: list,
              returned: Optional[Callable[[int], None]] = None) -> Any:
    """What each simulated rank runs: the submission called on its world and its own arguments; `returned`
    told the rank once its function returned (the rank itself ends when the threads it started end)."""
    rank = current_rank()
    # The emulator's world itself: `from mpi4py import MPI` gives the real module where this process
    # imported it before (the package's attribute is read before sys.modules), a one-rank MPI world.
    value = call_submission(exercise, code, path, world(), case["args"][rank], notes[rank])
    if returned is not None:
        returned(rank)
    return value


def make_case(exercise: Exercise, seed: int, n: int) -> dict:
    try:
        case = exercise.case(seed, n)
    except Exception as exc:  # noqa: BLE001 - the instructor's generator: one line naming it
        raise LabError(f"exercise {exercise.number}: case({seed}, {n}) raised {type(exc).__name__}: {exc}") from None
    if not isinstance(case, dict) or len(case.get("args", ())) != n or len(case.get("expected", ())) != n:
        raise LabError(f"exercise {exercise.number}: case({seed}, {n}) must return a dict with {n} 'args' and "
                       f"{n} 'expected', one per rank")
    return case


def run_case(exercise: Exercise, path: str, n: int, seed: int, eager_limit: int = EAGER_LIMIT,
             returned: Optional[Callable[[int], None]] = None) -> CaseResult:
    """Run the submission at `path` on `n` simulated ranks on the exercise's case `seed`, and judge it; a
    standard Send of `eager_limit` bytes or more waits for its receive. `returned(rank)`: as `_per_rank`'s."""
    path = os.path.abspath(path)
    case = make_case(exercise, seed, n)
    label = str(case.get("label", f"seed {seed}"))
    try:
        code = _compiled(path)
    except SyntaxError as exc:
        where = f" at line {exc.lineno}" if exc.lineno else ""
        return CaseResult(n, seed, label, status="error", reason=f"syntax error{where}: {exc.msg}")
    except LabError as exc:  # unreadable, empty, not text: the submission's verdict, not the grader's stop
        return CaseResult(n, seed, label, status="error", reason=str(exc))
    notes = [Notes() for _ in range(n)]
    failure, results = None, None
    try:
        with swapped(), _os_exit_raises():
            results = simulate(n, _per_rank, exercise, code, path, case, notes, returned, eager_limit=eager_limit)
    except Exception as exc:  # noqa: BLE001 - any failure of the submission is its verdict
        failure = describe_failure(exc, path, n, exercise.signature)
    except BaseException as exc:  # a rank's KeyboardInterrupt, or a class of its own on BaseException: its
        if not getattr(exc, "simulated_ranks", None):  # verdict (a real Ctrl-C, in no rank, stops the check)
            raise
        failure = describe_failure(exc, path, n, exercise.signature)
    result = judge(exercise, case, seed, n, results, notes, failure)
    return _misuses(result, results, path) if result.status == "wrong" else result


def judge(exercise: Exercise, case: dict, seed: int, n: int, results: Optional[list], notes: list,
          failure: Optional[tuple], rules: bool = True) -> CaseResult:
    """The verdict of one case from the ranks' `results` (or the `failure` that ended the run: status,
    reason, detail) and the calls in `notes`: not implemented, a forbidden call, the failure, a wrong
    value, a required call never made, more bytes than the optimum, or a pass. Without `rules` (under
    mpiexec, where the calls are not seen) the values alone."""
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
                             exercise.explain, case)
    if wrong:
        reason, _, detail = wrong.partition("\n")
        return CaseResult(**result, status="wrong", reason=f"wrong at {_ranks(n)} ({label}): {reason}",
                          detail=detail.strip(), sent=sent)
    unmade = missing(notes, exercise.required) if rules else None
    if unmade:
        return CaseResult(**result, status="forbidden", reason=unmade, sent=sent)
    extra = too_many(notes, dict(exercise.most_calls)) if rules else None
    if extra:
        return CaseResult(**result, status="forbidden", reason=extra + (f": {exercise.hint}" if exercise.hint else ""),
                          sent=sent)
    optimum = exercise.optimal_bytes(case, n) if exercise.optimal_bytes and rules else None
    if optimum and not sent:  # right values that no message carried: the ranks' threads shared memory
        return CaseResult(**result, status="bytes", sent=0, optimum=optimum,
                          reason=f"no rank sent a byte at {_ranks(n)} ({label}), yet the algorithm needs "
                                 f"{optimum:,} B from its busiest rank: the values went through memory the "
                                 "simulated ranks share (threads of one process), which MPI ranks do not")
    if optimum is not None and sent > optimum:
        busiest = max(range(n), key=lambda r: notes[r].sent)
        return CaseResult(**result, status="bytes", sent=sent, optimum=optimum,
                          reason=f"rank {busiest} sent {sent:,} B at {_ranks(n)} ({label}); the algorithm needs "
                                 f"{optimum:,} B from its busiest rank")
    return CaseResult(**result, status=PASS, sent=sent, optimum=optimum)
