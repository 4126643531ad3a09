"""The spmdsim package's imports, read with `ast` (nothing is imported): who imports whom, and where.

`scan()` parses every module of the package once and gives each one's imports as `Import` records: the
spmdsim module (or outside top-level package, such as mpi4py) it loads, and whether the statement runs
when the module is imported (module level, class bodies and `try` blocks included; `if TYPE_CHECKING:`
blocks excluded) or only when a function runs. `module_level_graph` and `cycles` give the import cycles,
`path_to` the chain of statements by which a module reaches another, `names_from_above` the names taken
through the `__init__` of a package the importing module sits in. tests/test_import_graph.py and
tests/test_datagen_and_purity.py ask them (docs/explanation/architecture.md, "Imports").

How a statement resolves (the import system's own rules):

* ``import a.b.c`` loads ``a.b.c`` and the packages above it;
* ``from a.b import n`` loads ``a.b`` and, where ``a.b.n`` is a module, ``a.b.n``; where ``n`` is a name
  that the package's ``__init__`` loads on first use (its ``_LAZY`` or ``_WHERE`` table, read from the
  source), the module the table names too;
* a relative import is resolved against the importing module's package (``__init__`` is its package).

A package's ``__init__`` is a module named like the package. Packages above the importing module are
left out of its edges: they are already being imported whenever it is, so naming them closes no cycle by
itself; a name taken from one of them (``from .. import X``, X not a submodule) does count, since that
reads the package's ``__init__`` while it may be half done.
"""
from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass
from functools import lru_cache

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOP = "spmdsim"


@dataclass(frozen=True)
class Import:
    target: str        # a spmdsim module ("spmdsim.runtime.mesh") or an outside top-level package ("mpi4py")
    line: int
    at_import: bool    # runs when the module is imported (False: only when a function runs)
    statement: str     # the source line, for messages


