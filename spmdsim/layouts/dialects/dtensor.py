"""PyTorch DTensor placements (Shard / Replicate / Partial) as TensorLayouts.

Plain values mirroring ``torch.distributed.tensor.placement_types``; torch is
never imported. One placement per device-mesh dim. ``Shard(d)`` on several
mesh dims splits d with the lower mesh dim major (DTensor's default
left-to-right order; its ``_StridedShard`` for other orders is not modelled),
and on a layout cut "chunk" cuts it mesh dim by mesh dim, as DTensor does.
Mesh dims without names are called ``"axis_0", "axis_1", ...``. Paddle's auto-parallel placements
(``[dist.Shard(0), dist.Replicate()]``) mean the same and read as these do.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence, Union

from ...errors import DialectError
from ..layout import Layout, TensorLayout
from ..slicing import all_bounds, shard_bounds
from ...base.suggest import close_matches, word_list
from ...base.validate import counted
from ._common import as_int, check_major_order, entry_tokens, mesh_of, renamed_keyword, tensor_ndim
from .sbp import parse_sbp

__all__ = [
    "Shard", "Replicate", "Partial", "Placement", "parse_placements", "format_placements",
    "placements_to_layout", "layout_to_placements",
]


@dataclass(frozen=True)
class Shard:
    """Tensor dim `dim` is cut along this mesh dim (negative dims count from the end).

    Evenly, or by torch.chunk's rule on a layout cut "chunk" (DTensor's uneven Shard)."""

    dim: int

    def __post_init__(self) -> None:
        dim = as_int(self.dim)
        if dim is None:
            raise DialectError(f"shard dim {self.dim!r} must be an integer")
        object.__setattr__(self, "dim", dim)

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class Replicate:
    """Every rank along this mesh dim holds the same (sub)tensor."""

    def __str__(self) -> str:
        return "R"


#: The reduce ops a DTensor `Partial` may name (PyTorch's c10d ReduceOp, lower case); spmdsim's layouts hold
#: pending sums, so only "sum" converts to one (`placements_to_layout` refuses the others in one line).
_REDUCE_OPS = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum")


@dataclass(frozen=True)
class Partial:
    """Ranks along this mesh dim hold pending values combined by `reduce_op`."""

    reduce_op: str = "sum"

    def __post_init__(self) -> None:
        if not isinstance(self.reduce_op, str) or not self.reduce_op:
            raise DialectError(f"partial reduce_op {self.reduce_op!r} must be a name such as 'sum'")
        if self.reduce_op not in _REDUCE_OPS:
            close = close_matches(self.reduce_op.lower(), _REDUCE_OPS, most=1)
            raise DialectError(f"partial reduce_op {self.reduce_op!r} is not a reduce op; expected one of "
                               f"{', '.join(_REDUCE_OPS)} (PyTorch's c10d ReduceOp names)"
                               + (f"; did you mean {close[0]!r}?" if close else ""))

    def __str__(self) -> str:
        return "P" if self.reduce_op == "sum" else f"P({self.reduce_op})"


#: One DTensor placement: `Shard | Replicate | Partial` (a type alias).
Placement = Union[Shard, Replicate, Partial]

# PyTorch prints a DTensor's placements with their reprs, ``(Shard(dim=0), Replicate(), Partial(sum))``, and
# its constructors take keywords, ``Partial(reduce_op="sum")``: both read as the short forms do.
_SHARD = re.compile(r"^(?:S|Shard)\s*\(\s*(?:dim\s*=\s*)?(-?\d+)\s*\)$")
_PARTIAL = re.compile(r"^(?:P|Partial)\s*\(\s*(?:reduce_op\s*=\s*)?['\"]?(\w+)['\"]?\s*\)$")
_STRIDED = re.compile(r"^(?:_S|_StridedShard)\s*\(")
_NAMED = {"R": Replicate(), "Replicate()": Replicate(), "P": Partial(), "Partial()": Partial()}
_EXPECTED = "expected 'S(d)', 'R' or 'P' (Shard(d), Replicate(), Partial())"
# Paddle's auto-parallel placements (dist.shard_tensor(x, mesh, [dist.Shard(0), dist.Replicate()])) are DTensor's,
# one per mesh dim; its Partial names a ReduceType.
_PADDLE = re.compile(r"^(?:paddle\.distributed|dist)\.")
_PADDLE_PARTIAL = re.compile(
    r"^Partial\s*\(\s*(?:reduce_type\s*=\s*)?(?:(?:paddle\.distributed|dist)\.)?ReduceType\.(\w+)\s*\)$")
_PADDLE_REDUCE = {"kRedSum": "sum", "kRedAvg": "avg", "kRedMax": "max", "kRedMin": "min", "kRedProd": "product"}


def _parse_one(token: object, shown: object) -> Placement:
    if isinstance(token, (Shard, Replicate, Partial)):
        return token
    where = "" if isinstance(shown, str) and token == shown.strip() else f" in {_listed(shown)}"
    if _is_class(token):  # [Shard(0), Replicate]: the class written for its instance
        raise DialectError(f"placement {token.__name__} (the class){where} is not a placement; expected "
                           f"{'Shard(d)' if token is Shard else token.__name__ + '()'}, an instance")
    if not isinstance(token, str):
        raise DialectError(f"placement {token!r}{where} is not a placement; {_EXPECTED}")
    text, prefix = token.strip(), ""
    paddle = _PADDLE.match(text)
    if paddle is not None:
        text, prefix = text[paddle.end():], paddle.group(0)
        match = _PADDLE_PARTIAL.match(text)
        if match is not None:
            if match.group(1) not in _PADDLE_REDUCE:
                raise DialectError(f"placement {token!r}{where} reduces by Paddle's {match.group(1)}, which spmdsim "
                                   "does not model (its partial layouts hold pending sums); expected dist.Partial() "
                                   "(ReduceType.kRedSum), dist.Shard(d) or dist.Replicate()")
            return Partial(_PADDLE_REDUCE[match.group(1)])
    if text in _NAMED:
        return _NAMED[text]
    if _STRIDED.match(text):
        raise DialectError(f"placement {token!r}{where} is DTensor's _StridedShard (a dim sharded right to left, "
                           "as FSDP2 with TP does), which spmdsim does not model; expected Shard(d) on each mesh "
                           "dim, or write the layout with a tensor map that lists the later mesh axis first "
                           "(the same blocks where the dim's size divides by its shards)")
    match = _SHARD.match(text)
    if match is not None:
        return Shard(int(match.group(1)))
    match = _PARTIAL.match(text)
    if match is not None:
        return Partial(match.group(1))
    raise DialectError(f"placement {token!r}{where} is not valid; {_EXPECTED}{_sbp_hint(text) or _meant(text, prefix)}")


_CLASSES = (Shard, Replicate, Partial)


def _is_class(token: object) -> bool:
    """Whether `token` is one of the placement classes itself (compared by identity: a token may be an array)."""
    return any(token is c for c in _CLASSES)


def _listed(value: object) -> str:
    """`value`, placements as given, for a refusal: its repr, with a placement class by its name (``Replicate``)."""
    items = value if isinstance(value, (list, tuple)) else None
    if items is None or not any(map(_is_class, items)):
        return repr(value)
    text = ", ".join(t.__name__ if _is_class(t) else repr(t) for t in items)
    return f"[{text}]" if isinstance(value, list) else f"({text}{',' if len(items) == 1 else ''})"


#: A mistyped placement: a name, then its argument in brackets or bare digits ('Replicat()', 'Shard0', 'Shard[0]').
_TYPO = re.compile(r"^([A-Za-z_]\w*?)\s*(?:[(\[]\s*(.*?)\s*[)\]]|(-?\d+))?$")
_SHORT = {"S": "Shard", "R": "Replicate", "P": "Partial"}


def _meant(text: str, prefix: str = "") -> str:
    """"; did you mean 'Replicate()'?" for a mistyped placement ('Replicat()', 'Shard0', 'Partiall()', 'shard(0)',
    'Replicate' without its brackets), written with the same `prefix` (Paddle's 'dist.'), or ""."""
    match = _TYPO.match(text)
    if match is None:
        return ""
    name, inside, digits = match.groups()
    arg = inside if inside is not None else (digits or "")
    names = [name] if name in _SHORT else close_matches(name, _SHORT.values(), most=2)
    meant = []
    for close in names:
        if _SHORT.get(close, close) == "Replicate":
            meant.append(f"{close}" if close == "R" else f"{close}()")
        elif _SHORT.get(close, close) == "Shard":
            meant.append(f"{close}({arg or 'd'})")
        else:  # Partial: its reduce op, a name
            op = arg if arg and not arg.lstrip("-").isdigit() else ""
            meant.append(f"{close}({op})" if op or close != "P" else close)
    meant = [m for m in meant if m != text]  # the name is right, its argument is not: the expected forms say enough
    return f"; did you mean {word_list([repr(prefix + m) for m in meant])}?" if meant else ""


def _sbp_hint(text: str) -> str:
    """What reads a OneFlow SBP given as a placement ('split(0)', 'broadcast', 'B'), or ""."""
    try:
        parse_sbp(text)
    except DialectError:
        return ""
    return (f"; {text!r} is OneFlow SBP syntax: read it with sbp_to_layout (--sbp, over --placement, on the "
            "command line)")


def parse_placements(value: object) -> tuple[Placement, ...]:
    """Normalize placements: objects, or text such as ``"S(0), R"`` / ``"(Shard(1), Partial())"``."""
    parsed, paddle = _parse_all(value)
    if paddle:
        _refuse_paddle_coshard(value, [p.dim for p in parsed if isinstance(p, Shard)])
    return parsed


def _parse_all(value: object) -> tuple[tuple[Placement, ...], bool]:
    """The placements of `value`, and whether any is written in Paddle's spelling (``dist.Shard(0)``)."""
    if isinstance(value, (Shard, Replicate, Partial)):
        return (value,), False
    tokens = entry_tokens(value, "placements", _EXPECTED, "placements", "mesh dim", plural=True)
    paddle = any(isinstance(t, str) and _PADDLE.match(t.strip()) for t in tokens)
    return tuple(_parse_one(t, value) for t in tokens), paddle


def _refuse_paddle_coshard(value: object, dims: list[int]) -> None:
    """Refuse placements in Paddle's spelling that shard one tensor dim on several mesh dims: Paddle orders such
    a co-shard by its own shard_order, by release. `dims`: the Shard dims, counted from the end where negative
    (``dist.Shard(-1)`` and ``dist.Shard(1)`` of a 2-D tensor are one dim) once the tensor's rank is known."""
    for dim in dims:
        if dims.count(dim) > 1:
            raise DialectError(f"placements {value!r} shard tensor dim {dim} on several mesh dims in Paddle's "
                               "spelling, whose order over them spmdsim does not read; expected one mesh dim per "
                               "tensor dim, or a spmdsim Layout whose tensor map lists the major axis first")


def format_placements(placements: object) -> str:
    """Short form: ``(S(0), R)``."""
    return "(" + ", ".join(str(p) for p in parse_placements(placements)) + ")"


def placements_to_layout(
    placements: object,
    mesh_shape: Sequence[int],
    ndim: Optional[int] = None,
    mesh_axis_names: Optional[Sequence[str]] = None,
    cut: Optional[str] = None,
    **deprecated: object,
) -> TensorLayout:
    """TensorLayout of an `ndim`-dim DTensor with these placements on a mesh of `mesh_shape`.

    `ndim` left out is one line saying it is needed (placements cannot tell it).

    Only ``Partial("sum")`` is supported: spmdsim's partial axes hold pending sums.
    Mesh dims are named ``"axis_0", "axis_1", ...`` unless `mesh_axis_names` is given
    (``mesh_dim_names=`` is its deprecated name). `mesh_shape` may also be a spmdsim
    Layout or Mesh, whose axes have names: ``placements_to_layout("S(0), R", mesh, 2)``.
    DTensor cuts a dim that does not divide by torch.chunk's rule: make the mesh cut so,
    ``Mesh(Layout(..., cut="chunk"))``, whose rule the layout keeps (a tensor's layout
    and its mesh cut alike); ``cut="chunk"`` does it for a bare shape, "even" by default.
    Where sizes divide the two agree (docs/explanation/semantics.md, "Uneven shards").
    """
    mesh_axis_names = renamed_keyword(deprecated, "mesh_dim_names", "mesh_axis_names",
                                      mesh_axis_names, "placements_to_layout")
    parsed, paddle = _parse_all(placements)  # a co-shard in Paddle's spelling is refused once dims are counted
    shape, names, base = mesh_of(mesh_shape, mesh_axis_names)
    if len(parsed) != len(shape):
        raise DialectError(
            f"placements {format_placements(parsed)} have {counted(len(parsed), 'entry')} but mesh "
            f"shape {shape!r} has {counted(len(shape), 'dim')}; expected one placement per mesh dim"
        )
    needed = max([p.dim + 1 if p.dim >= 0 else -p.dim for p in parsed if isinstance(p, Shard)], default=0)
    dims = tensor_ndim(ndim, "placements_to_layout", ", ".join(map(str, parsed)), "placements", needed)
    if paddle:  # dist.Shard(-1) and dist.Shard(1) of a 2-D tensor shard one dim
        shard_dims = [p.dim + dims if p.dim < 0 else p.dim for p in parsed if isinstance(p, Shard)]
        _refuse_paddle_coshard(placements, [d for d in shard_dims if 0 <= d < dims])
    entries: list[list[str]] = [[] for _ in range(dims)]
    partial = []
    for mesh_dim, (name, item) in enumerate(zip(names, parsed)):
        if isinstance(item, Shard):
            tensor_dim = item.dim + dims if item.dim < 0 else item.dim
            if not 0 <= tensor_dim < dims:
                raise DialectError(
                    f"placement {item} on mesh dim {mesh_dim} shards tensor dim {item.dim}, "
                    f"but the tensor has {counted(dims, 'dim')}"
                )
            # Ascending mesh-dim order: the lower mesh dim is major.
            entries[tensor_dim].append(name)
        elif isinstance(item, Partial):
            if item.reduce_op != "sum":
                raise DialectError(
                    f"partial reduce_op {item.reduce_op!r} on mesh dim {mesh_dim} is not "
                    "supported; spmdsim partial layouts hold pending sums (reduce_op='sum')"
                )
            partial.append(name)
    mesh = base or Layout(shape, names)
    return (mesh if cut is None else mesh.with_cut(cut))(*(tuple(e) for e in entries), partial=partial)


def layout_to_placements(tl: TensorLayout) -> tuple[Placement, ...]:
    """One placement per mesh axis (in mesh-axis order) describing `tl`.

    Raises DialectError when a dim is split over several axes listed in an
    order other than ascending mesh order (not expressible without _StridedShard).
    """
    check_major_order(tl, "DTensor placements", "DTensor would need _StridedShard")
    shard_dim = {a: d for d, axes in enumerate(tl.tensor_map) for a in axes}
    out: list[Placement] = []
    for name in tl.layout.alias_name:
        if name in tl.partial:
            out.append(Partial())
        elif name in shard_dim:
            out.append(Shard(shard_dim[name]))
        else:
            out.append(Replicate())
    return tuple(out)


def placements_of(tl: TensorLayout, shape: Sequence[int]) -> tuple[Placement, ...]:
    """`layout_to_placements` of a tensor of global `shape`: refused (DialectError) where DTensor would cut it
    otherwise than `tl` does: a dim that does not divide under a cut other than torch.chunk's (DTensor
    has only that rule; "balanced" has no DTensor form there). Under the chunk rule a dim sharded on
    several mesh dims is cut mesh dim by mesh dim, as DTensor cuts it (`check_uneven_shards`)."""
    if tl.layout.cut != "chunk":
        for d in tl.uneven_dims(shape):
            raise DialectError(f"tensor dim {d} of size {shape[d]!r} is cut {tl.layout.cut!r} into "
                               f"{tl.num_shards(d)} unequal pieces: DTensor cuts a dim that does not divide by "
                               "torch.chunk's rule only, so these placements would name another cut; expected "
                               "a size that divides, or cut 'chunk'")
    check_uneven_shards(tl, shape)
    return layout_to_placements(tl)


def check_uneven_shards(tl: TensorLayout, shape: Sequence[int]) -> None:
    """Raise DialectError where DTensor would cut `shape` otherwise than `tl` does.

    DTensor cuts a dim sharded on several mesh dims one mesh dim after the other
    (torch.chunk of torch.chunk). spmdsim's chunk rule does the same (spmdsim.layouts.slicing),
    so a layout cut "chunk" always passes; the balanced rule cuts such a dim once into
    the product of the shard counts, which differs for some sizes that do not divide
    (6 over 2 x 2: [0, 3) then [0, 2), [2, 3) against [0, 2), [2, 4), [4, 5), [5, 6)).
    """
    cut = tl.layout.cut
    for d in tl.uneven_dims(shape):
        sizes = tl.counts_per_dim[d]
        if len([n for n in sizes if n > 1]) < 2:
            continue
        pieces = [(0, shape[d])]
        for n in sizes:  # DTensor: each mesh dim cuts every piece of the one before
            pieces = [(lo + a, lo + b) for lo, hi in pieces for a, b in
                      (shard_bounds(hi - lo, n, i, cut) for i in range(n))]
        held = list(all_bounds(shape[d], sizes, cut))
        if pieces != held:
            raise DialectError(f"tensor dim {d} of size {shape[d]!r} sharded on mesh dims {tl.tensor_map[d]!r}: "
                               f"DTensor would cut it piece by piece ({pieces!r}), spmdsim cuts it once "
                               f"({held!r}) by rule {cut!r}; expected a size that divides, cut 'chunk', or one "
                               "mesh dim per tensor dim")
