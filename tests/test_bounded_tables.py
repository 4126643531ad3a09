"""tests/bounded_tables.py lists every module-level table of spmdsim that starts over when full (the tests that
check a repeat decides nothing again start with them empty: the `empty_tables` fixture), and `empty` empties
them all."""
from __future__ import annotations

import ast
import importlib
import pathlib

import bounded_tables
import importkit

import spmdsim

_ROOT = pathlib.Path(spmdsim.__file__).parent
#: Functions handed a module's table to keep an entry in, bounded by them (spmdsim.nn.ops._common.prepare,
#: spmdsim.nn.ops.fused._remember): their first argument is such a table.
_KEEPERS = {"prepare", "_remember"}


def _bounded_globals() -> set:
    """(module, NAME) of each module-level NAME that spmdsim clears after a test of its length (``if len(NAME)
    >= ...: NAME.clear()``), or hands to a function that does (`_KEEPERS`)."""
    found = set()
    for path in _ROOT.rglob("*.py"):
        module = ".".join(path.relative_to(_ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        tree = importkit.tree_of(path)  # (parsed once, shared with the other tests that read the package)
        top = {t.id for node in tree.body if isinstance(node, (ast.Assign, ast.AnnAssign))
               for t in (node.targets if isinstance(node, ast.Assign) else [node.target]) if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) \
                    and isinstance(node.test.left, ast.Call) and getattr(node.test.left.func, "id", None) == "len" \
                    and isinstance(node.test.left.args[0], ast.Name):
                name = node.test.left.args[0].id
                cleared = {c.func.value.id for c in ast.walk(node) if isinstance(c, ast.Call)
                           and isinstance(c.func, ast.Attribute) and c.func.attr == "clear"
                           and isinstance(c.func.value, ast.Name)}
                found |= {(module, n) for n in cleared if n in top and (n == name or name in top)}
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in _KEEPERS and node.args \
                    and isinstance(node.args[0], ast.Name) and node.args[0].id in top:
                found.add((module, node.args[0].id))
    return found


def test_every_table_that_starts_over_when_full_is_listed():
    listed = {(module, name) for module, name, _ in bounded_tables.TABLES}
    missing = _bounded_globals() - listed
    assert not missing, f"add these tables to tests/bounded_tables.py's TABLES: {sorted(missing)}"
    assert len(listed) == len(bounded_tables.TABLES)  # each once


def test_empty_empties_every_listed_table_in_place():
    held = []
    for module, name, limit, table in bounded_tables.tables():
        assert isinstance(table, dict) and limit > 0, (module, name)
        table[("test_bounded_tables", 0)] = None
        held.append(table)
    bounded_tables.empty()
    assert all(table is getattr(importlib.import_module(module), name) and not table
               for (module, name, _), table in zip(bounded_tables.TABLES, held))
