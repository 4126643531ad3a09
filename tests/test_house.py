"""The house's rules, read from the source with `ast` (tests/importkit.py): floors, cycles, sizes.

The package stands in floors, bottom to top (docs/explanation/architecture.md): base, layouts, references, programs,
runtime, emulator, nn, models, tools. A module imports only modules of its own floor or the floors below,
imports inside functions included (mpi4py counts as the runtime floor: nothing below the runtime loads it).
Nowhere an import cycle, imports inside functions counted; at most MOST_INNER_IMPORTS imports of the package's
own modules inside functions (kept for the CLI's and `spmdsim mpirun`'s start and optional dependencies).
In every floor, no module over 400 lines and no function over 75 lines; the examples users read to learn the
package (examples/*.py) and the scripts that measure it (scripts/*.py) alike. No line of the package, the examples,
the scripts or the tests over 120 columns (tests/data, learners' programs, aside).
"""
from __future__ import annotations

import ast
import re
from functools import lru_cache

import importkit

FLOORS = ("base", "layouts", "references", "programs", "runtime", "emulator", "nn", "models", "tools")

#: Outside packages that belong to a floor: importing one is importing that floor.
OUTSIDE = {"mpi4py": "runtime"}

#: The most import statements inside functions that load a module of the package (outside packages, such
#: as mpi4py, matplotlib or numpy, not counted): each one is kept for a start-up's time (the CLI's commands
#: load only their own modules; `spmdsim mpirun` and the simulator start without numpy, the planner or the
#: guard) or for the backward walk of spmdsim.nn.autograd, which its deciding modules do not load.
MOST_INNER_IMPORTS = 60

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 75

#: The examples (examples/*.py): read by users learning the package, held to its modules' sizes.
EXAMPLES = importkit.ROOT / "examples"
#: The scripts (scripts/*.py: benchmarks, peers, tables): read by whoever checks a figure, held alike.
SCRIPTS = importkit.ROOT / "scripts"


def floor_of(module: str) -> int | None:
    """The floor index of a spmdsim module or an outside package; None for the loose modules at the top
    (spmdsim/__init__, __main__, errors, _lazy), which any floor may import, and other outside packages."""
    if module in OUTSIDE:
        return FLOORS.index(OUTSIDE[module])
    parts = module.split(".")
    if parts[0] == importkit.TOP and len(parts) > 1 and parts[1] in FLOORS:
        return FLOORS.index(parts[1])
    return None


def in_floors(module: str, floors: tuple[str, ...]) -> bool:
    return any(module == f"{importkit.TOP}.{f}" or module.startswith(f"{importkit.TOP}.{f}.") for f in floors)


def test_no_module_imports_a_higher_floor():
    found = []
    for module, imports in sorted(importkit.scan().items()):
        own = floor_of(module)
        if own is None:
            continue
        for imp in imports:
            target = floor_of(imp.target)
            if target is not None and target > own:
                where = "at import" if imp.at_import else "inside a function"
                found.append(f"  {module}:{imp.line} ({FLOORS[own]}) imports {imp.target} ({FLOORS[target]}), "
                             f"{where}: {imp.statement}")
    assert not found, "imports of a higher floor:\n" + "\n".join(found)


def test_no_import_cycle_counting_imports_inside_functions():
    scanned = importkit.scan()
    graph = {m: {i.target for i in imports if i.target in scanned} for m, imports in scanned.items()}
    found = importkit.cycles(graph)
    assert not found, "import cycles (imports inside functions included):\n" + "\n".join(
        f"  {' -> '.join(importkit.one_cycle(graph, members))}" for members in found)


def test_no_import_cycle_counting_type_checking_imports():
    """Nor through the imports only a type checker reads (``if TYPE_CHECKING:``): each is a dependency all the
    same, and two modules that name each other's classes are one module in two files."""
    scanned = importkit.scan(type_checking=True)
    graph = {m: {i.target for i in imports if i.target in scanned} for m, imports in scanned.items()}
    found = importkit.cycles(graph)
    assert not found, "import cycles (imports under TYPE_CHECKING included):\n" + "\n".join(
        f"  {' -> '.join(importkit.one_cycle(graph, members))}" for members in found)


def _inner_imports() -> dict[str, list[str]]:
    """module -> its import statements inside functions that load a module of the package ("line: statement")."""
    found: dict[str, list[str]] = {}
    for module, imports in sorted(importkit.scan().items()):
        lines = {i.line: i.statement for i in imports if not i.at_import and i.target.startswith(importkit.TOP + ".")}
        if lines:
            found[module] = [f"{line}: {statement}" for line, statement in sorted(lines.items())]
    return found


