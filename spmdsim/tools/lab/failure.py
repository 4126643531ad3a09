"""What a failed run of a submission says: the exception that ended its ranks, or the emulator's deadlock
report, as one line of reason (a CSV cell) and the lines of feedback under it (spmdsim.tools.lab.harness)."""
from __future__ import annotations

import errno
import os
import re
import traceback
from typing import Any, Optional

from ...errors import RuntimeMismatchError, exception_text
from ...runtime.sim.bodies import op_of
from ...runtime.sim.unmatched import NO_MATCH
from ...runtime.sim.waiting import ranks_text as rank_list
from .calls import BARRIERS, COLLECTIVES, POINT_TO_POINT, ranks_text

__all__ = ["Exited", "MissingFunction", "FILE_BYTES", "NOT_RUNNABLE", "at_line", "ranks_text", "describe_failure"]

#: The statuses of a submission no case can run, the same at every rank count: its file does not load (it cannot
#: be read, is empty, is not Python text, has a syntax error, imports at its top a module that is not there), or it
#: defines no function of the exercise's name. A
#: check stops at its first case and says it once (spmdsim.tools.lab.child, report), not once per rank count.
NOT_RUNNABLE = ("unloadable", "no-function")

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
        lines.append(at_line(line, path))
    return "\n".join(lines)


def at_line(text: str, path: str) -> str:
    """`text` with each place in the submission, "prog.py:9", said as "line 9"."""
    return re.sub(rf"(?<![\w/]){re.escape(os.path.basename(path))}:(\d+)", r"line \1", text)


class Exited(Exception):
    """A rank called sys.exit or os._exit: it ends the run, not the grader."""

    def __init__(self, call: str, code: Any) -> None:
        super().__init__(f"{call}({code!r})")
        self.call = call
        self.code = code


class MissingFunction(Exception):
    """The submission defines no function of the exercise's name."""


#: The most bytes a submission may write to its files and its output together (spmdsim.tools.lab.child's limit).
FILE_BYTES = 64 << 20


def _line(exc: BaseException, path: str) -> Optional[int]:
    """The submission's line where `exc` was raised (its innermost frame in the file)."""
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    if isinstance(exc, SyntaxError) and exc.filename == path:
        return exc.lineno
    return lines[-1] if lines else None


