"""The one place that decides how a tensor dim is cut into shards.

Three cutting rules (docs/explanation/semantics.md, "Uneven shards"), chosen per Layout (``cut=``):

* ``even`` (the default): equal pieces; a size that does not divide is refused
  (MindSpore, JAX, Megatron and Paddle do the same);
* ``chunk``: PyTorch DTensor's and ``torch.chunk``'s rule: pieces of ceil(size / n)
  elements, the trailing pieces short or empty;
* ``balanced``: piece sizes differ by at most one, the first ``size % n`` pieces
  one longer; no piece is empty while size >= n.

With a size that divides, the three rules cut alike.

A dim split over several mesh axes has one count per axis (first major). The
``chunk`` rule then cuts it axis by axis, as DTensor does for ``Shard(d)`` on
several mesh dims: torch.chunk into the first axis's count, each piece again
into the next's (5 rows over 2 x 4: 3 and 2, then 1 1 1 0 and 1 1 0 0). The
other rules cut it once into the product of the counts (for ``even`` the two
agree). Either way the pieces, in mixed-radix order, lie side by side.
"""
from __future__ import annotations

import math
from typing import Union

from ..errors import ShapeError

__all__ = ["CUTS", "shard_bounds", "all_bounds", "shard_sizes", "check_divisible", "check_cut"]

#: A dim's shard count: one int, or one count per mesh axis it is split over (first major).
Counts = Union[int, tuple]

#: The cutting rules a Layout may name, the default first.
CUTS = ("even", "chunk", "balanced")


def check_divisible(size: int, num_shards: int, tensor_dim: int, axes: tuple = (),
                    named: tuple[str, tuple] | None = None) -> None:
    """Raise ShapeError unless `size` splits evenly into `num_shards`.

    `named` is (what, shape) of the tensor, for callers that know which one it
    is: "ColumnParallelLinear weight W (96, 100): dim 1 of size 100 is ...".
    """
    if num_shards > 1 and size % num_shards != 0:
        if named is not None:
            what, shape = named
            over = f" over {axes!r}" if axes else ""
            raise ShapeError(f"{what} {shape!r}: dim {tensor_dim} of size {size!r} is not divisible by "
                             f"{num_shards} shards{over}")
        where = f" (axes {axes!r})" if axes else ""
        raise ShapeError(f"tensor dim {tensor_dim} of size {size!r} is not divisible by {num_shards} shards{where}")


def check_cut(cut: str, size: int, num_shards: int, tensor_dim: int, axes: tuple = (),
              named: tuple[str, tuple] | None = None) -> None:
    """Raise ShapeError when rule `cut` cannot cut `size` into `num_shards` (only ``even`` refuses)."""
    if cut == "even":
        check_divisible(size, num_shards, tensor_dim, axes, named)


def _nests(num_shards: Counts, cut: str) -> bool:
    """Whether rule `cut` cuts a dim of these counts axis by axis (chunk over two or more axes above 1)."""
    return cut == "chunk" and type(num_shards) is tuple and sum(n > 1 for n in num_shards) > 1


def _bounds(size: int, num_shards: int, shard_index: int, cut: str) -> tuple[int, int]:
    if cut == "balanced":
        base, extra = divmod(size, num_shards)
        start = shard_index * base + min(shard_index, extra)
        return start, start + base + (shard_index < extra)
    if cut == "chunk":
        piece = -(-size // num_shards)
        return min(shard_index * piece, size), min((shard_index + 1) * piece, size)
    step = size // num_shards
    return shard_index * step, (shard_index + 1) * step


def shard_bounds(size: int, num_shards: Counts, shard_index: int, cut: str = "even") -> tuple[int, int]:
    """Half-open [start, stop) of shard `shard_index` of a dim of `size` cut in `num_shards` by rule `cut`.

    `num_shards` is a count, or a tuple of counts, one per mesh axis the dim is split over (first major,
    `shard_index` in mixed radix over them): the chunk rule then cuts axis by axis (DTensor's nested Shard).
    """
    if type(num_shards) is tuple:
        if not _nests(num_shards, cut):
            return _bounds(size, math.prod(num_shards), shard_index, cut)
        digits = []
        for n in reversed(num_shards):
            shard_index, digit = divmod(shard_index, n)
            digits.append(digit)
        lo, hi = 0, size
        for n, digit in zip(num_shards, reversed(digits)):
            a, b = _bounds(hi - lo, n, digit, cut)
            lo, hi = lo + a, lo + b
        return lo, hi
    return _bounds(size, num_shards, shard_index, cut)


def all_bounds(size: int, num_shards: Counts, cut: str = "even") -> tuple[tuple[int, int], ...]:
    """`shard_bounds` of every shard, in shard order (they lie side by side from 0 to `size`)."""
    if not _nests(num_shards, cut):
        n = math.prod(num_shards) if type(num_shards) is tuple else num_shards
        return tuple(_bounds(size, n, i, cut) for i in range(n))
    pieces = [(0, size)]
    for n in num_shards:  # each axis cuts every piece of the one before
        pieces = [(lo + a, lo + b) for lo, hi in pieces for a, b in (_bounds(hi - lo, n, i, cut) for i in range(n))]
    return tuple(pieces)


def shard_sizes(size: int, num_shards: Counts, cut: str = "even") -> tuple[int, ...]:
    """The size of every shard, in shard order."""
    return tuple(b - a for a, b in all_bounds(size, num_shards, cut))
