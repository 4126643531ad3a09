"""`put`: an entry into a table of decided calls that lives as long as the process, bounded by its limit."""
from __future__ import annotations

from typing import Any

__all__ = ["put"]


def put(table: dict, key: Any, value: Any, limit: int, also: tuple = (), starts_over: bool = True) -> Any:
    """Set ``table[key] = value`` and return `value`; a table already holding `limit` entries is emptied first.

    The tables of decided calls (checked layouts, prepared operators, compiled moves, ...) live as long as the
    process; a long run over many shapes, layouts or meshes would otherwise grow them without end. Starting
    over changes no result: what a table held is only ever decided again, at the cost of deciding it once
    more. The tables stay plain dicts, so their reads (``get``, ``[]``, ``in``) keep the interpreter's
    fast paths for dicts on the hot path of every operator.

    `also`: tables that start over with this one (a twin keyed alike, written beside it with plain sets).
    `starts_over=False`: a full table keeps what it holds and adds nothing more (a new key is decided each
    time it comes)."""
    if len(table) >= limit:
        if not starts_over:
            return value
        table.clear()
        for other in also:
            other.clear()
    table[key] = value
    return value
