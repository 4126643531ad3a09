"""Keywords that another framework's function takes and spmdsim's namesake has no parameter for.

A PyTorch user passes ``use_reentrant=False`` to a checkpoint and ``fused=True`` to AdamW by habit. Code
that asks for what spmdsim does anyway runs unchanged; a value asking for something spmdsim does not do
is refused in one line. A function that mirrors another framework's takes ``**foreign`` and hands it to
`take_foreign` with a table: keyword -> (the values it accepts, what spmdsim does instead). A keyword
outside the table is Python's TypeError, as before. Another framework's attribute names on a class
(``x.to_local()``) are each a `ForeignAttribute`, whose read is one line naming spmdsim's.
"""
from __future__ import annotations

import numbers
from typing import Any, Callable, Mapping

from ..errors import OperatorError

__all__ = ["ANY", "ForeignKeyword", "take_foreign", "ForeignName", "ForeignAttribute", "CallableInt"]

#: A table's accepted values for a keyword whose every value asks for what spmdsim does (a hint).
ANY = "any value"


class ForeignKeyword(OperatorError, TypeError):
    """Another framework's keyword given a value spmdsim's namesake does not do: a TypeError, as Python's."""


class ForeignName(OperatorError, AttributeError):
    """Another framework's attribute asked of a spmdsim object: an AttributeError (``hasattr`` is False) saying
    spmdsim's."""


class ForeignAttribute:
    """Another framework's attribute name on a spmdsim class (``x.to_local()``, ``mesh.get_coordinate()``): reading
    it raises `ForeignName`, one line naming spmdsim's. A descriptor per name, not ``__getattr__``: CPython
    specializes no attribute read of an object whose class has one, and any other missing name gets Python's own
    AttributeError. `owner` is how the line writes the object ("x", "mesh")."""

    __slots__ = ("owner", "spelled", "whose", "ours")

    def __init__(self, owner: str, spelled: str, whose: str, ours: str) -> None:
        self.owner, self.spelled, self.whose, self.ours = owner, spelled, whose, ours

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        # PyTorch's and JAX's names: the porting tutorial's; OneFlow's and Paddle's: the dialects' reference
        page = "docs/tutorials/porting.md" if "PyTorch" in self.whose or "JAX" in self.whose else \
            "docs/reference/dialects.md"
        raise ForeignName(f"{self.owner}.{self.spelled} is {self.whose}; spmdsim's is {self.ours} ({page})")


class CallableInt(int):
    """An int attribute that another framework calls as a method (numpy's and JAX's ``x.size`` against PyTorch's
    ``x.size()`` and ``mesh.size(dim)``): the int, compared and computed with as one, and called, `call(*args)`.
    Pickled and copied as the plain int (a message, a record): the call's object stays behind."""

    def __new__(cls, value: int, call: Callable[..., Any]) -> "CallableInt":
        self = super().__new__(cls, value)
        self._call = call
        return self

    def __call__(self, *args: Any) -> Any:
        return self._call(*args)

    def __reduce__(self) -> tuple:
        return int, (int(self),)


def _same(value: Any, accepted: Any) -> bool:
    """Whether `value` is `accepted`: None is None, a bool a bool (never 1), a number a number, a str a str."""
    if accepted is None:
        return value is None
    if isinstance(accepted, bool):
        return type(value).__name__ in ("bool", "bool_") and bool(value) is accepted
    if isinstance(accepted, numbers.Real):
        return isinstance(value, numbers.Real) and type(value).__name__ not in ("bool", "bool_") and value == accepted
    return type(value) is type(accepted) and value == accepted


def _listed(values: tuple) -> str:
    """``False``, ``2 or 2.0``, ``None, False or True``."""
    said = [repr(v) for v in values]
    return said[0] if len(said) == 1 else f"{', '.join(said[:-1])} or {said[-1]}"


def _shown(value: Any) -> str:
    """`value` for the line: a function by its name (its repr's address differs between ranks), else its repr."""
    if callable(value) and not isinstance(value, type):
        return f"<function {getattr(value, '__name__', type(value).__name__)}>"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def take_foreign(call: str, given: Mapping[str, Any], table: Mapping[str, tuple]) -> None:
    """Accept every keyword of `given` whose value the table accepts (spmdsim does that anyway); raise for
    the first other one: `ForeignKeyword` in one line when the table has the keyword, else Python's TypeError.

    Args:
        table: keyword -> (accepted values, or `ANY`; what spmdsim does instead, said after a refusal).
    """
    for name, value in given.items():
        if name not in table:
            raise TypeError(f"{call}() got an unexpected keyword argument {name!r}")
        accepted, instead = table[name]
        if accepted is ANY or any(_same(value, a) for a in accepted):
            continue
        raise ForeignKeyword(f"{call}({name}={_shown(value)}): spmdsim does not do this; {instead}; {name} may be "
                             f"{_listed(accepted)} or left out")