def test_few_imports_of_the_package_are_inside_functions():
    found = _inner_imports()
    count = sum(len(statements) for statements in found.values())
    assert count <= MOST_INNER_IMPORTS, (
        f"{count} imports of spmdsim's modules inside functions (at most {MOST_INNER_IMPORTS}; hoist them, or move "
        "the shared piece down a floor):\n" + "\n".join(
            f"  {module} ({len(statements)}):\n" + "\n".join(f"    {s}" for s in statements)
            for module, statements in found.items()))


def _measure(path, tree=None) -> tuple[int, list[tuple[str, int]]]:
    """(lines, [("function:line", lines)]) of the Python file at `path` (its syntax tree `tree` where parsed)."""
    text = path.read_text()
    functions = [(f"{node.name}:{node.lineno}", node.end_lineno - node.lineno + 1)
                 for node in ast.walk(tree if tree is not None else ast.parse(text, str(path)))
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return len(text.splitlines()), functions


@lru_cache(maxsize=None)
def _sizes(floors: tuple[str, ...] = FLOORS) -> tuple:
    """(module, lines, [(function, lines)]) for every module of `floors`: read once for the tests below, from
    the syntax trees the scan above parsed (importkit.tree_of)."""
    return tuple((module, *_measure(path, importkit.tree_of(path)))
                 for module, path in sorted(importkit.module_paths().items()) if in_floors(module, floors))


def test_every_module_reads_in_one_sitting():
    big = [f"  {module}: {lines} lines" for module, lines, _ in _sizes() if lines > MAX_MODULE_LINES]
    assert not big, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(big)


def test_every_function_is_short():
    long = [f"  {module}.{name}: {lines} lines" for module, _, functions in _sizes()
            for name, lines in functions if lines > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def oversized_examples(folder=EXAMPLES) -> list[str]:
    """One line per example of `folder` (its *.py) over MAX_MODULE_LINES lines, and per function of one over
    MAX_FUNCTION_LINES."""
    found = []
    for path in sorted(folder.glob("*.py")):
        lines, functions = _measure(path)
        if lines > MAX_MODULE_LINES:
            found.append(f"  {folder.name}/{path.name}: {lines} lines (at most {MAX_MODULE_LINES})")
        for label, n in functions:
            if n > MAX_FUNCTION_LINES:
                name, line = label.split(":")
                found.append(f"  {folder.name}/{path.name}: {name}() at line {line} is {n} lines (at most "
                             f"{MAX_FUNCTION_LINES})")
    return found


def test_every_example_reads_in_one_sitting():
    """The examples are read by users learning the package: the same sizes as its modules (a long main() split
    into named steps, each with its docstring)."""
    found = oversized_examples()
    assert not found, ("examples over the house's sizes (split a long function into named steps; move code "
                       "shared by examples into the package module they share):\n" + "\n".join(found))


def test_every_script_reads_in_one_sitting():
    """The scripts are read by whoever checks a figure the docs give: the same sizes (a benchmark's cases in
    modules of their own beside it, as scripts/_bench_gpt_*.py)."""
    found = oversized_examples(SCRIPTS)
    assert not found, ("scripts over the house's sizes (split a long function into named steps; a script's "
                       "cases into modules beside it):\n" + "\n".join(found))


#: Where the house's Python lives (tests/data holds learners' programs whose line numbers the lab's tests quote).
PYTHON_FOLDERS = ("spmdsim", "scripts", "examples", "tests")


def loose_spacing(text: str) -> list[str]:
    """Where `text` (a Python file's) spaces its code looser than PEP 8: three or more blank lines in a row (at
    their first line), or blank lines at its end."""
    lines = text.split("\n")
    found, blank = [], 0
    for number, line in enumerate(lines, 1):
        blank = blank + 1 if not line.strip() else 0
        if blank == 3:
            found.append(f"line {number - 2}: three or more blank lines")
    if len(lines) > 1 and lines[-1] == "" and not lines[-2].strip():
        found.append("blank lines at the end")
    return found


def test_code_is_spaced_as_pep_8_spaces_it():
    found = [f"  {path.relative_to(importkit.ROOT)}: {where}"
             for folder in PYTHON_FOLDERS for path in sorted((importkit.ROOT / folder).rglob("*.py"))
             if path.relative_to(importkit.ROOT).parts[:2] != ("tests", "data")
             for where in loose_spacing(path.read_text(encoding="utf-8"))]
    assert not found, "at most two blank lines between definitions, none at a file's end:\n" + "\n".join(found)
    assert loose_spacing("a = 1\n\n\n\nb = 2\n") == ["line 2: three or more blank lines"]
    assert loose_spacing("a = 1\n\n") == ["blank lines at the end"] and loose_spacing("a = 1\n\n\nb = 2\n") == []


#: The widest a line of the house's Python may be, PyTorch's bound and many model codebases': a module reads without
#: scrolling sideways.
MAX_LINE_COLUMNS = 120


def wide_lines(text: str, limit: int = MAX_LINE_COLUMNS) -> list[int]:
    """The numbers of the lines of `text` (a Python file's) longer than `limit` characters."""
    return [number for number, line in enumerate(text.splitlines(), 1) if len(line) > limit]


def test_every_line_fits_in_120_columns():
    found = [f"  {path.relative_to(importkit.ROOT)}:{number}"
             for folder in PYTHON_FOLDERS for path in sorted((importkit.ROOT / folder).rglob("*.py"))
             if path.relative_to(importkit.ROOT).parts[:2] != ("tests", "data")
             for number in wide_lines(path.read_text(encoding="utf-8"))]
    assert not found, (f"lines over {MAX_LINE_COLUMNS} columns (break them as the file breaks its others: after a "
                       "bracket or a comma, strings by implicit concatenation, comments re-flowed):\n"
                       + "\n".join(found))
    assert wide_lines("x" * 120 + "\n" + "y" * 121 + "\n") == [2] and wide_lines("é" * 120) == []


#: "issue 58" in a comment: our tracker's numbers mean nothing to a reader of the code (git keeps them); another
#: project's issue, named with it ("Megatron-LM issue 1754"), stays.
OUR_ISSUE = re.compile(r"(?<!Megatron-LM )(?<!nccl-tests )\b(?:issue #?\d+\b|issues #?\d+(?:,| and| or|\)))", re.I)


def test_the_code_names_none_of_our_issues():
    found = [f"  {path.relative_to(importkit.ROOT)}:{number}: {line.strip()}"
             for folder in PYTHON_FOLDERS for path in sorted((importkit.ROOT / folder).rglob("*.py"))
             if path.name not in ("test_docs_style.py", "test_house.py")
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if OUR_ISSUE.search(line)]
    assert not found, "say what the code does and why, not which issue asked for it:\n" + "\n".join(found)
    assert OUR_ISSUE.search("a node a call: issue 58") and OUR_ISSUE.search("(issues 52 and 53)")
    assert OUR_ISSUE.search("Issue 55: bounds")
    assert (not OUR_ISSUE.search("Megatron-LM issue 1754")
            and not OUR_ISSUE.search("NVIDIA/nccl-tests issues 319 and 267"))
    assert not OUR_ISSUE.search("a step issues 41 sends")


def test_the_rules_see_the_package():
    """Spot checks, so an empty scan cannot pass the tests above."""
    sizes = {module: (lines, functions) for module, lines, functions in _sizes()}
    assert len(sizes) > 50
    assert "spmdsim.tools.cli.main" in sizes and "spmdsim.errors" not in sizes
    assert any(name.startswith("main:") for name, _ in sizes["spmdsim.tools.cli.main"][1])
    assert floor_of("spmdsim.tools.cli.main") == FLOORS.index("tools")
    assert floor_of("mpi4py") == FLOORS.index("runtime") > floor_of("spmdsim.programs.plan.planner")
    assert floor_of("spmdsim.errors") is None and floor_of("numpy") is None
    # An import inside a function is in the scan (the floors count it), and in the count of inner imports.
    assert any(not i.at_import for imports in importkit.scan().values() for i in imports)
    # The examples' rule reads them all: the training examples and their main() among them.
    examples = {path.name: _measure(path) for path in EXAMPLES.glob("*.py")}
    assert len(examples) > 20 and {"train_gpt.py", "train_moe_gpt.py", "train_megatron_block.py"} <= set(examples)
    assert any(name.startswith("main:") for name, _ in examples["train_gpt.py"][1])
    scripts = {path.name for path in SCRIPTS.glob("*.py")}
    assert len(scripts) > 30 and {"bench.py", "bench_gpt.py", "_bench_gpt_pipeline.py"} <= scripts
    assert any(s.endswith("from .window import SimWin  # (numpy, at its import: a program that opens no window runs "
                          "without it)") for s in _inner_imports()["spmdsim.emulator.mpi4py_world"])
