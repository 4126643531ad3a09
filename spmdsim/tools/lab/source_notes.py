"""Notes on a submission's source, read once per check without running it: what may change its grade, and
what passes here only because of how the check calls it.

A check runs each case once, so a submission whose result depends on an unseeded random draw or on
the time of day can pass a case in one check and fail it in the next, its grade with it. Running
every case twice would double a check's time and still miss most flips; the source says it at once.
A submission that uses MPI.COMM_WORLD where its function is given a communicator is right on the
world a check gives it, and wrong on any other. Code that tries the function at the file's top level
runs on every rank as a check loads the file, its messages taken by the function's receives. The
notes are advice beside the verdict, never part of it: a right submission keeps its PASS.
"""
from __future__ import annotations

import ast
from typing import Optional

from ...base.source import SourceDecodeError, decode_source
from .calls import BARRIERS, COLLECTIVES, ONE_SIDED, POINT_TO_POINT

__all__ = ["source_notes"]

#: The most bytes of a submission read for its notes (a larger file gets none).
MOST_BYTES = 1 << 20

#: The calls that make a generator of their own, not draws from a module's global one.
_GENERATORS = {"random.Random", "numpy.random.default_rng", "numpy.random.RandomState"}
#: Module functions that neither draw nor make a generator (numpy.random's bit generators and their kin).
_NOT_DRAWS = {"random.seed", "random.getstate", "random.setstate", "numpy.random.seed",
              "numpy.random.get_state", "numpy.random.set_state", "numpy.random.Generator",
              "numpy.random.SeedSequence", "numpy.random.BitGenerator", "numpy.random.PCG64",
              "numpy.random.PCG64DXSM", "numpy.random.MT19937", "numpy.random.Philox", "numpy.random.SFC64"}
#: The calls that communicate: one at the file's top level runs as a check loads the file.
_COMMUNICATION = COLLECTIVES | BARRIERS | POINT_TO_POINT | ONE_SIDED
#: The clocks whose reading, in a condition, makes a branch that the time of day decides.
_CLOCKS = {"time.time", "time.time_ns", "time.perf_counter", "time.perf_counter_ns", "time.monotonic",
           "time.monotonic_ns", "time.process_time", "time.thread_time", "datetime.datetime.now",
           "datetime.datetime.utcnow", "datetime.datetime.today"}


def _imports(tree: ast.AST) -> dict:
    """Each name the file imports -> the dotted name it stands for (`np` -> numpy, `randint` -> random.randint)."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.partition(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _dotted(node: ast.AST, names: dict) -> str:
    """The dotted name an expression stands for (`np.random.rand` -> numpy.random.rand), or ""."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in names:
        return ""
    return ".".join([names[node.id], *reversed(parts)])


def _seeded(tree: ast.AST, names: dict) -> set:
    """The modules whose global generator the file seeds with a value (random.seed(0), np.random.seed(1))."""
    seeded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and (node.args or node.keywords):
            name = _dotted(node.func, names)
            if name in ("random.seed", "numpy.random.seed"):
                seeded.add(name.rpartition(".")[0])
    return seeded


def _unseeded_draw(tree: ast.AST, names: dict) -> Optional[tuple]:
    """(line, call) of the file's first draw from a generator no seed fixes: a module's global one never
    seeded with a value, or a generator made without a seed (np.random.default_rng()); None if none."""
    seeded = _seeded(tree, names)
    draws = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, names)
        module = name.rpartition(".")[0]
        if name in _GENERATORS:
            if not node.args and not any(k.arg in ("seed", "x") for k in node.keywords):
                draws.append((node.lineno, f"{name}()"))
        elif module in ("random", "numpy.random") and name not in _NOT_DRAWS and module not in seeded:
            draws.append((node.lineno, name))
    return min(draws) if draws else None