def _loading(exc: BaseException, path: str) -> bool:
    """Whether `exc` was raised as the submission's file loads (its top-level code: an import there), not in its
    function: the same in every case, so no case can run."""
    names = [f.name for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    return bool(names) and all(name == "<module>" for name in names)


def _beside(path: str, module: str) -> str:
    """The file or folder beside the submission at `path` that holds `module` ("helpers.py"), or ""."""
    top = module.split(".")[0]
    where = os.path.join(os.path.dirname(path), top)
    return "" if not top else f"{top}.py" if os.path.isfile(where + ".py") else f"{top}/" if os.path.isdir(where) \
        else ""


#: What a communicator has that an argument in its place (an array) has not: `x.Get_size()` on the wrong argument.
_COMM_ATTRIBUTES = COLLECTIVES | BARRIERS | POINT_TO_POINT | {"Get_size", "Get_rank", "size", "rank", "Create_cart",
                                                              "Split"}


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


#: The object reductions (comm.allreduce, ...) and their buffer forms, which apply an op element by element.
_OBJECT_REDUCTIONS = {"allreduce": "Allreduce(x, out", "reduce": "Reduce(x, out", "scan": "Scan(x, out",
                      "exscan": "Exscan(x, out"}

#: The ops that mpi4py applies to two Python objects by asking their truth (`y if y > x else x`, `x and y`).
_TRUTH_OPS = ("max", "min", "land", "lor", "lxor")


def _object_op_hint(exc: BaseException, path: str) -> str:
    """Where an object reduction of the submission's (comm.allreduce of an array with op=MPI.MAX) raised
    numpy's ambiguous truth value, as mpi4py's does on arrays: that the op took whole arrays, and the buffer
    form that takes each element; else ""."""
    if not isinstance(exc, ValueError) or "truth value of an array" not in exception_text(exc):
        return ""
    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    mine = [i for i, frame in enumerate(frames) if frame.f_code.co_filename == path]
    # the emulator's reduction the submission called: the next frame, or one past the emulator's wrappers (a
    # communicator's checked `call`, which a run that loaded mpi4py's own module leaves in between)
    called = next((frame for frame in frames[mine[-1] + 1:mine[-1] + 4] if mine
                   and frame.f_code.co_name in _OBJECT_REDUCTIONS and "op" in frame.f_locals), None)
    if called is None:
        return ""
    call = called.f_code.co_name
    try:
        name = op_of(called.f_locals["op"])[0]
    except Exception:  # noqa: BLE001 - an op the call itself refused
        return ""
    if name not in _TRUTH_OPS:
        return ""
    op = f"MPI.{name.upper()}"
    return (f"The truth value of an array is ambiguous: comm.{call} applies {op} to whole arrays (as mpi4py "
            f"does, as Python objects): apply it element by element with comm.{_OBJECT_REDUCTIONS[call]}, "
            f"op={op})")


#: The most characters of an exception's message a reason keeps (a CSV cell, a line of feedback).
MESSAGE_CHARS = 200
#: ... of a message spmdsim's emulator wrote, whose advice comes at its end ("... receive it with recv(), or
#: send an array with Send"): kept whole up to this length.
EMULATOR_MESSAGE_CHARS = 1000
#: The folder of spmdsim's package: an exception raised by a frame under it is the emulator's, its words spmdsim's.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


#: A frame of MPICH's error stack, "internal_Send_c(234): ", "internal_Recv_c(339).....: " or "(unknown)(): ",
#: before its text.
_STACK_FRAME = re.compile(r"^(?:\w+\(\d+\)|\(unknown\)\(\))\.*:\s*")
#: What an MPICH error stack that ends in its class alone means, and what to do: a large message (a pickled object
#: past the eager limit) into too small a buffer ends "(unknown)(): Message truncated", naming neither size.
_BARE_STACK = {"Message truncated": "the message is larger than the buffer receiving it: receive with a buffer at "
                                    "least the message's size, or with comm.recv, which takes any size"}
#: MPICH's detail of a truncated message, whose two sizes some of its paths give the other way round
#: ("20 bytes received but buffer size is 40" of a 40-byte message into a 20-byte buffer, MPICH 5.0.2's MPIDIG).
_TRUNCATED = re.compile(r"Message from rank (\d+) and tag (-?\d+) truncated; (\d+) bytes received but buffer size "
                        r"is (\d+)")


def _truncated(text: str) -> str:
    """MPICH's truncation detail `text` said with its sizes the right way round (a message larger than its buffer,
    whichever MPICH names first), and what to do; any other `text` as it is."""
    m = _TRUNCATED.fullmatch(text)
    if m is None:
        return text
    rank, tag, *sizes = m.groups()
    small, big = sorted(int(n) for n in sizes)
    return (f"rank {rank}'s message (tag {tag}) is {big:,} bytes, the buffer receiving it {small:,}: receive with a "
            f"buffer of at least {big:,} bytes")


def _most_chars(exc: BaseException) -> int:
    """How many characters of `exc`'s message a reason keeps: more where spmdsim's emulator raised it."""
    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]
    raised_in = frames[-1].f_code.co_filename if frames else ""
    return EMULATOR_MESSAGE_CHARS if raised_in.startswith(_PACKAGE) else MESSAGE_CHARS


def _first_line(message: str, most: int = MESSAGE_CHARS) -> str:
    """The first line of an exception's `message`, cut to MESSAGE_CHARS saying how long it was: a submission's
    `raise ValueError("x" * 10**6)` printed a megabyte to the terminal and into its grade-book cell. MPICH's
    "Message truncated, error stack:" is said with the stack's last text, which says what was wrong
    ("Message truncated: rank 1's message (tag 0) is 40 bytes, the buffer receiving it 20: ...", its sizes the right
    way round: _truncated), or where that only repeats the class, with what the class means (_BARE_STACK)."""
    lines = message.strip().splitlines()
    line = lines[0] if lines else ""
    if line.endswith(", error stack:"):
        texts = [_STACK_FRAME.sub("", later).strip() for later in lines[1:]]
        last = next((text for text in reversed(texts) if text), "")
        head = line[:-len(", error stack:")]
        said = _BARE_STACK.get(head, "") if last in ("", head) else _truncated(last)
        line = head + (f": {said}" if said else "")
    return line if len(line) <= most else f"{line[:most]}... ({len(line):,} characters)"


