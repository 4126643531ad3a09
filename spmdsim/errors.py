"""The spmdsim exception family: every user-facing error subclasses SpmdsimError."""
from __future__ import annotations

import os
import re
import threading
import traceback
from typing import Callable

__all__ = ["fold_message", "exception_text", "same_class", "mark_guarded", "guarded", "SpmdsimError", "LayoutError",
           "ShapeError", "DTypeError", "RankError", "DialectError", "OperatorError", "PlanError", "PipelineError",
           "RuntimeMismatchError", "DivergenceError", "RankCountError", "MeshSizeError", "StrategySizeError",
           "PartitionCountError", "CheckFailed", "ResourceError"]


#: Columns of a printed error line (spmdsim.programs.viz.table.WIDTH: every default output).
WIDTH = 100


def fold_message(text: str, width: int = WIDTH) -> str:
    """`text` with each line longer than `width` folded at spaces onto lines indented two more.

    An error stays one message: its first line still starts with what it names, and
    joining each continuation line onto the one before with one space gives it back
    (``folded.replace("\\n  ", " ")`` for a message of one line). A flag and its value
    stay together (``-n 8``); a word longer than a line (a long path) is not cut, so
    it can be copied: it stays on the line it starts, which then runs past `width`.
    """
    glue = "\x00"
    flag = re.compile(r"(?<=[\s(])(-{1,2}[A-Za-z][\w-]*) (?=[^\s-])")
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[:len(line) - len(line.lstrip())]
        more = indent + "  "
        current = indent
        for word in flag.sub(r"\1" + glue, line.strip()).split(" "):
            word = word.replace(glue, " ")
            fits = len(current) + 1 + len(word) <= width
            if current.strip() and not fits and len(more) + len(word) <= width:
                out.append(current)
                current = more + word
            else:
                current += (" " if current.strip() else "") + word
        out.append(current)
    return "\n".join(out)


def same_class(one: type, other: type) -> bool:
    """Whether two exception classes are one: the same object, or the same class of a module each simulated rank
    loaded for itself (a program's or a submission's own class: one object a rank)."""
    return one is other or (one.__module__, one.__qualname__) == (other.__module__, other.__qualname__)


def mark_guarded(exc: BaseException) -> None:
    """Note on `exc`, raised by a program on a simulated rank under spmdsim's guard (its excepthook, run_guarded,
    abort_on_error, spmdsim.script), that the guard saw it: `spmdsim mpirun` then reports it as the guard ends an
    mpiexec job with it (one line, exit 2 where every rank raised one). A class without a __dict__ is left as is."""
    try:
        exc.spmdsim_guarded = True  # type: ignore[attr-defined]
    except AttributeError:
        pass


def guarded(exc: BaseException) -> bool:
    """Whether `mark_guarded` noted `exc`."""
    return getattr(exc, "spmdsim_guarded", False)


def exception_text(exc: BaseException) -> str:
    """str(exc), or where the exception's own __str__ raises (a program's class whose __str__ has a bug), a text
    saying so, in the angle brackets Python's traceback puts its "<exception str() failed>" in: the error that
    __str__ raised stood for the exception itself, and ended the simulated rank that reported it."""
    try:
        return str(exc)
    except Exception as inner:  # noqa: BLE001 - whatever a program's __str__ raises
        return f"<its message could not be shown: its __str__ raised {type(inner).__name__}>"


def also_failed(exc: BaseException, said: str, rank: str,
                name: Callable[[type], str] = lambda kind: kind.__name__) -> list[str]:
    """A line for each simulated rank that failed otherwise than `exc`, the error reported (its
    ``simulated_failures``: spmdsim.runtime.sim.run), in rank order, the first four, then how many more: '`said`:
    also failed: `rank` R: CLASS: the message's first line' (`name(kind)` the class as the reporter names it), as
    mpiexec prints every rank's error where simulate raises the lowest failing rank's."""
    shown = (type(exc), exception_text(exc))
    other = [(r, kind, text.splitlines()[0] if text else "") for r, kind, text in getattr(exc, "simulated_failures", ())
             if not (same_class(kind, shown[0]) and text == shown[1])]
    lines = [f"{said}: also failed: {rank} {r}: {name(kind)}: {line}" for r, kind, line in other[:4]]
    return lines + ([f"{said}: and {len(other) - 4} more ranks failed otherwise"] if len(other) > 4 else [])


#: Frames that are spmdsim's own, a simulated rank's thread's or IPython's (its cell's exec): an error's display
#: in IPython leaves them out.
_OWN_FRAMES = (os.path.dirname(os.path.abspath(__file__)) + os.sep, threading.__file__)
_IPYTHON = f"{os.sep}IPython{os.sep}"


