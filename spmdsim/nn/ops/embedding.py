"""Parallel Embedding: vocab-parallel (Paddle's padding-row rule, Allreduce) and dim-parallel.

Vocab-parallel (Paddle ``split(..., operation="embedding")``, Megatron's
VocabParallelEmbedding): the table (N, M) is split on rows over p ranks; each
rank holds its N/p rows plus one zero padding row (local row N/p). An id in the
rank's range [r*N/p, (r+1)*N/p) becomes id - r*N/p, any other id becomes N/p,
which looks up zeros; the per-rank lookups are partial sums, finished by one
Allreduce.

Embedding-dim-parallel: the table is split on columns; each rank looks up its
columns of every id; Allgather concatenates them (or they stay split).

Ids are replicated over the table's axes, so every rank of a group sees the
same ids and the range check raises the same error on all of them before the
first collective.
"""
from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np

from ...base import buffers
from ..autograd.rules.matmul import record_embedding
from ...layouts.datagen import SeededTensor
from ...errors import OperatorError, ShapeError
from ...base.flops import sweep
from ...programs.infer import EmbeddingPlan, infer_embedding
from ...references.forward import RegionFn, Source, check_ids, embedding_region
from ...runtime.executor import execute
from ...base.validate import int_arg
from ._common import default_axes, dry_zeros, make_dtensor, seeded_dtensor
from ._operands import flag, operands_mesh, raise_if_not_dtensors

__all__ = ["embedding", "plan_embedding", "vocab_range", "pad_vocab_shard", "vocab_parallel_lookup",
           "VocabParallelEmbedding", "ParallelEmbedding"]


def vocab_range(num_embeddings: int, index: int, parts: int) -> tuple[int, int]:
    """[start, stop) of the ids shard `index` of `parts` owns (Megatron's VocabUtility)."""
    per_part = num_embeddings // parts
    return index * per_part, (index + 1) * per_part


def pad_vocab_shard(shard: np.ndarray) -> np.ndarray:
    """Paddle's local table: the rank's N/p rows plus one zero padding row at the end (a dry run's: lazy zeros,
    as its rows are; their copy wrote every page, 18 GB of this machine's memory for a 10^9-row table)."""
    if buffers.is_lazy(shard):
        return buffers.empty((shard.shape[0] + 1,) + shard.shape[1:], shard.dtype)
    return np.concatenate([shard, np.zeros((1,) + shard.shape[1:], shard.dtype)], axis=0)


def vocab_parallel_lookup(ids: np.ndarray, padded: np.ndarray, start: int) -> np.ndarray:
    """One rank's lookup: owned ids shifted to local rows, every other id to the padding row."""
    per_part = padded.shape[0] - 1
    owned = (ids >= start) & (ids < start + per_part)
    rows = np.where(owned, ids - start, per_part)
    # Into a placed array (spmdsim.base.buffers): the Allreduce sends it next. Every row
    # index is in range by construction, so "clip" spares take's checked copy.
    out = buffers.empty(rows.shape + padded.shape[1:], padded.dtype)
    return np.take(padded, rows, axis=0, out=out, mode="clip")


def plan_embedding(ids: Any, table: Any, *, gather_out: bool = True,
                   reduce: bool = True) -> tuple[EmbeddingPlan, tuple[int, ...]]:
    """Plan and global output shape; checks layouts, shapes and id values before any collective."""
    try:
        layouts = (ids.layout, table.layout)
    except AttributeError:
        raise_if_not_dtensors("embedding", ("ids", "table"), ids, table)
        raise
    if ids.dtype.kind not in "iub" and table.dtype.kind in "iu":  # (before the layouts' refusals: it is why)
        raise OperatorError(f"embedding: the ids are {ids.dtype.name} of global shape {tuple(ids.global_shape)!r} "
                            f"and the table integers of global shape {tuple(table.global_shape)!r}; the ids come "
                            "first: embedding(ids, table), as PyTorch's F.embedding(input, weight)")
    plan = infer_embedding(*layouts, gather_out=flag("embedding", "gather_out", gather_out),
                           reduce=flag("embedding", "reduce", reduce))
    num_embeddings, dim = table.global_shape
    # Same ids on every rank of the table's groups: they all raise the same error.
    check_ids(ids.local, num_embeddings)
    shape = tuple(ids.global_shape) + (dim,)
    if plan.vocab_axes and table.dtype.kind == "b":  # MPI has no sum of bools
        raise OperatorError("embedding: the table has dtype 'bool', but a vocab-parallel lookup sums "
                            "the ranks' lookups; use an integer, float or complex dtype")
    for layout in (plan.local, plan.out):
        layout.check_shape(shape, "embedding output")
    return plan, shape


