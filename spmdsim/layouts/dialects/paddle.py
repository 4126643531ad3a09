"""Paddle ``paddle.distributed.split`` (Paddle's distributed.split document) as layouts on a 1-D "mp" mesh.

``operation="linear"``, axis 0 is row-parallel (weight rows split, partial
outputs summed by AllReduce, bias added once after the sum); axis 1 is
column-parallel (weight columns split, AllGather when ``gather_out``);
``operation="embedding"`` is vocab-parallel (each rank's rows plus a zero
padding row for the ids it does not own, AllReduce of the lookups). The split
dim must be divisible by num_partitions. The tables are in docs/reference/dialects.md.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

from ..datagen import SeededTensor
from ...errors import DialectError, OperatorError, PartitionCountError
from ..layout import Layout, TensorLayout
from ._common import as_flag, as_int, as_items, positive_int, refuse_mesh_as_count

__all__ = ["MP_AXIS", "PaddleSplit", "split_layouts", "paddle_layout", "paddle_param", "ParamAttr"]

#: What names a weight or bias: None/True (default seed), False (none), a seed or a SeededTensor.
ParamAttr = Union[None, bool, int, SeededTensor]

#: The single mesh axis of Paddle's model-parallel group.
MP_AXIS = "mp"


@dataclass(frozen=True)
class PaddleSplit:
    """What ``paddle.distributed.split(x, size, operation, axis, num_partitions)`` does.

    Attributes:
        kind: "row", "column" or "vocab".
        operation, axis, size, num_partitions, gather_out: the call's arguments.
        layout: the mesh ``Layout((num_partitions,), ("mp",))``.
        weight: layout of the global weight `size`.
        bias: layout of the bias (linear only; None for embedding).
        input: layout of x as the local op consumes it (ids for embedding).
        output_before: layout of the local op's result (partial or split).
        output_after: layout after `collective` (== output_before when None).
        collective: "allreduce", "allgather" or None.
        local_weight_shape: shape of each rank's weight, padding row included.
        vocab_ranges: per rank, the [start, stop) of global ids it owns (embedding).
        padding_row: local index of the zero padding row (embedding), else None.
    """

    kind: str
    operation: str
    axis: int
    size: tuple[int, int]
    num_partitions: int
    gather_out: bool
    layout: Layout
    weight: TensorLayout
    bias: Optional[TensorLayout]
    input: TensorLayout
    output_before: TensorLayout
    output_after: TensorLayout
    collective: Optional[str]
    local_weight_shape: tuple[int, int]
    vocab_ranges: tuple[tuple[int, int], ...] = ()
    padding_row: Optional[int] = None

    def vocab_range(self, rank: int) -> tuple[int, int]:
        """[start, stop) of the global ids rank `rank` owns (embedding only)."""
        if self.kind != "vocab":
            raise DialectError(f"vocab_range applies to embedding splits, not {self.kind!r}")
        index = as_int(rank)
        if index is None:
            raise DialectError(f"rank {rank!r} must be an integer (0 <= rank < {self.num_partitions})")
        if not 0 <= index < self.num_partitions:
            raise DialectError(f"rank {rank!r} is outside the model-parallel group of "
                               f"{self.num_partitions}")
        return self.vocab_ranges[index]

    def local_ids(self, ids: np.ndarray, rank: int) -> np.ndarray:
        """Paddle's ``shard_index``: ids owned by `rank` shifted to local rows, others -> padding."""
        start, stop = self.vocab_range(rank)
        ids = np.asarray(ids)
        owned = (ids >= start) & (ids < stop)
        return np.where(owned, ids - start, self.padding_row).astype(ids.dtype, copy=False)


