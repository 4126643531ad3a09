"""Exercises as data: one Python file each, loaded into a frozen `Exercise`.

An exercise file (``NN_name.py``; NN is its number in `spmdsim lab list`) defines:

    TITLE = "Allreduce by ring from Send/Recv"        one line
    STATEMENT = '''...'''                              what to write, for the student
    FUNCTION = "ring_allreduce"                        the function the student writes
    SIGNATURE = "ring_allreduce(comm, x)"              its parameters (comm first)
    def case(seed, n): return {"args": [...], "expected": [...], "label": "N=13"}
                                                       per rank: a tuple of arguments, the expected result
    def reference(comm, x): ...                        the solution (named after FUNCTION or `reference`)

and may define RANKS (rank counts, default 1, 2, 3, 4, 8), SEEDS (default 0, 1), FORBIDDEN (comm calls the
exercise forbids), ALLOWED (the only comm calls it allows, and Barrier, which moves no data), REQUIRED
(calls it must make: each entry names one or more calls, any of which counts, "Scatter|Send"), MOST_CALLS
(how many times a rank may make such calls, {"Allreduce": 1}), HINT (said with a forbidden call, one call
too many, a send to a rank the algorithm does not address or too many bytes); def partners(rank, n) (the
ranks `rank` may send to, point to point or one-sided, in the algorithm at n ranks; a send to any other
fails); def sends(case, n, rank) (the values whose computing is `rank`'s work, {what: value}: a rank whose
messages carry none of one fails, spmdsim.tools.lab.contents). A
collective named in these rules stands for all its forms (spmdsim.tools.lab.calls.family): "Allreduce" for
Iallreduce, allreduce and Allreduce_init too, "Allgather" for Allgatherv;
def optimal_bytes(case, n) (the bytes the best algorithm sends from its busiest rank, its collectives counted
as spmdsim.tools.lab.sent_bytes says; more is a failure),
RTOL / ATOL (tolerances; default by the expected value's dtype: float64 1e-9 and 1e-12, float32 1e-4 and
1e-5), TIME_LIMIT (seconds of wall time for one check), MEMORY_MB, and
def explain(case, n, rank, got) (a sentence for a wrong result, or None). A STATEMENT that says "array-like"
lets a list or a tuple of the values stand for an expected array (spmdsim.tools.lab.compare).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import numbers
import os
import re
import sys
from typing import Any, Callable, Iterator, Optional

from ...errors import SpmdsimError

__all__ = ["Exercise", "LabError", "load_exercises", "find_exercise", "guarded", "meant_for", "meant_exercise",
           "meant_by_all", "helpers_of", "EXERCISES"]

#: The folder of the exercises spmdsim ships.
EXERCISES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exercises")

_FILE = re.compile(r"(\d+)_(\w+)\.py")
_NEEDED = ("TITLE", "STATEMENT", "FUNCTION", "SIGNATURE", "case")


class LabError(SpmdsimError, ValueError):
    """A bad exercise file, exercise number or submission path."""


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise, as its file defines it (see the module docstring)."""

    number: int
    name: str
    path: str
    title: str
    statement: str
    function: str
    signature: str
    case: Callable[[int, int], dict]
    reference: Callable[..., Any]
    ranks: tuple = (1, 2, 3, 4, 8)
    seeds: tuple = (0, 1)
    forbidden: tuple = ()
    allowed: Optional[tuple] = None
    required: tuple = ()
    most_calls: tuple = ()
    hint: str = ""
    optimal_bytes: Optional[Callable[[dict, int], int]] = None
    partners: Optional[Callable[[int, int], Any]] = None
    sends: Optional[Callable[[dict, int, int], dict]] = None
    explain: Optional[Callable[..., Optional[str]]] = None
    rtol: Optional[float] = None  # None: by the expected value's dtype (spmdsim.tools.lab.compare)
    atol: Optional[float] = None
    time_limit: float = 10.0
    memory_mb: int = 512

    def __post_init__(self) -> None:
        if not self.ranks or any(type(n) is not int or not 1 <= n <= 64 for n in self.ranks):
            raise LabError(f"exercise {self.path!r}: RANKS {self.ranks!r} must be rank counts from 1 to 64")
        if not self.seeds or any(type(s) is not int for s in self.seeds):
            raise LabError(f"exercise {self.path!r}: SEEDS {self.seeds!r} must be integers")
        if not self.signature.startswith(self.function + "(") or not self.signature.endswith(")"):
            raise LabError(f"exercise {self.path!r}: SIGNATURE {self.signature!r} must read "
                           f"'{self.function}(comm, ...)'")

    @property
    def array_like(self) -> bool:
        """Whether a result may be array-like where the expected one is an array (a list of its values): where
        the statement says so ("array-like"); else a result must be a NumPy array, as the statement asks."""
        return "array-like" in self.statement.lower()

    def starter(self, course: str = "") -> str:
        """The starter file's text: the statement as a docstring, the function raising NotImplementedError;
        `course`, the --exercises flag its check command needs ("" for the exercises spmdsim ships)."""
        doc = "\n".join(("    " + line).rstrip() for line in self.statement.strip().splitlines())
        return (f'"""Exercise {self.number}: {self.title}.\n\nCheck it with: spmdsim lab check {self.number} '
                f'{self.name}.py{course}\n"""\nimport numpy as np\nfrom mpi4py import MPI\n\n\n'
                f'def {self.signature}:\n    """\n{doc}\n    """\n'
                f'    raise NotImplementedError("{self.function}")\n')


