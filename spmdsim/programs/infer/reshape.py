"""Pure layout inference for reshape: when every rank can reshape its own shard.

A reshape splits and merges runs of dims whose sizes multiply to the same
number ("groups": (S, H*D) -> (S, H, D) has groups (S)->(S) and (H*D)->(H, D)).
Within a group, the block a rank holds is one contiguous run of the group's
row-major order exactly when, from the group's first dim on, the dims are
cut to width 1 (split into as many pieces as their size, or of size 1), then
one dim is split into wider pieces or whole, then the rest are whole. Such a
run is cut by the mesh axes of those dims in order, first major, and is a block
of the new dims when the same axes, taken in order, cut the new dims the same
way. Then each rank reshapes its shard and nothing moves; otherwise the
reshape is refused with the dim to make whole first. Never imports mpi4py.
"""
from __future__ import annotations

import math
from typing import Sequence

from ...errors import OperatorError
from ...layouts.layout import TensorLayout
from ...layouts.notation import format_entry
from ...base.validate import as_int, shape_arg
from ...base.tables import put

__all__ = ["reshape_shape", "infer_reshape"]


def reshape_shape(old_shape: Sequence[int], new_shape: object) -> tuple[int, ...]:
    """`new_shape` with numpy's one -1 filled in; ShapeError-free: OperatorError names the sizes."""
    old = tuple(old_shape)
    if isinstance(new_shape, (str, bytes)) or not hasattr(new_shape, "__iter__"):
        new_shape = (new_shape,)  # numpy takes a bare int for a 1-dim result
    items = tuple(new_shape)  # type: ignore[arg-type]
    sizes = [as_int(s) for s in items]
    if None in sizes or any(s < -1 for s in sizes) or sizes.count(-1) > 1:
        raise OperatorError(f"reshape shape {items!r} must hold non-negative integers and at most one -1")
    total = math.prod(old)
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        if known == 0 or total % known:
            raise OperatorError(f"reshape of shape {old!r} ({total} elements) cannot fill the -1 in {items!r}")
        sizes[sizes.index(-1)] = total // known
    new = shape_arg(sizes, "reshape shape", OperatorError)
    if math.prod(new) != total:
        raise OperatorError(
            f"reshape of shape {old!r} ({total} elements) to {new!r} ({math.prod(new)} elements): "
            "the element counts must match")
    return new


def _groups(old: tuple[int, ...], new: tuple[int, ...]) -> list[tuple[range, range]]:
    """Runs of old and new dims with equal products; size-1 dims join the run before them."""
    groups: list[tuple[range, range]] = []
    i = j = 0
    while i < len(old) and j < len(new):
        a, b, i0, j0 = old[i], new[j], i, j
        i, j = i + 1, j + 1
        while a != b:
            if a < b:
                a *= old[i]
                i += 1
            else:
                b *= new[j]
                j += 1
        groups.append((range(i0, i), range(j0, j)))
    # Trailing dims of size 1 (one side may have more of them).
    if groups:
        last_old, last_new = groups.pop()
        groups.append((range(last_old.start, len(old)), range(last_new.start, len(new))))
    elif old or new:
        groups.append((range(len(old)), range(len(new))))
    return groups


def _run_axes(x: TensorLayout, shape: tuple[int, ...], dims: range) -> tuple[str, ...] | None:
    """Mesh axes cutting the group's row-major run into contiguous blocks, or None if they do not."""
    axes: list[str] = []
    cut_to_one = True  # so far every dim is cut to width 1
    for d in dims:
        entry = x.tensor_map[d]
        if not cut_to_one and x.layout.group_size(entry) > 1:
            return None  # a split dim after a wider one: each rank's block has gaps
        axes += entry
        cut_to_one = cut_to_one and shape[d] // x.layout.group_size(entry) == 1
    return tuple(axes)


def _deal(x: TensorLayout, axes: tuple[str, ...], shape: tuple[int, ...], dims: range) -> list[tuple[str, ...]] | None:
    """Hand `axes` (in order) to the new dims so they cut them as they cut the run, or None."""
    entries: list[tuple[str, ...]] = []
    rest = list(axes)
    for d in dims:
        taken: list[str] = []
        pieces = 1
        while rest and shape[d] % (pieces * x.layout.axis_size(rest[0])) == 0:
            pieces *= x.layout.axis_size(rest[0])
            taken.append(rest.pop(0))  # axes of size 1 ride along: they cut nothing
        if rest and pieces != shape[d]:
            return None  # this dim is left wider than 1 but axes remain for later dims
        entries.append(tuple(taken))
    return entries if not rest else None


def _divides(x: TensorLayout, shape: tuple[int, ...], dims: range) -> bool:
    """Whether every dim of the group is cut into equal pieces (its size a multiple of its pieces): under
    such sizes an uneven cut (Layout.cut) cuts as the even one does."""
    return all(shape[d] % x.layout.group_size(x.tensor_map[d]) == 0 for d in dims)


def _same_dims(x: TensorLayout, old: tuple[int, ...], new: tuple[int, ...], old_dims: range,
               new_dims: range) -> list[tuple[str, ...]] | None:
    """Under an uneven cut (Layout.cut): the entries of a group that only gains or loses dims of size 1,
    each dim keeping its own (its pieces stay the same rows), or None."""
    kept = [d for d in old_dims if old[d] != 1]
    if [old[d] for d in kept] != [new[d] for d in new_dims if new[d] != 1] or \
            any(x.tensor_map[d] for d in old_dims if old[d] == 1):
        return None
    entries = iter(x.tensor_map[d] for d in kept)
    return [next(entries) if new[d] != 1 else () for d in new_dims]


