"""A tensor layout's shapes and holdings: a global shape checked against it, each rank's shard shape,
bounds and slices, and the ranks that hold each shard.

The mixin TensorShards is part of spmdsim.layouts.layout.TensorLayout, whose views it reads (`layout`,
`tensor_map`, `ndim`, `shards_per_dim`, `counts_per_dim`, `replicated_axes`); how a dim is cut is
spmdsim.layouts.slicing's. Pure Python; never imports mpi4py.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..errors import LayoutError, ShapeError
from .slicing import check_cut, shard_bounds
from ..base.validate import as_int, counted, shape_arg

__all__ = ["TensorShards"]


class TensorShards:
    """TensorLayout's shapes and who holds what: check_shape, local_shape, bounds, slices, ranks_holding, ..."""

    # -- shapes ----------------------------------------------------------------
    def check_shape(self, shape: Sequence[int], what: str | None = None) -> tuple[int, ...]:
        """Validate a global shape against this layout and return it as a tuple of ints.

        `what` names the tensor in a divisibility error ("ColumnParallelLinear weight W"; else "tensor", its
        shape beside it: which of a program's tensors does not divide).
        """
        if type(shape) is tuple and self._known(("checked", shape)) is not None:  # passed before: ~4 us a call
            return shape
        shape = shape_arg(shape, "shape" if what is None else f"{what} shape")
        if len(shape) != self.ndim:
            raise ShapeError(f"{'' if what is None else what + ': '}tensor map {self} has "
                             f"{counted(self.ndim, 'entry')} but shape {shape!r} has {counted(len(shape), 'dim')}")
        cut = self.layout.cut
        for tensor_dim, (size, axes) in enumerate(zip(shape, self.tensor_map)):
            check_cut(cut, size, self.layout.group_size(axes), tensor_dim, axes,
                      ("tensor" if what is None else what, shape))
        return self._keep(("checked", shape), shape)

    def local_shape(self, shape: Sequence[int], rank: int | None = None) -> tuple[int, ...]:
        """Shape of `rank`'s shard; without `rank`, the shape every rank's shard has.

        Under an uneven cut (Layout cut "chunk" or "balanced") of a size that does
        not divide, shards differ: asking without a rank then raises ShapeError.
        """
        if rank is not None:
            return tuple(b - a for a, b in self.bounds(rank, shape))
        known = self._known(("local", shape))
        if known is not None:
            return known
        shape = self.check_shape(shape)
        uneven = self.uneven_dims(shape)
        if uneven:
            d = uneven[0]
            raise ShapeError(f"shards of tensor dim {d} of size {shape[d]!r} differ between ranks "
                             f"({self.shards_per_dim[d]} shards, cut {self.layout.cut!r}); "
                             "expected a rank to ask for its own shard's shape")
        return self._keep(("local", shape), tuple(s // n for s, n in zip(shape, self.shards_per_dim)))

    def uneven_dims(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The tensor dims whose shards differ in size between ranks (none under the even cut)."""
        if self.layout.cut == "even":
            return ()
        return tuple(d for d, (s, n) in enumerate(zip(shape, self.shards_per_dim)) if s % n)

    def max_local_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """Per dim, the largest shard (the first: every rule puts its longest pieces first)."""
        shape = self.check_shape(shape)
        cut = self.layout.cut
        return tuple(b - a for a, b in (shard_bounds(s, n, 0, cut) for s, n in zip(shape, self.counts_per_dim)))

    # Answers about global shapes that passed check_shape, per layout: operators and the backward walk
    # ask each layout the same few questions every step. Kept only for shapes of Python ints (16.0
    # equals 16 and hashes alike, and must be refused again), out of pickles like the hash.
    def _known(self, key: tuple) -> Any:
        shapes = self.__dict__.get("_shapes")
        if shapes is None or type(key[-1]) is not tuple:
            return None
        for n in key[-1]:
            if type(n) is not int:
                return None
        return shapes.get(key)

    def _keep(self, key: tuple, value: Any) -> Any:
        for n in key[-1]:
            if type(n) is not int:
                return value
        shapes = self.__dict__.get("_shapes")
        if shapes is None:
            shapes = {}
            object.__setattr__(self, "_shapes", shapes)
        if len(shapes) < 256:
            shapes[key] = value
        return value

    # -- who holds what ------------------------------------------------------------
    def shard_index(self, rank: int) -> tuple[int, ...]:
        """Per tensor dim, the index of the shard `rank` holds."""
        return tuple(self.layout.group_index(rank, axes) for axes in self.tensor_map)

    def bounds(self, rank: int, shape: Sequence[int]) -> tuple[tuple[int, int], ...]:
        """Per tensor dim, the half-open [start, stop) that `rank` holds."""
        if type(rank) is int:
            known = self._known(("bounds", rank, shape))
            if known is not None:
                return known
        shape = self.check_shape(shape)
        cut = self.layout.cut
        out = tuple(shard_bounds(size, n, i, cut)
                    for size, n, i in zip(shape, self.counts_per_dim, self.shard_index(rank)))
        return self._keep(("bounds", rank, shape), out) if type(rank) is int else out

    def slices(self, rank: int, shape: Sequence[int]) -> tuple[slice, ...]:
        """Per tensor dim, the slice of the global tensor that `rank` holds."""
        if type(rank) is int and type(shape) is tuple:  # kept as `bounds` is: a check asks for them every step
            known = self._known(("slices", rank, shape))
            if known is not None:
                return known
            return self._keep(("slices", rank, shape), tuple(slice(a, b) for a, b in self.bounds(rank, shape)))
        return tuple(slice(a, b) for a, b in self.bounds(rank, shape))

    def rank_slices(self, shape: Sequence[int]) -> dict[int, tuple[tuple[int, int], ...]]:
        """Bounds for every rank (the `spmdsim slices` table)."""
        return {r: self.bounds(r, shape) for r in range(self.layout.num_devices)}

    def ranks_holding(self, shard_index: Sequence[int]) -> tuple[int, ...]:
        """All ranks whose shard has the given per-dim index (replicas and partials)."""
        shard_index = tuple(shard_index)
        if len(shard_index) != self.ndim or any(
            as_int(i) is None or not 0 <= i < n for i, n in zip(shard_index, self.shards_per_dim)
        ):
            raise LayoutError(f"shard index {shard_index!r} does not fit shards per dim {self.shards_per_dim!r}")
        return tuple(r for r in range(self.layout.num_devices) if self.shard_index(r) == shard_index)

    def replica_groups(self) -> tuple[tuple[int, ...], ...]:
        """Groups of ranks that hold identical local values (differ only on replicated axes)."""
        return self.layout.axis_groups(self.replicated_axes)

    def num_replicas(self) -> int:
        return self.layout.group_size(self.replicated_axes)