def embedding(ids: Any, table: Any, *, gather_out: bool = True, reduce: bool = True,
              padded_local: Optional[np.ndarray] = None, label: Optional[str] = "embedding",
              padding_idx: Optional[int] = None) -> Any:
    """table[ids] on DTensors; the table's layout picks vocab- and/or dim-parallel.

    Args:
        ids: integer DTensor, replicated over the table's axes.
        table: (num_embeddings, embedding_dim) DTensor.
        gather_out: Allgather columns of a dim-parallel lookup.
        reduce: False keeps the vocab-parallel pending sum.
        padded_local: this rank's padded shard (as VocabParallelEmbedding keeps it).
        padding_idx: as PyTorch's nn.Embedding: that row (negative: from the end) gets no gradient
            (a padding token's lookups do not train it).
    """
    mesh = operands_mesh("embedding", ("ids", "table"), ids, table)
    plan, shape = plan_embedding(ids, table, gather_out=gather_out, reduce=reduce)
    if padding_idx is not None:
        rows = table.global_shape[0]
        if isinstance(padding_idx, bool) or not isinstance(padding_idx, (int, np.integer)) \
                or not -rows <= padding_idx < rows:
            raise OperatorError(f"embedding: padding_idx {padding_idx!r} must be an integer from {-rows} to "
                                f"{rows - 1} (a row of the ({rows}, ...) table)")
        padding_idx = int(padding_idx) % rows
    start = 0
    # the blocks, read once (a captured step: its record's views)
    id_block, block = (ids._local, table._local) if not buffers.CAPTURE.on else (ids.local, table.local)
    # A dry run's large lookup: zeros of its shape, the table neither padded nor read (spmdsim.runtime.sim.dry).
    dry = dry_zeros(mesh, id_block.shape + block.shape[1:], table.dtype, np.take, block, id_block)
    if plan.vocab_axes:
        start, _ = table.layout.bounds(mesh.rank, table.global_shape)[0]
    if dry is not None:  # placed as the real lookup's result (buffers.empty), so a dry run keeps its bytes
        local = buffers.empty(dry.shape, dry.dtype)
    elif plan.vocab_axes:
        padded = pad_vocab_shard(block) if padded_local is None else padded_local
        if padded.shape != (block.shape[0] + 1,) + block.shape[1:]:
            raise ShapeError(f"padded shard {padded.shape!r} does not fit {block.shape!r}")
        local = vocab_parallel_lookup(id_block, padded, start)
    else:
        local = block[id_block]
    sweep("embedding", (id_block, local), (local,))  # the ids and the rows looked up read, the rows written
    local = execute(mesh, local, plan.reduce, shape, label, owned=True)
    local = execute(mesh, local, plan.gather, shape, None if label is None else f"{label}.gather",
                    owned=True)
    out = make_dtensor(mesh, local, plan.out, shape)
    if table._ag is not None:
        record_embedding(out, ids, table, plan, start, label, padding_idx)
    return out