def infer_reshape(x: TensorLayout, old_shape: Sequence[int], new_shape: object) -> tuple[TensorLayout, tuple[int, ...]]:
    """(layout, shape) of x reshaped to `new_shape` when each rank can reshape its own shard.

    The mesh axes follow the dims they cut ((S, H*D) split on dim 1 -> (S, H, D)
    split on dim 1 when the axes divide H); pending sums stay pending (a
    reshape is linear). OperatorError names the dim to make whole otherwise.
    """
    # Pure: remembered for shapes given as tuples of Python ints (16.0 equals 16 and hashes alike,
    # and must be refused again); a model reshapes the same few ways every step.
    key = (x, old_shape, new_shape) if _ints(old_shape) and _ints(new_shape) else None
    if key is not None:
        known = _RESHAPES.get(key)
        if known is not None:
            return known
    out = _infer_reshape(x, old_shape, new_shape)
    if key is not None:
        put(_RESHAPES, key, out, 1024)
    return out


_RESHAPES: dict = {}  # (layout, old shape, new shape) -> infer_reshape's answer


def _ints(shape: object) -> bool:
    """`shape` is a tuple of Python ints (not bools, not numpy's)."""
    if type(shape) is not tuple:
        return False
    for n in shape:
        if type(n) is not int:
            return False
    return True


def _infer_reshape(x: TensorLayout, old_shape: Sequence[int],
                   new_shape: object) -> tuple[TensorLayout, tuple[int, ...]]:
    old = x.check_shape(old_shape)
    new = reshape_shape(old, new_shape)
    if math.prod(old) == 0:
        if x.split_axes:
            raise OperatorError(f"reshape of an empty tensor {old!r} mapped {x}: make every dim whole first")
        return x.layout(*([None] * len(new))).with_partial(x.partial), new
    if x.layout.cut != "even":
        ones = [d for d, n in enumerate(old) if n == 1 and x.layout.group_size(x.tensor_map[d]) > 1]
        if ones:
            return _split_ones(x, old, new, ones)
    entries: list[tuple[str, ...]] = []
    for old_dims, new_dims in _groups(old, new):
        axes = _run_axes(x, old, old_dims)
        if axes is not None and x.layout.cut != "even" and not _divides(x, old, old_dims):
            axes = None  # an uneven piece: the blocks are not those of an even cut, which `_deal` hands on
        dealt = None if axes is None else _deal(x, axes, new, new_dims)
        if dealt is None and x.layout.cut != "even":
            dealt = _same_dims(x, old, new, old_dims, new_dims)
        if dealt is None:
            split = [d for d in old_dims if x.layout.group_size(x.tensor_map[d]) > 1]
            unequal = "" if _divides(x, old, old_dims) else f" into unequal pieces (cut {x.layout.cut!r})"
            raise OperatorError(
                f"reshape {old!r} -> {new!r} of x mapped {x}: old dims {tuple(old_dims)} "
                f"{tuple(old[d] for d in old_dims)} become new dims {tuple(new_dims)} "
                f"{tuple(new[d] for d in new_dims)}, but the block each rank holds of them is not a block "
                f"of the new dims (dims {tuple(split)} split over "
                f"{', '.join(format_entry(x.tensor_map[d]) for d in split)}{unequal}); "
                "redistribute x so those dims are whole, or split only the first of them "
                "into pieces the new dims' sizes divide")
        entries += dealt
    return x.layout(*(e or None for e in entries)).with_partial(x.partial), new


def _split_ones(x: TensorLayout, old: tuple[int, ...], new: tuple[int, ...], ones: list[int]) -> tuple[TensorLayout,
                                                                                                      tuple[int, ...]]:
    """Under an uneven cut: a reshape of x whose dims `ones`, of size 1, are split (their one row held by
    the ranks at 0 on all its axes, the first piece; the other ranks' blocks are empty).

    Which dim of size 1 names those axes changes no block: the rest reshapes as if they were whole, then
    the k-th such dim's axes go to the k-th dim of size 1 of the new shape (any more join the last one).
    With no dim of size 1 in the new shape the empty blocks would have to fill: refused in one line."""
    held = [x.tensor_map[d] for d in ones]
    rest = list(x.tensor_map)
    for d in ones:
        rest[d] = ()
    layout, _ = _infer_reshape(x.layout(*(e or None for e in rest)).with_partial(x.partial), old, new)
    targets = [d for d, n in enumerate(new) if n == 1]
    if not targets:
        raise OperatorError(
            f"reshape {old!r} -> {new!r} of x mapped {x}: dims {tuple(ones)} of size 1 are split over "
            f"{', '.join(format_entry(e) for e in held)} (cut {x.layout.cut!r}: the first piece holds the row, "
            "the others none) and the new shape has no dim of size 1 to keep that split; redistribute x so "
            "those dims are whole")
    entries = list(layout.tensor_map)
    for k, entry in enumerate(held):
        d = targets[min(k, len(targets) - 1)]
        entries[d] = entries[d] + entry
    return x.layout(*(e or None for e in entries)).with_partial(x.partial), new
