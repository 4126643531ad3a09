"""Float flags that remember what was typed, so a refusal names the value as the user wrote it: the CLI's,
the examples' and the GPT reference's flags (a module below the packages, so gpt and nets import it without
importing cli, which imports them).

``type=float`` kept only the number: ``--timeout -1`` was refused as ``-1.0``, ``--flops -1e9`` as
``-1000000000.0``, and ``--flops 1e400`` (inf) as if it had been typed "inf". Pure: never imports mpi4py.
"""
from __future__ import annotations

from decimal import Decimal, InvalidOperation

__all__ = ["FlagFloat", "flag_float", "typed", "shown"]


class FlagFloat(float):
    """A float that keeps `text`, the flag's value as typed (arithmetic gives plain floats)."""

    text: str


def flag_float(text: str) -> FlagFloat:
    """argparse type: `text` as a float that remembers `text` (ValueError for what float() refuses)."""
    value = FlagFloat(text)
    value.text = text.strip()
    return value


flag_float.__name__ = "float"  # argparse names the type: "argument --timeout: invalid float value: 'abc'"


def typed(value: float) -> str:
    """`value` for a message: its text as typed, with what it reads as when that differs.

    ``1e400`` reads as inf, ``1e-400`` as 0.0 and ``0.99999999999999999999`` as 1.0: a message
    saying "1e400 must be finite" alone would be false. A default (a plain float) is shown as ``%g``.
    """
    text = getattr(value, "text", None)
    if text is None:
        return f"{value:g}"
    try:
        exact = Decimal(text.strip())
    except InvalidOperation:
        return text
    number = float(value)
    if exact.is_finite() and exact != Decimal(repr(number)):
        return f"{text} (read as {number!r})"
    return text


def shown(value: object) -> str:
    """`value` for a refusal that a library call and a flag share: as typed (`typed`) when a flag gave it (a
    FlagFloat), else its repr, as the library says it (``GPTConfig(lr=-1.0)``: "lr -1.0")."""
    return typed(value) if getattr(value, "text", None) is not None else repr(value)  # type: ignore[arg-type]
