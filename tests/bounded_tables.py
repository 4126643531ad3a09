"""spmdsim's module-level tables of decided calls (kept with spmdsim.base.tables.put), for tests that need them empty.

Such a table (checked layouts, prepared operators, compiled moves, ...) lives as long as the process and starts
over when it reaches its limit. Under pytest-xdist one worker runs hundreds of tests: the earlier ones can fill a
table to the brim, and it then starts over inside a later test, between its first call and the repeat it checks,
which decides (plans, checks, compiles) again. A test that asserts a repeat decides nothing again, or counts the
calls such a table spares, starts with them empty: ``@pytest.mark.usefixtures("empty_tables")``
(tests/conftest.py), which calls `empty()`.

The tables are found in the sources: every module global that a module of spmdsim hands to `put` (or to
spmdsim.nn.ops._common.prepare, which hands its table to `put`) as the table (test_bounded_tables.py checks no
table starts over by hand instead).
"""
from __future__ import annotations

import ast
import importlib
import sys
from functools import lru_cache

import importkit

#: Calls whose first argument is a table kept with `put`, and the position of its limit among their arguments.
KEEPERS = {"put": 3, "prepare": 1}


@lru_cache(maxsize=1)
def sources() -> tuple:
    """((module, global's name, limit), ...) of every module-level table the sources keep with `KEEPERS` (and
    each twin a `put` empties with its table: ``also=(...)``), each once, under the module that makes it
    (``_PLANS: dict = {}``; a module that imports it and calls `put` on it too is not another table)."""
    found: dict = {}
    paths = importkit.module_paths()
    for module, path in sorted(paths.items()):
        tree = importkit.tree_of(path)  # (parsed once, shared with the other tests that read the package)
        made = {t.id: (module, t.id) for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Name)}
        made.update(_imported(tree, module, paths))  # (``from .counters import _PLANS``: counters' table)
        for node in ast.walk(tree):
            at = KEEPERS.get(getattr(node, "func", None) and getattr(node.func, "id", None))
            if at is not None and len(node.args) > at and isinstance(node.args[0], ast.Name) \
                    and node.args[0].id in made:
                limit = node.args[at].value if isinstance(node.args[at], ast.Constant) else None
                twins = [k.value.elts for k in node.keywords if k.arg == "also" and isinstance(k.value, ast.Tuple)]
                for name in [node.args[0]] + [t for elts in twins for t in elts]:  # `also`: start over with it
                    if isinstance(name, ast.Name) and name.id in made:
                        found.setdefault(made[name.id], limit)
    return tuple((module, name, limit) for (module, name), limit in found.items())


def _imported(tree: ast.Module, module: str, paths: dict) -> dict:
    """{name: (the spmdsim module it comes from, its name there)} of `tree`'s module-level ``from ... import
    name`` statements."""
    package = module if importkit.is_package(module, paths) else module.rpartition(".")[0]
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            source = importkit.from_module(package, node)
            if source.startswith("spmdsim"):
                found.update({alias.asname or alias.name: (source, alias.name) for alias in node.names})
    return found


def tables() -> list:
    """[(module, name, limit, the dict itself)] of `sources()`, every module imported."""
    return [(module, name, limit, getattr(importlib.import_module(module), name))
            for module, name, limit in sources()]


def empty() -> None:
    """Empty every table of `sources()` in the modules imported so far (those not imported hold nothing yet) in
    place: a module may hold one bound elsewhere too (a default argument, or a closure), and a fresh dict set in
    its place would not be the one that code reads. What they held is only ever decided again: no result
    changes."""
    for module, name, _limit in sources():
        held = sys.modules.get(module)
        if held is not None:
            getattr(held, name).clear()
    counters = sys.modules.get("spmdsim.layouts.counters")  # its regions' tables start over by their bytes
    if counters is not None:
        counters._INNERS.clear()
        counters._BASES.clear()
        counters._INNER_BYTES[0] = 0
