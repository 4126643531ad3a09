"""The one place that decides how a tensor dim is cut into shards.

Three cutting rules (docs/semantics.md, "Uneven shards"), chosen per Layout (``cut=``):

* ``even`` (the default): equal pieces; a size that does not divide is refused
  (MindSpore, JAX, Megatron and Paddle do the same);
* ``chunk``: PyTorch DTensor's and ``torch.chunk``'s rule: pieces of ceil(size / n)
  elements, the trailing pieces short or empty;
* ``balanced``: piece sizes differ by at most one, the first ``size % n`` pieces
  one longer; no piece is empty while size >= n.

With a size that divides, the three rules cut alike.
"""
from __future__ import annotations

from .errors import ShapeError

__all__ = ["CUTS", "shard_bounds", "shard_sizes", "check_divisible", "check_cut"]

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


def shard_bounds(size: int, num_shards: int, shard_index: int, cut: str = "even") -> tuple[int, int]:
    """Half-open [start, stop) of shard `shard_index` of a dim of `size` cut in `num_shards` by rule `cut`."""
    if cut == "balanced":
        base, extra = divmod(size, num_shards)
        start = shard_index * base + min(shard_index, extra)
        return start, start + base + (shard_index < extra)
    if cut == "chunk":
        piece = -(-size // num_shards)
        return min(shard_index * piece, size), min((shard_index + 1) * piece, size)
    step = size // num_shards
    return shard_index * step, (shard_index + 1) * step


def shard_sizes(size: int, num_shards: int, cut: str = "even") -> tuple[int, ...]:
    """The size of every shard, in shard order."""
    return tuple(b - a for a, b in (shard_bounds(size, num_shards, i, cut) for i in range(num_shards)))