def guarded(exercise: Exercise, name: str) -> Callable[..., Any]:
    """The exercise file's function `name` (case, optimal_bytes, partners, sends, explain), which must be defined;
    where it raises, LabError naming the exercise, the call and what it raised (the instructor's file, not the
    submission, is at fault): "exercise 1: partners(0, 2) raised KeyError: 'y'"."""
    function = getattr(exercise, name)

    def call(*args: Any) -> Any:
        try:
            return function(*args)
        except LabError:
            raise
        except Exception as exc:  # noqa: BLE001 - an instructor's function: one line naming it
            shown = ", ".join(_argument(arg) for arg in args)
            raise LabError(f"exercise {exercise.number}: {name}({shown}) raised {type(exc).__name__}: "
                           f"{exc}") from None

    return call


def _argument(value: Any) -> str:
    """An argument of an exercise's function as a fault of it says it: "case" for the case, its repr where short
    and one line (2, array([0., 3., 6.])), else its type (<ndarray>: a submission's long result)."""
    if isinstance(value, dict):
        return "case"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a submission's object whose __repr__ raises
        text = ""
    return text if text and len(text) <= 60 and "\n" not in text else f"<{type(value).__name__}>"


@contextlib.contextmanager
def _folder_on_path(folder: str) -> Iterator[None]:
    """Within this block, `folder` is first on sys.path, so that an exercise file imports a helper module beside
    it (`from helpers import twice`, at its top); after it, the folder is off the path again and the modules
    loaded from it are out of sys.modules (the exercise keeps its own), so that another folder's helpers.py in
    the same process is its own, and a submission, one file, does not import the instructor's helpers."""
    folder = os.path.abspath(folder)
    before = set(sys.modules)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        if folder in sys.path:
            sys.path.remove(folder)
        for name in set(sys.modules) - before:
            where = getattr(sys.modules.get(name), "__file__", None) or ""
            if os.path.dirname(os.path.abspath(where)) == folder or where.startswith(folder + os.sep):
                del sys.modules[name]


def helpers_of(exercise: Exercise, path: str) -> contextlib.AbstractContextManager:
    """Where the submission at `path` is the exercise's own file (its reference checked as a submission), a block
    in which the helper modules beside it import, as they did when it loaded (`_folder_on_path`); else a block
    that does nothing: a submission is one file, and the instructor's helpers are not on its path."""
    if os.path.abspath(path) != os.path.abspath(exercise.path):
        return contextlib.nullcontext()
    return _folder_on_path(os.path.dirname(os.path.abspath(path)))


