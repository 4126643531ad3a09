"""Pure layout inference for slicing one dim (`narrow`), joining tensors along one (`concatenate`), and
numpy's `broadcast_to` (new and size-1 dims grow whole on every rank, the others keep their splits).

A slice of a dim whole on every rank is local: each rank slices its own
block and nothing moves. A slice of a split dim keeps the split where the
slice's length divides among the dim's shards (else the dim's axes that
split it into the most shards that divide it, else the dim whole), and each rank receives
the rows of its new block it does not hold, from the rank of its group that
does (`spmdsim.programs.plan.shift`: the lower bound, one Alltoallv). The other dims
keep their splits and a pending sum stays pending (a slice is linear). A
join along a split dim moves each operand's rows to the ranks whose block of
the result holds them, the same way. Operands of `concatenate` that disagree
on the other dims are moved by the least-bytes rule of the elementwise ops
(spmdsim.programs.infer.assign). Never imports mpi4py.
"""
from __future__ import annotations

import itertools
import string
from dataclasses import dataclass
from typing import Any, Sequence

from ...errors import OperatorError, ShapeError
from ...layouts.layout import TensorLayout
from ...layouts.notation import format_entry
from ...base.validate import as_int, dims_expected
from .assign import Choice, choose_splits

__all__ = ["ConcatPlan", "infer_narrow", "infer_concatenate", "infer_broadcast_to"]


def _tensor_dim(dim: object, ndim: int, op: str) -> int:
    d = as_int(dim)
    if d is None or isinstance(dim, bool) or not -ndim <= d < ndim:
        raise OperatorError(f"{op}: dim {dim!r} is out of range for a tensor of {ndim} dims "
                            + dims_expected(ndim))
    return d % ndim


def _dividing(mesh: Any, entry: tuple[str, ...], n: int) -> tuple[str, ...]:
    """The axes of `entry`, in its order, that split a dim of `n` into the most shards that divide it: all of
    them when they do; else the largest group of them (the first such in `entry`'s order); else none."""
    best: tuple[str, ...] = ()
    for size in range(len(entry), 0, -1):
        for axes in itertools.combinations(entry, size):
            if n % mesh.group_size(axes) == 0 and mesh.group_size(axes) > mesh.group_size(best):
                best = axes
    return best


def infer_narrow(x: TensorLayout, shape: Sequence[int], dim: object, start: object,
                 length: object) -> tuple[TensorLayout, int, int, tuple[int, ...]]:
    """(layout, dim, start, shape) of x[..., start:start + length, ...] along `dim`.

    `start` may be negative (counted from the end, as Python's) or the dim's size (with `length` 0, an
    empty slice at the end), as PyTorch's narrow. The layout is `x` itself when
    `dim` is whole on every rank (a local slice); for a split `dim` it keeps the dim's axes whose shards
    divide `length`, the most shards that do (the rows then move: `spmdsim.programs.plan.shift`).
    """
    shape = x.check_shape(shape)
    d = _tensor_dim(dim, x.ndim, "narrow")
    size = shape[d]
    s, n = as_int(start), as_int(length)
    # As PyTorch's: start from -size to size (size itself with length 0: an empty slice at the end).
    if s is None or isinstance(start, bool) or not -size <= s <= size:
        raise OperatorError(f"narrow: start {start!r} is out of range for dim {d} of size {size} "
                            f"(expected an integer from {-size} to {size})")
    if s < 0:
        s += size
    if n is None or isinstance(length, bool) or not 0 <= n <= size - s:
        at = f"{start!r} ({s})" if s != start else f"{s}"  # a negative start: as given, then as counted
        raise OperatorError(f"narrow: length {length!r} does not fit dim {d} of size {size} from start {at} "
                            f"(expected an integer from 0 to {size - s})")
    entry = x.tensor_map[d]
    keep = _dividing(x.layout, entry, n)
    out = x if keep == entry else x.with_map(*(keep if k == d else e for k, e in enumerate(x.tensor_map)))
    return out, d, s, shape[:d] + (n,) + shape[d + 1:]


@dataclass(frozen=True)
class ConcatPlan:
    """Each operand's layout before the join, the output's, and where each operand lands along `dim`.

    `targets` are the operands' layouts for the join: the other dims as `choice` splits them, the joined dim
    as the operand had it (less any axis `choice` gave another dim). Where the joined dim is split in a
    target or in `out`, each operand's rows move to the result's blocks (`spmdsim.programs.plan.shift`).
    """

    dim: int
    shape: tuple[int, ...]
    sources: tuple[TensorLayout, ...]
    choice: Choice
    out: TensorLayout
    offsets: tuple[int, ...]  # each operand's first index along `dim` in the output
    targets: tuple[TensorLayout, ...]

    @property
    def local(self) -> bool:
        """True when the joined dim is whole in every target and in the result: each rank joins its blocks."""
        return self.out.num_shards(self.dim) == 1 and all(t.num_shards(self.dim) == 1 for t in self.targets)

    def why(self) -> str:
        """What moved and why, in a few clauses."""
        if self.local:
            parts = self.choice.moves(self.sources)
        else:
            parts = [f"dim {self.dim} is split: each operand's rows move to the ranks whose block of the result "
                     f"{self.out} holds them (one Alltoallv for all of them, none where no rank lacks rows)"]
        if self.out.partial:
            parts.append(f"the result stays pending over {self.out.partial!r} (a join is linear)")
        return "; ".join(parts) if parts else f"dim {self.dim} is whole on every rank: no communication"