def module_paths(root: pathlib.Path = ROOT, top: str = TOP) -> dict[str, pathlib.Path]:
    """Every module of package `top` (in `root`) by dotted name; a package's __init__ under the package's
    name."""
    found = {}
    for path in sorted((root / top).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def is_package(name: str, paths: dict[str, pathlib.Path]) -> bool:
    return name in paths and paths[name].name == "__init__.py"


def from_module(package: str, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` statement `node` reads, in a module of `package` (its own name for an
    ``__init__``): a relative one resolved against it."""
    if not node.level:
        return node.module
    base = package.split(".")[: package.count(".") + 2 - node.level]
    return ".".join(base + ([node.module] if node.module else []))


def _lazy_table(tree: ast.Module, package: str, top: str) -> dict[str, tuple[str, ...]]:
    """name -> modules a package __init__ loads for it on first use: `_LAZY = {name: (module, attr)}` (the
    front door's: a runtime name also loads spmdsim.nn.ops, which gives DTensor its operators) or `_WHERE = {name:
    module for module, names in {module: (names...)}.items() for name in names}` (relative to the package
    unless it starts with "spmdsim.")."""
    table: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        if node.targets[0].id == "_LAZY":
            for name, (module, _attr) in ast.literal_eval(node.value).items():
                table[name] = (module,) + ((f"{top}.ops",) if module.startswith(f"{top}.runtime") else ())
        elif node.targets[0].id == "_WHERE" and isinstance(node.value, ast.DictComp):
            inner = node.value.generators[0].iter
            assert isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute), ast.dump(inner)
            for module, names in ast.literal_eval(inner.func.value).items():
                where = module if module.startswith(f"{top}.") else f"{package}.{module}"
                table.update({n: (where,) for n in names})
    return table


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _blocks(node: ast.AST):
    """`node`'s children that may hold an import: statements, `except` and `case` clauses (an expression holds
    none, a lambda's body included; skipping them is most of the walk)."""
    return (child for child in ast.iter_child_nodes(node)
            if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)))


def _statements(tree: ast.Module, into_type_checking: bool = False):
    """(import statement, runs at import) for every import in the module, in source order (those under
    ``if TYPE_CHECKING:`` too if `into_type_checking`)."""
    def walk(nodes, at_import):
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node, at_import
            elif isinstance(node, ast.If) and _is_type_checking(node.test) and not into_type_checking:
                yield from walk(node.orelse, at_import)  # the `if TYPE_CHECKING:` body never runs
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(_blocks(node), False)
            else:
                yield from walk(_blocks(node), at_import)
    yield from walk(tree.body, True)


def tree_of(path: pathlib.Path) -> ast.Module:
    """The syntax tree of the package's source file `path`, parsed once in this process: the tests that read the
    package with `ast` (tests/test_house.py, test_axis_roles.py, test_bounded_tables.py, test_engines.py,
    test_replay.py, and scan here) share it, where each parsed all ~450 files again (~1 CPU-s each). Shared:
    read it, never change it."""
    return _tree_of(pathlib.Path(path).resolve())


@lru_cache(maxsize=None)
def _tree_of(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@lru_cache(maxsize=None)
def _parsed(root: pathlib.Path, top: str) -> dict[str, ast.Module]:
    """Every module's syntax tree, parsed once for scan and names_from_above."""
    return {name: tree_of(path) for name, path in module_paths(root, top).items()}


def scan(root: pathlib.Path = ROOT, top: str = TOP, type_checking: bool = False) -> dict[str, tuple[Import, ...]]:
    """module -> its imports of the package's modules and of outside packages (by top-level name); with
    `type_checking`, those under ``if TYPE_CHECKING:`` too (counted as made at import)."""
    return _scan(root, top, type_checking)


@lru_cache(maxsize=None)
def _scan(root: pathlib.Path, top: str, type_checking: bool = False) -> dict[str, tuple[Import, ...]]:
    paths = module_paths(root, top)
    trees = _parsed(root, top)
    lazy = {name: _lazy_table(trees[name], name, top) for name in paths if is_package(name, paths)}
    result = {}
    for name, tree in trees.items():
        package = name if is_package(name, paths) else name.rpartition(".")[0]
        above = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)} | {package}
        lines = paths[name].read_text().splitlines()
        found: list[Import] = []

        def add(target: str, node: ast.stmt, at_import: bool) -> None:
            if target.split(".")[0] != top:
                target = target.split(".")[0]
            elif target not in paths:
                raise AssertionError(f"{paths[name]}:{node.lineno} imports {target}, which is no module")
            if target != name:
                found.append(Import(target, node.lineno, at_import, lines[node.lineno - 1].strip()))

        def add_module(module: str, node: ast.stmt, at_import: bool) -> None:
            """`module` and the packages above it that are not above the importing module."""
            parts = module.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix.split(".")[0] != top or prefix not in above:
                    add(prefix, node, at_import)

        for node, at_import in _statements(tree, type_checking):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add_module(alias.name, node, at_import)
                continue
            module = from_module(package, node)
            if module.split(".")[0] != top:
                add(module, node, at_import)
                continue
            add_module(module, node, at_import)
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                if sub in paths:
                    add(sub, node, at_import)
                elif alias.name != "*":
                    if module in above:  # a name read from a package this module sits in
                        add(module, node, at_import)
                    for where in lazy.get(module, {}).get(alias.name, ()):
                        add_module(where, node, at_import)
        result[name] = tuple(found)
    return result


def module_level_graph(root: pathlib.Path = ROOT, top: str = TOP) -> dict[str, set[str]]:
    """module -> the package's modules that importing it loads directly (module-level imports)."""
    return {name: {i.target for i in imports if i.at_import and i.target.split(".")[0] == top}
            for name, imports in scan(root, top).items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (or a module importing itself),
    each sorted; Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        found.append(sorted(component))
    return sorted(found)


def one_cycle(graph: dict[str, set[str]], members: list[str]) -> list[str]:
    """A shortest path around a component, first module repeated at the end, for messages."""
    inside = set(members)
    start = members[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph.get(node, ())):
            if child == start:
                return paths[node] + [start]
            if child in inside and child not in paths:
                paths[child] = paths[node] + [child]
                queue.append(child)
    raise AssertionError(f"no cycle through {start}")


def path_to(start: str, goal, imports: dict[str, tuple[Import, ...]], follow=lambda module, imp: True,
            ) -> list[tuple[str, Import]]:
    """The shortest chain of import statements from `start` to a target for which `goal(target)` holds,
    as (importing module, statement) hops, following every import (module level and inside functions)
    for which `follow(module, statement)` holds; [] when none reaches it."""
    came: dict[str, tuple[str, Import] | None] = {start: None}
    queue = [start]
    while queue:
        module = queue.pop(0)
        for imp in imports.get(module, ()):
            if imp.target in came or not follow(module, imp):
                continue
            came[imp.target] = (module, imp)
            if goal(imp.target):
                chain, at = [], imp.target
                while came[at] is not None:
                    chain.append(came[at])
                    at = came[at][0]
                return chain[::-1]
            queue.append(imp.target)
    return []


def describe(chain: list[tuple[str, Import]]) -> str:
    """A chain of `path_to`, one hop a line: "module:line (at import|in a function) statement"."""
    return "\n".join(f"  {module}:{imp.line} ({'at import' if imp.at_import else 'in a function'}) {imp.statement}"
                     for module, imp in chain)


def _defined(tree: ast.Module) -> set[str]:
    """Names a module defines itself at module level (functions, classes, assignments), not imported ones."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def names_from_above(root: pathlib.Path = ROOT, top: str = TOP) -> tuple[tuple[str, int, str, str, str], ...]:
    """Every `from PACKAGE import name` (any level) where PACKAGE holds the importing module (its own
    package or one above) and `name` is neither a submodule nor defined in PACKAGE's __init__ itself:
    (module, line, package, name, statement)."""
    paths = module_paths(root, top)
    trees = _parsed(root, top)
    found = []
    for name, tree in trees.items():
        package = name if is_package(name, paths) else name.rpartition(".")[0]
        above = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)} | {package}
        lines = paths[name].read_text().splitlines()
        for node, _ in _statements(tree, into_type_checking=True):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[: package.count(".") + 2 - node.level]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module not in above or not is_package(module, paths):
                continue
            own = _defined(trees[module])
            for alias in node.names:
                if f"{module}.{alias.name}" not in paths and alias.name not in own:
                    found.append((name, node.lineno, module, alias.name, lines[node.lineno - 1].strip()))
    return tuple(sorted(found))