def describe_failure(exc: BaseException, path: str, n: int, signature: str = "") -> tuple:
    """(status, reason, detail) of a run that ended with `exc`, with the exercise's `signature`
    ("ring_pass(comm, x)"); a NotImplementedError is the starter's (not yet implemented) where it says
    nothing or the function's name, as the starter's does, and the submission's own error where it says
    something else ("only powers of two")."""
    function = signature.partition("(")[0]
    ranks = getattr(exc, "simulated_ranks", ()) or ()
    who = "every rank" if len(ranks) == n and n > 1 else rank_list(ranks) if ranks else "a rank"
    line = _line(exc, path)
    at = f" at line {line}" if line else ""
    if isinstance(exc, NotImplementedError) and exception_text(exc) in ("", function):
        return "not-implemented", "not yet implemented", "the function still raises NotImplementedError: write it"
    if isinstance(exc, MissingFunction):
        return "no-function", str(exc), ""
    if isinstance(exc, RuntimeMismatchError):
        text = _deadlock_text(str(exc), path)
        head, _, rest = text.partition("\n")
        calls = [call.strip() for call in rest.strip().splitlines()]
        # the first call whose messages do not match (its tags, sources: the mistake), else the first
        first = next((call for call in calls if NO_MATCH in call), calls[0] if calls else "")
        status = "deadlock" if "deadlock" in head else "mismatch"
        return status, f"{status} at {ranks_text(n)}: {first or head}", text
    after = getattr(exc, "after_finalize", None)
    if after:  # a call after the rank's MPI.Finalize (spmdsim.emulator.after_finalize): MPI ends the job
        return "error", f"{who} called {after}{at} after its MPI.Finalize: MPI allows no call after it", ""
    if getattr(exc, "abort_code", None) is not None:  # comm.Abort(code): MPI ends the job
        return "exit", f"{who} called comm.Abort({exc.abort_code}){at}: return the result instead", ""
    if isinstance(exc, Exited):
        return "exit", f"{who} called {exc}{at}: return the result instead of exiting", ""
    if isinstance(exc, MemoryError):
        return "memory", f"{who} ran out of memory{at}", ""
    mine = [f.name for f in traceback.extract_tb(exc.__traceback__) if f.filename == path]
    if isinstance(exc, RecursionError) and mine and mine.count(mine[-1]) > 1:  # a function of its own recursing
        # (Python's text may end "in comparison": the check's hook, which notes each call, was running)
        return "error", f"{who} raised RecursionError{at}: maximum recursion depth exceeded in {mine[-1]}(), " \
                        "which calls itself without end (or deeper than Python allows)", ""
    if isinstance(exc, EOFError):
        return "error", f"{who} read standard input{at}, which a check does not give: take the function's " \
                        "arguments instead", ""
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        return "error", f"{who} wrote past the {FILE_BYTES >> 20} MiB a submission may write{at} (its " \
                        "printed output and files together): print less", ""
    if isinstance(exc, SyntaxError) and line:
        return "error", f"syntax error at line {line}: {exc.msg}", ""
    beside = _beside(path, exc.name or "") if isinstance(exc, ModuleNotFoundError) else ""
    status = "unloadable" if isinstance(exc, ImportError) and _loading(exc, path) else "error"
    if beside:  # `python prog.py` finds it there; a check, as a grade, takes the one file
        return status, f"{who} raised ModuleNotFoundError{at}: no module named {exc.name!r}: a submission is " \
                        f"one file, and {beside} beside it is not on the path: put what it uses into " \
                        f"{os.path.basename(path)}", ""
    message = _object_op_hint(exc, path) or _first_line(exception_text(exc), _most_chars(exc))  # (__str__ may raise)
    name = "MPI.Exception" if type(exc).__module__ == "mpi4py.MPI" else type(exc).__name__
    return status, f"{who} raised {name}{at}" + (f": {message}" if message else "") + \
        _call_hint(exc, line, signature), ""