def _clock_branch(tree: ast.AST, names: dict) -> Optional[tuple]:
    """(line, clock) of the file's first condition (if, while, a conditional expression) that reads a clock."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp)):
            for inner in ast.walk(node.test):
                if isinstance(inner, ast.Call) and _dotted(inner.func, names) in _CLOCKS:
                    found.append((inner.lineno, _dotted(inner.func, names)))
    return min(found) if found else None


def _is_main_guard(node: ast.AST) -> bool:
    """Whether `node` is ``if __name__ == "__main__":``, code a check never runs."""
    test = getattr(node, "test", None) if isinstance(node, ast.If) else None
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__" \
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)


def _world_use(tree: ast.AST, names: dict, inside_only: bool = False) -> Optional[int]:
    """The first line that names MPI.COMM_WORLD, outside ``if __name__ == "__main__":`` (and, with `inside_only`,
    inside a function: the file's top level then tries the function, given the world); None if none."""
    lines, todo = [], [(tree, False)]
    while todo:
        node, inside = todo.pop()
        if _is_main_guard(node):
            todo.extend((child, inside) for child in node.orelse)
            continue
        inside = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        if isinstance(node, (ast.Attribute, ast.Name)) and _dotted(node, names) == "mpi4py.MPI.COMM_WORLD" \
                and (inside or not inside_only):
            lines.append(node.lineno)
        todo.extend((child, inside) for child in ast.iter_child_nodes(node))
    return min(lines) if lines else None


def _runs(call: ast.Call, names: dict, callers: set) -> str:
    """What `call` runs that communicates, "main()" or "comm.send()": a call of a function of `callers` or of a
    communicator's method (not a module's function of that name: functools.reduce); "" if neither."""
    if isinstance(call.func, ast.Name) and call.func.id in callers:
        return f"{call.func.id}()"
    if isinstance(call.func, ast.Attribute) and call.func.attr in _COMMUNICATION and \
            _dotted(call.func, names).partition(".")[0] in ("", "mpi4py"):
        return f"{ast.unparse(call.func)}()"
    return ""


def _callers(tree: ast.Module, names: dict, function: str) -> set:
    """`function` and the file's own functions that call it or communicate, directly or through each other
    (a `main()` that tries the function)."""
    defs = [node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    callers, grew = {function}, True
    while grew:
        grew = False
        for node in defs:
            if node.name not in callers and any(isinstance(inner, ast.Call) and _runs(inner, names, callers)
                                                for inner in ast.walk(node)):
                callers.add(node.name)
                grew = True
    return callers


def _top_level_run(tree: ast.Module, names: dict, function: str) -> Optional[tuple]:
    """(line, what) of the first call at the file's top level, outside functions, classes and
    ``if __name__ == "__main__":``, of the exercise's `function`, of a function of the file's that calls it, or of
    a communication call (`comm.send(...)`): code that tries the function, which a check runs on every rank as it
    loads the file; None if none."""
    callers = _callers(tree, names, function)
    found, todo = [], [node for node in tree.body if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                           ast.ClassDef))]
    while todo:
        node = todo.pop()
        if _is_main_guard(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        what = _runs(node, names, callers) if isinstance(node, ast.Call) else ""
        if what:
            found.append((node.lineno, what))
        todo.extend(ast.iter_child_nodes(node))
    return min(found) if found else None


def _parameter(tree: ast.AST, function: str) -> str:
    """The name of the first parameter of the file's `function` (the communicator), "comm" if none."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            params = node.args.posonlyargs + node.args.args
            return params[0].arg if params else "comm"
    return "comm"


def _tree(path: str) -> Optional[ast.AST]:
    """The submission's syntax tree, or None where it cannot be read or parsed (its check says why)."""
    try:
        with open(path, "rb") as f:
            source = f.read(MOST_BYTES + 1)
        if len(source) > MOST_BYTES:
            return None
        return ast.parse(decode_source(source))
    except (OSError, SyntaxError, ValueError, SourceDecodeError, RecursionError, MemoryError):
        return None


def source_notes(path: str, function: str = "") -> tuple:
    """The notes on the submission at `path`, one line each: an unseeded random draw, a branch on a clock, a call
    of the exercise's `function` or of a communicator at the file's top level, MPI.COMM_WORLD where `function` is
    given its communicator."""
    tree = _tree(path)
    if tree is None:
        return ()
    names = _imports(tree)
    notes = []
    draw = _unseeded_draw(tree, names)
    if draw:
        notes.append(f"note: line {draw[0]} draws from {draw[1]}, which no seed fixes: its result, and so its "
                     f"grade, may change from run to run; draw from a generator of a fixed seed "
                     f"(np.random.default_rng(0), random.Random(0)), or not at random")
    clock = _clock_branch(tree, names)
    if clock:
        notes.append(f"note: line {clock[0]} branches on {clock[1]}(): what the submission does depends on how "
                     f"fast it runs, and its grade may change from run to run")
    top = _top_level_run(tree, names, function) if function else None
    if top:
        notes.append(f"note: line {top[0]} calls {top[1]} at the file's top level: a check runs that line on every "
                     f"rank as it loads the file, before it calls {function}() itself; put the code that tries "
                     f"the function under `if __name__ == \"__main__\":`")
    world = _world_use(tree, names, inside_only=top is not None)
    if world and function:
        comm = _parameter(tree, function)
        notes.append(f"note: line {world} uses MPI.COMM_WORLD, not the communicator {function}() is given "
                     f"({comm}): the check gives it the world, so the two are one here, but a caller that "
                     f"gives it another (a part of comm.Split) would get the world's ranks; use {comm}")
    return tuple(notes)
