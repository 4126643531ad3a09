"""The one place that decides how a tensor dim is cut into shards.

Version 1 cuts evenly and rejects sizes that do not divide; an uneven rule
(MindSpore/Paddle style) can later replace `shard_bounds` without touching callers.
"""
from __future__ import annotations

from .errors import ShapeError

__all__ = ["shard_bounds", "check_divisible"]


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


def shard_bounds(size: int, num_shards: int, shard_index: int) -> tuple[int, int]:
    """Half-open [start, stop) of shard `shard_index` of a dim of `size` cut in `num_shards`."""
    step = size // num_shards
    return shard_index * step, (shard_index + 1) * step