class SpmdsimError(Exception):
    """Base of every error spmdsim raises on purpose.

    In IPython (a notebook, the ipython shell) it shows as the program's own frames and its message, with
    spmdsim's frames left out (`_render_traceback_`, IPython's hook): the message says what went wrong, and
    the frames say where in the program.
    """

    def _render_traceback_(self) -> list[str]:
        return program_traceback(self)


def program_traceback(exc: BaseException) -> list[str]:
    """The lines IPython shows for `exc` (its `_render_traceback_` hook): the program's frames, spmdsim's left out;
    the message; its notes. simulate gives it to a KeyboardInterrupt too: an interrupted cell shows the cell's line."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(_OWN_FRAMES) and _IPYTHON not in f.filename]
    shown = "".join(["Traceback (most recent call last):\n", *traceback.StackSummary.from_list(frames).format()]
                    if frames else [])
    text = ": ".join([type(exc).__name__, *filter(None, [exception_text(exc)])])
    return [*shown.splitlines(), *text.splitlines(), *getattr(exc, "__notes__", ())]


class LayoutError(SpmdsimError, ValueError):
    """A device matrix, alias or tensor map is invalid."""


class ShapeError(SpmdsimError, ValueError):
    """A shape does not fit a layout (length, divisibility, local shard shape)."""


# DTypeError and RankError subclass ShapeError, which spmdsim raised for them before:
# code that catches ShapeError keeps working.
class DTypeError(ShapeError):
    """A dtype the operation cannot take (not sendable, not summable, mismatched)."""


class RankError(ShapeError):
    """A rank argument (a bcast or gather root, an exchange peer) outside its group."""


class DialectError(SpmdsimError, ValueError):
    """A strategy, SBP, placement or PartitionSpec is malformed or not expressible."""


class OperatorError(SpmdsimError, ValueError):
    """Operator inputs are inconsistent (layouts, ids, dtypes)."""


class PlanError(SpmdsimError, ValueError):
    """A redistribution cannot be planned between the given layouts."""


class PipelineError(SpmdsimError, ValueError):
    """A pipeline schedule is malformed, mismatched or deadlocks (spmdsim.programs.pipeline)."""


class RuntimeMismatchError(SpmdsimError, RuntimeError):
    """The MPI world does not match what the program needs (size, divergence)."""


class DivergenceError(RuntimeMismatchError):
    """Ranks call collectives that differ (the operation, a count, a dtype, a root): where MPI hangs or computes
    garbage, a failure of the run, exit 1 (no bad input, even where every rank raises it), as a deadlock."""


class RankCountError(SpmdsimError):
    """A program needs another number of ranks than it runs on: `needed` (or, with `divides`, a multiple of it)
    where it has `size`.

    The numbers are attributes, so that whoever knows how the ranks were launched says how to get those
    (spmdsim.runtime.engines.ways_out; `spmdsim run`'s "expected --ranks 8") from them, never from the text;
    `ways` is that advice where the message already ends with it, else "". Mesh raises MeshSizeError (a
    RuntimeMismatchError), a strategy StrategySizeError (a DialectError), Paddle's num_partitions
    PartitionCountError (an OperatorError): an ``except`` of the older class still catches it.
    """

    def __init__(self, text: str = "", needed: int = 0, size: int = 0, divides: bool = False, ways: str = "") -> None:
        super().__init__(text)
        self.needed, self.size, self.divides, self.ways = needed, size, divides, ways

    def with_ways(self, ways: str) -> RankCountError:
        """The same error (its class and numbers) with `ways`, how to get the ranks, after its message."""
        return type(self)(f"{self}{ways}", self.needed, self.size, self.divides, self.ways + ways)

    def advise(self, ways: str) -> None:
        """Add `ways`, how to get the ranks, after this error's own message (in place: a report that has this
        exception keeps what else it noted on it, its traceback among them)."""
        self.args = (f"{self}{ways}",)
        self.ways += ways

    def wanted(self) -> str:
        """The rank counts that fit, as a flag's value reads: "8", or "3 or a multiple of it"."""
        return f"{self.needed} or a multiple of it" if self.divides else f"{self.needed}"


class MeshSizeError(RankCountError, RuntimeMismatchError):
    """A Mesh's device matrix has another number of devices than its communicator has ranks."""


class StrategySizeError(RankCountError, DialectError):
    """A strategy uses more devices than the world has ranks, or a number that does not divide it."""


class PartitionCountError(RankCountError, OperatorError):
    """Paddle's num_partitions does not divide the number of ranks its mesh is over."""


class CheckFailed(SpmdsimError, AssertionError):
    """A distributed result differs from its reference beyond tolerance."""


class ResourceError(SpmdsimError, MemoryError):
    """A job needs more memory than a rank may use (refused before anything is allocated)."""