def split_layouts(
    size: Sequence[int],
    operation: str,
    axis: int = 0,
    num_partitions: int = 1,
    gather_out: bool = True,
    input_ndim: int = 2,
) -> PaddleSplit:
    """Layouts of ``paddle.distributed.split`` for a weight of shape `size`.

    `input_ndim` is the number of dims of x (linear, last dim = in features) or
    of the ids (embedding); the output has the same number of dims for linear
    and one more for embedding.
    """
    shape = _size(size)
    gather_out = as_flag(gather_out, "gather_out")
    refuse_mesh_as_count(num_partitions, "num_partitions",
                         "split_layouts takes Paddle's num_partitions, the size of the model-parallel group "
                         f"(the layouts come on Layout((num_partitions,), ({MP_AXIS!r},)))",
                         lambda layout: layout.axis_size(MP_AXIS) if MP_AXIS in layout.alias_name else None)
    parts = positive_int(num_partitions, "num_partitions")
    ndim = as_int(input_ndim)
    if ndim is None or ndim < 1:
        raise DialectError(f"input_ndim {input_ndim!r} must be a positive integer")
    which = as_int(axis)  # None for bools and non-integers: True == 1 must not pass
    layout = Layout((parts,), (MP_AXIS,))
    lead = (None,) * (ndim - 1)
    common = dict(operation=operation, size=shape, num_partitions=parts, gather_out=bool(gather_out),
                  layout=layout)
    if operation == "embedding":
        if which != 0:
            raise DialectError(
                f"embedding can only be split along axis 0 (the vocabulary), got axis {axis!r}"
            )
        _check_divisible(shape, 0, parts, "rows (vocabulary size) of the embedding table")
        per_part = shape[0] // parts
        partial_out = layout(*(None,) * (ndim + 1), partial=(MP_AXIS,))
        return PaddleSplit(
            kind="vocab", axis=0, **common, weight=layout(MP_AXIS, None), bias=None,
            input=layout(*(None,) * ndim),
            output_before=partial_out, output_after=partial_out.with_partial(()),
            collective="allreduce" if parts > 1 else None,
            local_weight_shape=(per_part + 1, shape[1]),
            vocab_ranges=tuple((r * per_part, (r + 1) * per_part) for r in range(parts)),
            padding_row=per_part,
        )
    if operation != "linear":
        raise DialectError(f"operation {operation!r} is not supported; "
                           "expected 'linear' or 'embedding'")
    if which == 0:
        _check_divisible(shape, 0, parts, "rows (in features) of the linear weight")
        partial_out = layout(*lead, None, partial=(MP_AXIS,))
        return PaddleSplit(
            kind="row", axis=0, **common, weight=layout(MP_AXIS, None), bias=layout(None),
            input=layout(*lead, MP_AXIS),
            output_before=partial_out, output_after=partial_out.with_partial(()),
            collective="allreduce" if parts > 1 else None,
            local_weight_shape=(shape[0] // parts, shape[1]),
        )
    if which == 1:
        _check_divisible(shape, 1, parts, "columns (out features) of the linear weight")
        split_out = layout(*lead, MP_AXIS)
        gathered = bool(gather_out) and parts > 1
        return PaddleSplit(
            kind="column", axis=1, **common, weight=layout(None, MP_AXIS), bias=layout(MP_AXIS),
            input=layout(*lead, None),
            output_before=split_out,
            output_after=layout(*lead, None) if gathered else split_out,
            collective="allgather" if gathered else None,
            local_weight_shape=(shape[0], shape[1] // parts),
        )
    raise DialectError(
        f"linear axis {axis!r} is not supported; expected 0 (row-parallel, split in "
        "features) or 1 (column-parallel, split out features)"
    )


def _size(size: object) -> tuple[int, int]:
    items = as_items(size)
    if items is None or len(items) != 2:
        raise DialectError(f"size {size!r} must be a list or tuple of two positive integers")
    out = tuple(as_int(s) for s in items)
    if any(s is None or s <= 0 for s in out):
        raise DialectError(f"size {size!r} must be a list or tuple of two positive integers")
    return out  # type: ignore[return-value]


def _check_divisible(shape: tuple[int, int], dim: int, parts: int, what: str) -> None:
    if shape[dim] % parts != 0:
        raise DialectError(
            f"size[{dim}]={shape[dim]!r}, the {what}, is not divisible by num_partitions={parts!r}")


def paddle_layout(num_partitions: int, world_size: int) -> Layout:
    """("mp",) of size p, or ("dp", "mp") when the world has more ranks than p."""
    parts, world = as_int(num_partitions), as_int(world_size)
    if world is None or world <= 0:
        raise OperatorError(f"world_size {world_size!r} must be a positive integer")
    if parts is None or parts <= 0:
        raise OperatorError(f"num_partitions={num_partitions!r} must be a positive integer")
    if world % parts:
        raise PartitionCountError(f"num_partitions={num_partitions!r} must divide the world size {world_size!r}",
                                  parts, world, divides=True)
    if parts == world:
        return Layout((parts,), (MP_AXIS,))
    return Layout((world // parts, parts), ("dp", MP_AXIS))


def paddle_param(
    attr: ParamAttr, shape: Sequence[int], dtype: str, default_seed: int
) -> Optional[SeededTensor]:
    """The SeededTensor a weight/bias attr names (None when `attr` is False)."""
    if attr is False:
        return None
    if attr is None or attr is True:
        return SeededTensor(tuple(shape), dtype, default_seed)
    if as_int(attr) is not None:  # a seed: Python or numpy integer
        return SeededTensor(tuple(shape), dtype, attr)
    if isinstance(attr, SeededTensor):
        if tuple(attr.shape) != tuple(shape):
            raise OperatorError(
                f"parameter of shape {attr.shape!r} does not match the expected {tuple(shape)!r}"
            )
        return attr
    raise OperatorError(f"parameter attr {attr!r} must be None, False, a seed or a SeededTensor")
