"""OneFlow nD SBP (split / broadcast / partial_sum) as TensorLayouts.

A placement (mesh) of shape ``(n0, n1, ...)`` carries one SBP per placement axis:
``B`` (broadcast), ``S(d)`` (split tensor dim d), ``P`` (partial_sum). The
placement axes become mesh axes named ``"axis_0", "axis_1", ...`` unless named. ``S(d)`` on several
placement axes splits d with the lower placement axis major (OneFlow: first
over groups, then within each group), so a layout whose multi-axis entry is
in another order has no SBP spelling.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from ...errors import DialectError
from ..layout import Layout, TensorLayout
from ...base.suggest import close_matches, word_list
from ...base.validate import counted
from ._common import as_int, check_major_order, entry_tokens, mesh_of, renamed_keyword, tensor_ndim

__all__ = [
    "Broadcast", "Split", "PartialSum", "SBP", "parse_sbp", "format_sbp", "sbp_to_layout",
    "layout_to_sbp", "sbp_of_axis",
]


@dataclass(frozen=True)
class Broadcast:
    """Every rank along this placement axis holds the whole (sub)tensor."""

    def __str__(self) -> str:
        return "B"


@dataclass(frozen=True)
class Split:
    """Tensor dim `tensor_dim` is cut evenly along this placement axis."""

    tensor_dim: int

    def __post_init__(self) -> None:
        dim = as_int(self.tensor_dim)
        if dim is None or dim < 0:
            raise DialectError(
                f"split tensor_dim {self.tensor_dim!r} must be a non-negative integer"
            )
        object.__setattr__(self, "tensor_dim", dim)

    def __str__(self) -> str:
        return f"S({self.tensor_dim})"


@dataclass(frozen=True)
class PartialSum:
    """Ranks along this placement axis hold addends; the value is their sum."""

    def __str__(self) -> str:
        return "P"


#: One nD SBP entry: `Broadcast | Split | PartialSum` (a type alias).
SBP = Union[Broadcast, Split, PartialSum]

# OneFlow prints an SBP as ``oneflow.sbp.split(dim=0)`` (older releases: ``split(axis=0)``), and its values are also
# called, ``flow.sbp.broadcast()``: these read as the short forms do, and so do spmdsim's own classes as their reprs
# write them (``Split(tensor_dim=0)``, ``Broadcast()``, ``PartialSum()``).
_SPLIT = re.compile(r"^(?:S|split|Split)\s*\(\s*(?:(?:dim|axis|tensor_dim)\s*=\s*)?(\d+)\s*\)$")
_PREFIX = re.compile(r"^(?:(?:oneflow|flow)\.)?sbp\.")  # `from oneflow import sbp`: sbp.split(0)
_NAMED = {"B": Broadcast(), "broadcast": Broadcast(), "broadcast()": Broadcast(), "Broadcast()": Broadcast(),
          "P": PartialSum(), "partial_sum": PartialSum(), "partial_sum()": PartialSum(), "PartialSum()": PartialSum()}
_EXPECTED = "expected 'B', 'P' or 'S(d)' with tensor dim d >= 0"
#: The names an SBP is written with, for the did-you-mean of a mistyped one (`split` and `S` take a dim).
_SPELLINGS = ("B", "P", "S", "broadcast", "partial_sum", "split")
#: A DTensor placement (or Paddle's, which reads as one) given as an SBP: R, Replicate(), Shard(0), dist.Partial().
_PLACEMENT = re.compile(r"^(?:(?:paddle\.distributed|dist)\.)?(?:R|Replicate\s*\(\s*\)|(?:Shard|Partial)\s*\(.*\))$")


def _parse_one(token: object, shown: object) -> SBP:
    if isinstance(token, (Broadcast, Split, PartialSum)):
        return token
    where = "" if isinstance(shown, str) and token == shown.strip() else f" in {shown!r}"
    if not isinstance(token, str):
        raise DialectError(f"sbp entry {token!r}{where} is not an SBP; {_EXPECTED}")
    text = _PREFIX.sub("", token.strip())
    if text in _NAMED:
        return _NAMED[text]
    match = _SPLIT.match(text)
    if match is None:
        raise DialectError(f"sbp {token!r}{where} is not valid; {_EXPECTED}{_meant(text)}")
    return Split(int(match.group(1)))


def _meant(text: str) -> str:
    """"; did you mean 'broadcast'?" for a mistyped name ('brodcast', 'b', 's(0)', 'spilt(0)'), what reads a DTensor
    placement for one ('Shard(0)'), the commas that entries written with spaces lack ('S(0) B'), or ""."""
    words = text.split()
    if len(words) > 1 and all(_PREFIX.sub("", w) in _NAMED or _SPLIT.match(_PREFIX.sub("", w)) for w in words):
        return f"; separate the entries with commas: {', '.join(words)!r}"
    if _PLACEMENT.match(text):
        return (f"; {text!r} is DTensor placement syntax: read it with placements_to_layout (--placements on the "
                "command line)")
    name, paren, rest = text.partition("(")
    names = [n for n in _SPELLINGS if (n in ("S", "split")) == bool(paren)]
    if name.strip() in names:  # the name is right, its argument is not: the expected forms say enough
        return ""
    close = close_matches(name.strip(), names, most=2)
    return f"; did you mean {word_list([repr(c + paren + rest) for c in close])}?" if close else ""


def parse_sbp(value: object) -> tuple[SBP, ...]:
    """Normalize an nD SBP to a tuple of Broadcast/Split/PartialSum, one per placement axis.

    Accepts text (``"B, S(1)"``, ``"(S(1), P)"``, OneFlow's ``"split(0)"``,
    ``"broadcast"``, ``"partial_sum"``), a single SBP object, or a sequence
    of objects and strings.
    """
    if isinstance(value, (Broadcast, Split, PartialSum)):
        return (value,)
    tokens = entry_tokens(value, "sbp", _EXPECTED, "SBPs", "placement axis")
    return tuple(_parse_one(t, value) for t in tokens)


def format_sbp(sbp: object) -> str:
    """Short form of an nD SBP: ``(B, S(0))``."""
    return "(" + ", ".join(str(s) for s in parse_sbp(sbp)) + ")"


def sbp_to_layout(
    sbp: object,
    mesh_shape: Union[int, Sequence[int], Layout, object] = None,
    ndim: Optional[int] = None,
    mesh_axis_names: Optional[Sequence[str]] = None,
    **deprecated: object,
) -> TensorLayout:
    """TensorLayout of an `ndim`-dim tensor with nD SBP `sbp` on a placement of `mesh_shape`.

    Mesh axes are named ``"axis_0", "axis_1", ...`` unless `mesh_axis_names` is given, or
    `mesh_shape` is a spmdsim Layout or Mesh, whose axes have names (the layout is then on
    that very Layout: ``sbp_to_layout("S(0), B", mesh, 2)``); a bare integer is a 1-D placement.
    (``placement_shape=`` is the deprecated name of `mesh_shape`.)
    """
    mesh_shape = renamed_keyword(deprecated, "placement_shape", "mesh_shape", mesh_shape,
                                 "sbp_to_layout")
    parsed = parse_sbp(sbp)
    shape, names, base = mesh_of(mesh_shape, mesh_axis_names, "placement shape")
    if len(parsed) != len(shape):
        raise DialectError(
            f"sbp {format_sbp(parsed)} has {counted(len(parsed), 'entry')} but placement shape "
            f"{shape!r} has {counted(len(shape), 'axis')}; expected one SBP per placement axis"
        )
    needed = max([s.tensor_dim + 1 for s in parsed if isinstance(s, Split)], default=0)
    dims = tensor_ndim(ndim, "sbp_to_layout", ", ".join(map(str, parsed)), "an SBP", needed)
    entries: list[list[str]] = [[] for _ in range(dims)]
    partial = []
    for axis, (name, item) in enumerate(zip(names, parsed)):
        if isinstance(item, Split):
            if item.tensor_dim >= dims:
                raise DialectError(
                    f"sbp {item} on placement axis {axis} splits tensor dim "
                    f"{item.tensor_dim}, but the tensor has {counted(dims, 'dim')}"
                )
            # Ascending placement-axis order: the lower axis is major.
            entries[item.tensor_dim].append(name)
        elif isinstance(item, PartialSum):
            partial.append(name)
    return (base or Layout(shape, names))(*(tuple(e) for e in entries), partial=partial)


def sbp_of_axis(tl: TensorLayout, axis: str) -> SBP:
    """The SBP of one mesh axis in `tl`: Split(d) when it splits dim d, PartialSum or Broadcast."""
    for tensor_dim, axes in enumerate(tl.tensor_map):
        if axis in axes:
            return Split(tensor_dim)
    return PartialSum() if axis in tl.partial else Broadcast()


def layout_to_sbp(tl: TensorLayout) -> tuple[SBP, ...]:
    """One SBP per mesh axis (in mesh-axis order) describing `tl`.

    Raises DialectError when a dim is split over several axes listed in an
    order other than ascending mesh order (SBP always makes the lower axis major).
    """
    check_major_order(tl, "nD SBP", "reorder the tuple or permute the placement axes")
    return tuple(sbp_of_axis(tl, name) for name in tl.layout.alias_name)