def infer_concatenate(layouts: tuple[TensorLayout, ...], shapes: tuple[tuple[int, ...], ...], dim: object,
                      dtype: str) -> ConcatPlan:
    """Plan joining operands along `dim`; the other dims must agree in size.

    The other dims' splits are chosen by the least-bytes rule of the elementwise ops; the joined dim keeps
    each operand's split, and the result's is the first split operand's where it divides the joined size
    (else its axes that split it into the most shards that divide it, else whole).
    """
    if not layouts:
        raise OperatorError("concatenate: no operands; give a sequence of DTensors")
    mesh, ndim = layouts[0].layout, layouts[0].ndim
    if ndim == 0:
        raise OperatorError("concatenate: 0-d operands have no dim to join along; reshape them to (1,) first")
    for k, (layout, shape) in enumerate(zip(layouts, shapes)):
        if layout.layout != mesh:
            raise OperatorError(f"concatenate: operand {k} is on {layout.layout} but operand 0 is on {mesh}; "
                                "operands must share one device matrix")
        if len(shape) != ndim:
            raise ShapeError(f"concatenate: operand {k} of shape {tuple(shape)!r} has {len(shape)} dims, "
                             f"operand 0 of shape {tuple(shapes[0])!r} has {ndim}")
    d = _tensor_dim(dim, ndim, "concatenate")
    for k, shape in enumerate(shapes):
        if shape[:d] + shape[d + 1:] != shapes[0][:d] + shapes[0][d + 1:]:
            raise ShapeError(f"concatenate along dim {d}: operand {k} of shape {tuple(shape)!r} differs from "
                             f"operand 0 of shape {tuple(shapes[0])!r} in another dim")
    # One pending sum over the same axes everywhere stays pending; any other mix is resolved first.
    pending = {t.addend_axes for t in layouts}
    kept = layouts[0].partial if len(pending) == 1 and layouts[0].addend_axes else ()
    if ndim > len(string.ascii_letters):
        raise ShapeError(f"concatenate: {ndim} dims are more than spmdsim's elementwise ops take (52)")
    # Every operand names its dims alike; the joined dim decides no split of the others.
    letters = string.ascii_letters[:ndim]
    words = (letters,) * len(layouts)
    deciding = (frozenset(letters[:d] + letters[d + 1:]),) * len(layouts)
    choice = choose_splits(words, layouts, shapes, dtype, [kept] * len(layouts), kept, deciding)
    taken = {a for i, ch in enumerate(letters) if i != d for a in choice.axes(ch)}
    # An operand's split of the joined dim stays where the choice left its axis free: not taken by another
    # dim, and not made a pending sum (a split over an axis can become one, each rank zero elsewhere).
    joined = [tuple(a for a in t.tensor_map[d] if a not in taken and a not in target.partial)
              for t, target in zip(layouts, choice.targets)]
    targets = tuple(t.with_map(*(joined[k] if i == d else e for i, e in enumerate(t.tensor_map)))
                    for k, t in enumerate(choice.targets))
    offsets, total = [], 0
    for shape in shapes:
        offsets.append(total)
        total += shape[d]
    entry = _dividing(mesh, next((e for e in joined if e), ()), total)
    out = TensorLayout(mesh, tuple(entry if i == d else choice.axes(ch) for i, ch in enumerate(letters)), kept)
    out_shape = tuple(shapes[0][:d]) + (total,) + tuple(shapes[0][d + 1:])
    return ConcatPlan(d, out_shape, tuple(layouts), choice, out, tuple(offsets), targets)


def infer_broadcast_to(x: TensorLayout, shape: Sequence[int],
                       new_shape: object) -> tuple[TensorLayout, tuple[int, ...]]:
    """(layout, shape) of x broadcast to `new_shape` by numpy's rules: local, no communication.

    New leading dims and dims of size 1 that grow are whole on every rank; the others keep x's splits; a
    pending sum stays pending (broadcasting is linear).
    """
    old = x.check_shape(shape)
    if isinstance(new_shape, (str, bytes)) or not hasattr(new_shape, "__iter__"):
        new_shape = (new_shape,)
    items = tuple(new_shape)  # type: ignore[arg-type]
    new = tuple(as_int(n) for n in items)
    if None in new or any(n < 0 for n in new) or any(isinstance(n, bool) for n in items):
        raise OperatorError(f"broadcast_to: shape {items!r} must hold non-negative integers")
    lead = len(new) - len(old)
    if lead < 0 or any(o != 1 and o != n for o, n in zip(old, new[lead:])):
        raise ShapeError(f"broadcast_to: shape {old!r} cannot broadcast to {new!r} (each dim must match, "
                         "be 1, or be a new leading dim)")
    for d, (entry, o, n) in enumerate(zip(x.tensor_map, old, new[lead:])):
        # A size-1 dim split by an uneven cut (one rank holds its row, the others none) that grows: the ranks
        # without the row have nothing to repeat, as the elementwise ops refuse it (spmdsim.programs.infer.pointwise).
        if o == 1 and n != 1 and any(x.layout.axis_size(a) > 1 for a in entry):
            raise OperatorError(f"broadcast_to: dim {d} has size 1 but is split over {format_entry(entry)}; "
                                "redistribute x so that dim is whole first")
    entries = [None] * lead + [e or None if o == n else None for e, o, n in zip(x.tensor_map, old, new[lead:])]
    return x.layout(*entries).with_partial(x.partial), new
