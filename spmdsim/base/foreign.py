"""Keywords that another framework's function takes and spmdsim's namesake does not: one line saying so.

A PyTorch user passes ``use_reentrant=False`` to a checkpoint and ``fused=True`` to AdamW by habit, and Python's
"got an unexpected keyword argument" says only that the keyword is not taken. A function that mirrors another
framework's takes ``**foreign`` and hands it to `refuse_foreign` with a table: keyword -> what spmdsim does
instead. A keyword outside the table is Python's TypeError, as before.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..errors import OperatorError

__all__ = ["ForeignKeyword", "refuse_foreign"]


class ForeignKeyword(OperatorError, TypeError):
    """Another framework's keyword given to spmdsim's namesake: a TypeError, as Python's, saying what spmdsim does."""


def refuse_foreign(call: str, given: Mapping[str, Any], instead: Mapping[str, str], whose: str = "PyTorch's") -> None:
    """Raise for the first keyword of `given` (none: return): one line from `instead`, else Python's TypeError."""
    for name, value in given.items():
        said = instead.get(name)
        if said is None:
            raise TypeError(f"{call}() got an unexpected keyword argument {name!r}")
        raise ForeignKeyword(f"{call}({name}={value!r}): spmdsim does not take {whose} {name}; {said}")
