"""`put`: an entry into a table of decided calls that lives as long as the process, bounded by its limit;
`owned_table` and `found_table`: a table kept for an object (a mesh, a communicator) as long as it lives."""
from __future__ import annotations

import weakref
from typing import Any, Optional

__all__ = ["put", "owned_table", "found_table"]


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


def owned_table(tables: dict, owner: Any) -> dict:
    """`owner`'s table in `tables` (id(owner) -> (a weak reference to it, its table)): a new empty one the first
    time, or when a new object took a dead one's id. Keyed by an int, so a lookup costs one dict read and no
    weak reference is made per lookup (a WeakKeyDictionary makes one); the entry goes with its owner (its weak
    reference's callback), so holding the table never keeps the owner, nor what it holds, alive."""
    key = id(owner)
    found = tables.get(key)
    if found is not None and found[0]() is owner:
        return found[1]

    def dropped(ref: Any) -> None:  # the owner is gone: its entry too (unless a new owner took its id)
        if tables.get(key, (None,))[0] is ref:
            tables.pop(key, None)

    found = tables[key] = (weakref.ref(owner, dropped), {})
    return found[1]


def found_table(tables: dict, owner: Any) -> Optional[dict]:
    """`owner`'s table in `tables` (`owned_table`'s) where it has one, else None; none is made."""
    found = tables.get(id(owner))
    return found[1] if found is not None and found[0]() is owner else None