def _exercise(path: str, number: int, name: str) -> Exercise:
    spec = importlib.util.spec_from_file_location(f"spmdsim_lab_exercise_{number}_{name}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        with _folder_on_path(os.path.dirname(path)):
            spec.loader.exec_module(module)
    except SystemExit as exc:  # sys.exit at its top: the file's fault, not the end of spmdsim
        raise LabError(f"exercise file {path!r} does not load: it calls sys.exit({exc.code!r}) as it is imported"
                       ) from None
    except Exception as exc:  # noqa: BLE001 - an instructor's file: one line naming it
        raise LabError(f"exercise file {path!r} does not load: {type(exc).__name__}: {exc}") from None
    found = vars(module)
    missing = [key for key in _NEEDED if key not in found]
    if missing:
        raise LabError(f"exercise file {path!r} lacks {', '.join(missing)} (spmdsim lab's exercise format: "
                       "docs/howto/grade-exercises.md)")
    text = next((key for key in _NEEDED if key != "case" and not isinstance(found[key], str)), None)
    if text or not callable(found["case"]):
        key = text or "case"
        raise LabError(f"exercise file {path!r}: {key} = {found[key]!r}; expected "
                       f"{'a str' if text else 'a function, def case(seed, n)'}")
    reference = found.get(found["FUNCTION"], found.get("reference"))
    if not callable(reference):
        raise LabError(f"exercise file {path!r} has no reference solution: define {found['FUNCTION']}() "
                       "or reference()")
    extra = _optional(path, found)
    return Exercise(number=number, name=name, path=path, title=found["TITLE"], statement=found["STATEMENT"],
                    function=found["FUNCTION"], signature=found["SIGNATURE"], case=found["case"],
                    reference=reference, **extra)


#: The optional names an exercise file may define, by the Exercise field each sets.
_OPTIONAL = {"ranks": "RANKS", "seeds": "SEEDS", "forbidden": "FORBIDDEN", "allowed": "ALLOWED",
             "required": "REQUIRED", "most_calls": "MOST_CALLS", "hint": "HINT", "rtol": "RTOL", "atol": "ATOL",
             "time_limit": "TIME_LIMIT", "memory_mb": "MEMORY_MB", "optimal_bytes": "optimal_bytes",
             "explain": "explain", "partners": "partners", "sends": "sends"}
#: The optional names that hold several values, each with an example of its form.
_SEVERAL = {"RANKS": "(1, 2, 4)", "SEEDS": "(0, 1)", "FORBIDDEN": '("Bcast",)', "ALLOWED": '("Send", "Recv")',
            "REQUIRED": '("Scatter|Send",)'}
_NAMES = ("FORBIDDEN", "ALLOWED", "REQUIRED")


def _optional(path: str, found: dict) -> dict:
    """The Exercise fields the optional names of an exercise file set, each checked for its form: LabError naming
    the name, its value and the form expected (FORBIDDEN = "Bcast" forbade the calls B, c, a, s and t)."""
    extra = {field: found[key] for field, key in _OPTIONAL.items() if key in found}

    def bad(key: str, expected: str) -> LabError:
        return LabError(f"exercise file {path!r}: {key} = {found[key]!r}; expected {expected}")

    for field, key in _OPTIONAL.items():
        if key not in found:
            continue
        value = found[key]
        if key in _SEVERAL:
            what = "call names" if key in _NAMES else "rank counts" if key == "RANKS" else "integers"
            several = isinstance(value, (tuple, list, set, frozenset))
            if not several or (key in _NAMES and not all(isinstance(v, str) for v in value)):
                raise bad(key, f"a tuple of {what}, such as {_SEVERAL[key]}")
            extra[field] = tuple(value)
        elif key == "MOST_CALLS" and (not isinstance(value, dict) or not all(
                isinstance(k, str) and type(v) is int and v >= 0 for k, v in value.items())):
            raise bad(key, 'a dict of call names and counts, such as {"Allreduce": 1}')
        elif key == "MOST_CALLS":
            extra[field] = tuple(value.items())  # a dict in the file; a tuple of pairs in the frozen value
        elif key == "HINT" and not isinstance(value, str):
            raise bad(key, "a sentence (a str)")
        elif key in ("RTOL", "ATOL", "TIME_LIMIT", "MEMORY_MB") and (
                not isinstance(value, numbers.Real) or isinstance(value, bool) or not value >= 0
                or (key in ("TIME_LIMIT", "MEMORY_MB") and not value > 0)):
            raise bad(key, "a number above 0" if key in ("TIME_LIMIT", "MEMORY_MB") else "a number, 0 or more")
        elif key == field and not callable(value):  # the functions: optimal_bytes, partners, sends, explain
            raise bad(key, f"a function, def {key}(...)")
    return extra


def load_exercises(folder: str = EXERCISES) -> tuple:
    """Every exercise of `folder` (files NN_name.py), by number."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise LabError(f"exercise folder {folder!r} is a file; expected a folder of exercise files (NN_name.py)")
    if not os.path.isdir(folder):
        raise LabError(f"exercise folder {folder!r} does not exist")
    found = []
    for entry in sorted(os.listdir(folder)):
        match = _FILE.fullmatch(entry)
        if match:
            found.append(_exercise(os.path.join(folder, entry), int(match.group(1)), match.group(2)))
    if not found:
        raise LabError(f"exercise folder {folder!r} holds no exercise; expected files named NN_name.py, such as "
                       "01_double.py")
    numbers = [e.number for e in found]
    twice = sorted({n for n in numbers if numbers.count(n) > 1})
    if twice:
        files = [os.path.basename(e.path) for e in found if e.number == twice[0]]
        raise LabError(f"exercise folder {folder!r} gives the number {twice[0]} to {', '.join(files[:-1])} and "
                       f"{files[-1]}: give each file its own number")
    return tuple(sorted(found, key=lambda e: e.number))


def find_exercise(number: Any, folder: str = EXERCISES) -> Exercise:
    """The exercise numbered `number` in `folder`."""
    exercises = load_exercises(folder)
    for exercise in exercises:
        if str(exercise.number) == str(number).lstrip("0") or exercise.name == number:
            return exercise
    known = _numbers([e.number for e in exercises])
    if folder == EXERCISES:  # the ones spmdsim ships: where it is installed says nothing to a student
        raise LabError(f"no exercise {number!r}: expected an exercise's number, {known} (spmdsim lab list lists them)")
    raise LabError(f"no exercise {number!r} in {folder!r}: expected an exercise's number, {known} (spmdsim lab list "
                   f"--exercises DIR lists them)")


def _numbers(numbers: list) -> str:
    """The exercises' `numbers` (sorted) said short: "1 to 22" where none is missing, else "one of 1, 5"."""
    if len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]} to {numbers[-1]}"
    return "one of " + ", ".join(map(str, numbers)) if len(numbers) > 1 else str(numbers[0])


