"""spmdsim's tables of decided calls start over when full through spmdsim.base.tables.put alone:
tests/bounded_tables.py finds the module-level ones in the sources (the tests that check a repeat decides
nothing again start with them empty: the `empty_tables` fixture), and `empty` empties them all in place."""
from __future__ import annotations

import ast
import importlib
import pathlib

import bounded_tables
import importkit

import spmdsim
from spmdsim.base.tables import put

_ROOT = pathlib.Path(spmdsim.__file__).parent


def _by_hand() -> list:
    """"path:line" of each ``if len(E) >= ...:`` (any comparison) whose body empties E (``E.clear()``, or
    ``E = {}``) outside spmdsim/base/tables.py: a table bounded by hand, not by `put`."""
    found = []
    for path in sorted(_ROOT.rglob("*.py")):
        if path == _ROOT / "base" / "tables.py":
            continue
        for node in ast.walk(importkit.tree_of(path)):  # (parsed once, shared with the other tests that read it)
            if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                    and isinstance(node.test.left, ast.Call) and getattr(node.test.left.func, "id", None) == "len"
                    and len(node.test.left.args) == 1):
                continue
            held = ast.unparse(node.test.left.args[0])
            for inner in ast.walk(node):
                cleared = isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) \
                    and inner.func.attr == "clear" and ast.unparse(inner.func.value) == held
                emptied = isinstance(inner, ast.Assign) and isinstance(inner.value, ast.Dict) \
                    and not inner.value.keys and any(ast.unparse(t) == held for t in inner.targets)
                if cleared or emptied:
                    found.append(f"{path.relative_to(_ROOT.parent)}:{node.lineno}")
                    break
    return found


def test_no_table_starts_over_by_hand():
    by_hand = _by_hand()
    assert not by_hand, f"keep these tables' entries with spmdsim.base.tables.put: {by_hand}"


def test_the_tables_found_are_plain_dicts_each_with_its_limit():
    found = bounded_tables.tables()
    assert len(found) > 50 and len({id(table) for *_, table in found}) == len(found)
    # plain dicts: their reads keep the interpreter's fast paths (a subclass's `[]`, `get` and `in` are slower)
    assert all(type(table) is dict and type(limit) is int and limit > 0 for *_, limit, table in found), found
    names = {(module, name): limit for module, name, limit, _ in found}
    assert ("spmdsim.runtime.compiled", "_MOVES") not in names  # a mesh's compiled moves live on it (Mesh._moves)
    # contraction's twin starts over with its table; an operator's prepared table is kept through `prepare`
    assert names[("spmdsim.references.contraction", "_PLAIN")] == names[("spmdsim.references.contraction", "_RUNS")]
    assert names[("spmdsim.nn.ops.einsum", "_PREPARED")] == 4096


def test_empty_empties_every_table_in_place():
    held = []
    for module, name, _limit, table in bounded_tables.tables():
        table[("test_bounded_tables", 0)] = None
        held.append((module, name, table))
    bounded_tables.empty()
    assert all(table is getattr(importlib.import_module(module), name) and not table for module, name, table in held)


def test_a_full_table_starts_over_then_keeps_the_entry():
    twin: dict = {}
    table: dict = {}
    assert put(table, "a", 1, 2, also=(twin,)) == 1 and put(table, "b", 2, 2, also=(twin,)) == 2
    assert table == {"a": 1, "b": 2}
    twin.update(a=1, b=2)
    assert put(table, "c", 3, 2, also=(twin,)) == 3 and table == {"c": 3} and not twin  # full: both start over
    stops: dict = {}
    assert put(stops, "a", 1, 1, starts_over=False) == 1 and put(stops, "b", 2, 1, starts_over=False) == 2
    assert stops == {"a": 1}