class VocabParallelEmbedding:
    """Megatron's VocabParallelEmbedding with Paddle's padding-row rule.

    Args:
        mesh: the runtime Mesh.
        num_embeddings, embedding_dim: the global table shape (N, M).
        axes: mesh axes splitting the vocabulary (default: every mesh axis).
        dtype, seed: how the table is generated.

    Attributes: ``weight`` (DTensor, rows split), ``padded_weight`` (this rank's
    (N/p + 1, M) array, last row zero), ``vocab_start_index``, ``vocab_end_index``.
    """

    def __init__(
        self, mesh: Any, num_embeddings: int, embedding_dim: int, *,
        axes: Optional[Iterable[str] | str] = None, dtype: str = "float32", seed: int = 0,
    ) -> None:
        self.mesh = mesh
        self.axes = default_axes(mesh, axes)
        self.num_embeddings, self.embedding_dim = _table_shape(self, num_embeddings, embedding_dim)
        self.weight_source = SeededTensor((self.num_embeddings, self.embedding_dim), dtype,
                                          int_arg(seed, "VocabParallelEmbedding seed", low=0))
        layout = mesh.layout(self.axes, None)
        layout.check_shape(self.weight_source.shape, "VocabParallelEmbedding table")
        shard = seeded_dtensor(mesh, layout, self.weight_source)
        self.padded_weight = pad_vocab_shard(shard.local)
        # The parameter's block is a view of the padded table, so an optimizer's
        # in-place update reaches the lookups (the padding row stays zero).
        self.weight = type(shard)(mesh, self.padded_weight[:-1], layout, shard.global_shape).requires_grad_()
        parts = mesh.layout.group_size(self.axes)
        index = mesh.layout.group_index(mesh.rank, self.axes)
        self.vocab_start_index, self.vocab_end_index = vocab_range(self.num_embeddings, index, parts)

    def __call__(self, ids: Any, label: Optional[str] = "vocab_embedding") -> Any:
        return embedding(ids, self.weight, padded_local=self.padded_weight, label=label)

    def reference(self, ids: Source) -> RegionFn:
        """Region reference of this layer applied to the global ids."""
        return embedding_region(ids, self.weight_source)


class ParallelEmbedding:
    """Embedding-dim-parallel layer (fairscale's ParallelEmbedding): the table's columns are split.

    Each rank looks up its columns of every id (no padding rule needed); with
    `gather_output` one Allgather concatenates the columns, else they stay split.
    Args as in VocabParallelEmbedding.
    """

    def __init__(
        self, mesh: Any, num_embeddings: int, embedding_dim: int, *,
        gather_output: bool = True, axes: Optional[Iterable[str] | str] = None,
        dtype: str = "float32", seed: int = 0,
    ) -> None:
        self.mesh = mesh
        self.axes = default_axes(mesh, axes)
        self.gather_output = flag("ParallelEmbedding", "gather_output", gather_output)  # (bool("false") is True)
        self.weight_source = SeededTensor(_table_shape(self, num_embeddings, embedding_dim), dtype,
                                          int_arg(seed, "ParallelEmbedding seed", low=0))
        layout = mesh.layout(None, self.axes)
        layout.check_shape(self.weight_source.shape, "ParallelEmbedding table")
        self.weight = seeded_dtensor(mesh, layout, self.weight_source).requires_grad_()

    def __call__(self, ids: Any, label: Optional[str] = "dim_embedding") -> Any:
        return embedding(ids, self.weight, gather_out=self.gather_output, label=label)

    def reference(self, ids: Source) -> RegionFn:
        """Region reference of this layer applied to the global ids."""
        return embedding_region(ids, self.weight_source)


def _table_shape(layer: Any, num_embeddings: Any, embedding_dim: Any) -> tuple[int, int]:
    """(num_embeddings, embedding_dim) as ints >= 1: a vocabulary of 0 has nothing to look up."""
    name = type(layer).__name__
    return (int_arg(num_embeddings, f"{name} num_embeddings", low=1),
            int_arg(embedding_dim, f"{name} embedding_dim", low=1))