def meant_for(exercise: Exercise, names: list) -> str:
    """Where a submission defining `names` defines another exercise's function of the same folder (ring_allreduce,
    handed in for exercise 2), ": exercise 5's function, not exercise 2's"; else ""."""
    try:
        others = load_exercises(os.path.dirname(exercise.path))
    except LabError:
        return ""
    meant = next((other for other in others if other.function in names and other.number != exercise.number), None)
    return f": exercise {meant.number}'s function, not exercise {exercise.number}'s" if meant else ""


#: `meant_for`'s words, as a check's reason holds them (in its parenthesis: "(it defines triple: exercise 2's ...)").
_MEANT = re.compile(r": exercise (\d+)'s function, not exercise \d+'s\)")


def meant_exercise(reason: str) -> Optional[int]:
    """The exercise a check's `reason` says the submission's function is meant for (`meant_for`), or None."""
    found = _MEANT.search(reason)
    return int(found.group(1)) if found else None


def meant_by_all(reasons: list) -> Optional[int]:
    """The exercise whose function every one of a grade's `reasons` says its submission defines in place of the
    one graded (a folder graded under the wrong number: `meant_for`'s words in each), or None."""
    said = {meant_exercise(reason) for reason in reasons}
    return said.pop() if len(said) == 1 and None not in said else None
