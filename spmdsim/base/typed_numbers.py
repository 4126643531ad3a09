"""Float flags that remember what was typed, so a refusal names the value as the user wrote it: the CLI's,
the examples' and the GPT reference's flags (a module below the packages, so gpt and nets import it without
importing cli, which imports them).

``type=float`` keeps only the number: with it ``--timeout -1`` would be refused as ``-1.0``, ``--flops -1e9`` as
``-1000000000.0``, and ``--flops 1e400`` (inf) as if it had been typed "inf". Pure: never imports mpi4py.

``byte_count`` reads a size as the commands take it (``64K``, ``8KiB``, ``4M``): collective's --size,
calibrate's --sizes and mpirun's --eager-limit alike.

A flag added by ``add_noted`` notes on the parsed namespace that the user typed it, so a refusal can say
a value the user left alone is the default (``said_fields``): "the default d_model 128 must be divisible by
--heads 3", not "--d-model 128 ...", a flag the user never typed; ``given_flags`` says which of some flags the
user typed (a flag that does nothing in the run asked for is refused where typed, its default never).
"""
from __future__ import annotations

import argparse
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping

__all__ = ["FlagFloat", "flag_float", "typed", "shown", "add_noted", "said_fields", "given_flags", "byte_count"]

#: The namespace attributes where `add_noted`'s flags keep the destinations typed, and those that can be.
_NOTED, _NOTABLE = "_typed_dests", "_notable_dests"


class FlagFloat(float):
    """A float that keeps `text`, the flag's value as typed (arithmetic gives plain floats)."""

    text: str


def flag_float(text: str) -> FlagFloat:
    """argparse type: `text` as a float that remembers `text` (ValueError for what float() refuses)."""
    value = FlagFloat(text)
    value.text = text.strip()
    return value


flag_float.__name__ = "float"  # argparse names the type: "argument --timeout: invalid float value: 'abc'"


def byte_count(text: str) -> int:
    """'64K' -> 65536, '-4' -> -4: the number a size reads as (binary units, K, M, G or T, a B or iB after them
    optional), its sign unchecked, for a caller that states its own range (spmdsim collective's --size,
    spmdsim mpirun's --eager-limit); ArgumentTypeError when it reads as none."""
    given = text
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(text[-1:], 1)  # T: 1.5T of a GH200 node
    number = text[:-1] if scale != 1 else text
    try:
        value = float(number) * scale
        whole = int(value)
    except (ValueError, OverflowError):  # OverflowError: "inf"
        raise argparse.ArgumentTypeError(f"size {given!r} is not a byte count like 64K or 4M") from None
    if whole != value:  # int() makes "1.5" 1 byte, silently: a size the user did not ask for
        raise argparse.ArgumentTypeError(f"size {given!r} is not a whole number of bytes; expected a byte count "
                                         "like 64K or 4M")
    return whole


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


def fixed(value: float, places: int) -> str:
    """`value` with `places` decimals, or in scientific notation with as many where it is 1e5 or more in size: a
    diverging loss (1e27) stays a number of a dozen characters in its column, not thirty digits."""
    return f"{value:.{places}f}" if abs(value) < 1e5 else f"{value:.{places}e}"


def _noting(base: type) -> type:
    """`base` (a parser's plain store action) that also notes its destination as typed on the namespace."""

    class Noted(base):  # type: ignore[misc, valid-type]
        def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
            super().__call__(parser, namespace, values, option_string)
            setattr(namespace, _NOTED, frozenset(getattr(namespace, _NOTED, ())) | {self.dest})

    Noted.__name__ = Noted.__qualname__ = f"Noted{base.__name__}"
    return Noted


#: A noting class for each parser's store action (the CLI's OnceParser registers its own: spmdsim.base.once_parser).
_NOTING: dict = {}


def add_noted(parser: Any, *names: str, **kwargs: Any) -> Any:
    """``parser.add_argument(*names, **kwargs)`` for a plain-store flag whose typing is noted on the namespace:
    each parse of `parser` starts with none noted and with the destinations that can be (`said_fields` reads
    both: a field whose flag is noted nowhere counts as typed)."""
    base = parser._registry_get("action", None, argparse._StoreAction)
    if base not in _NOTING:
        _NOTING[base] = _noting(base)
    action = parser.add_argument(*names, action=_NOTING[base], **kwargs)
    notable = (parser.get_default(_NOTABLE) or frozenset()) | {action.dest}
    parser.set_defaults(**{_NOTED: frozenset(), _NOTABLE: notable})
    return action


def said_fields(args: Any, said: Mapping[str, str]) -> tuple[dict, list]:
    """`said` (field -> the flag that sets it) split for GPTConfig's `said_as`: (the flags of the fields the
    user typed, the fields left at their default: those whose flag `add_noted` added and the parse did not
    see). A namespace no noting parser made (one built by hand) counts every field as typed."""
    typed_dests, notable = getattr(args, _NOTED, None), getattr(args, _NOTABLE, frozenset())
    if typed_dests is None:
        return dict(said), []
    defaults = [field for field, flag in said.items()
                if (dest := flag.lstrip("-").replace("-", "_")) in notable and dest not in typed_dests]
    return {field: flag for field, flag in said.items() if field not in defaults}, defaults


def given_flags(args: Any, *flags: str) -> list:
    """Those of `flags` (each added by `add_noted`) the command line typed, in the order named: a flag left
    out is not among them, a flag typed is, whatever its value (``--save-every 0``, the default's value, too).
    A namespace no noting parser made (one built by hand) gives them all, as `said_fields` counts them typed."""
    return list(said_fields(args, {flag: flag for flag in flags})[0])
