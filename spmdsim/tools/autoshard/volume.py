"""The bytes a redistribution must move: the busiest rank's lower bound, for many pairs of layouts at once.

Pure (numpy only). A redistribution between layouts without pending sums costs
exactly its lower bound (the planner's exchange always meets it, and the
planner keeps the least): `redistribution_bytes` computes it for many targets
at once from the blocks each rank holds, without building plans. The search's
cost table (`cost.Table`) and the backward's pricing (`backward`) both ask it;
it imports neither, so cost.py imports backward.py with no cycle between them.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Optional, Sequence

import numpy as np

from ...layouts.layout import TensorLayout
from ...programs.plan import plan_redistribution

__all__ = ["redistribution_bytes", "pair_bytes"]

_CHUNK = 1 << 22  # elements per vectorised block (targets x dims x ranks)


@lru_cache(maxsize=8192)
def _starts(tl: TensorLayout, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(first index held per dim and rank, block width per dim) of a layout without pending sums."""
    widths = np.array(tl.local_shape(shape), dtype=np.int64)
    starts = np.stack([tl.layout.group_indices(axes) * w
                       for axes, w in zip(tl.tensor_map, widths)]) if shape else \
        np.zeros((0, tl.layout.num_devices), dtype=np.int64)
    return starts, widths


def redistribution_bytes(sources: Sequence[TensorLayout], targets: Sequence[TensorLayout],
                         shape: Sequence[int], dtype: str) -> np.ndarray:
    """Per (source, target), the bytes the busiest rank receives going there (int64 matrix).

    Each rank receives the part of its target block it does not hold: the
    lower bound, which the planner's plan meets when neither side is a pending
    sum (tested against `plan_redistribution`); pending sums go to the planner.
    On power-of-two meshes the blocks nest, so the bound follows from which
    rank bits index each dim (`_nested_needs`); otherwise from every rank's blocks.
    """
    shape, itemsize = tuple(shape), np.dtype(dtype).itemsize
    out = np.zeros((len(sources), len(targets)), dtype=np.int64)
    bits_t = [_bits(t, shape) for t in targets]
    easy = [j for j, t in enumerate(targets) if not t.partial and bits_t[j] is None]
    nested = [j for j, t in enumerate(targets) if not t.partial and bits_t[j] is not None]
    prepared = _prepare([bits_t[j] for j in nested]) if nested else None
    for i, source in enumerate(sources):
        bits_s = None if source.partial else _bits(source, shape)
        hard = range(len(targets)) if source.partial else \
            [j for j, t in enumerate(targets) if t.partial or (bits_s is None and j in nested)]
        for j in hard:
            out[i, j] = plan_redistribution(source, targets[j], shape, dtype).max_bytes_received
        if bits_s is not None and nested:
            out[i, nested] = _nested_needs(bits_s, prepared) * itemsize
        if not source.partial and easy:
            out[i, easy] = _blocks_need(source, [targets[j] for j in easy], shape) * itemsize
    return out


def pair_bytes(source: TensorLayout, target: TensorLayout, shape: Sequence[int], dtype: str) -> int:
    """`redistribution_bytes` of one pair: on a power-of-two mesh without pending sums, `_nested_needs`'s
    rule read for the one target in plain Python (a numpy call per dim costs more than the answer)."""
    shape = tuple(shape)
    if not source.partial and not target.partial:
        bits_s, bits_t = _bits(source, shape), _bits(target, shape)
        if bits_s is not None and bits_t is not None:
            size = held = 1
            for (s, w_s), (t, w_t) in zip(bits_s, bits_t):
                size *= w_t
                short, long = (s, t) if len(s) <= len(t) else (t, s)
                held *= min(w_t, w_s) if long[:len(short)] == short else 0
            return (size - held) * np.dtype(dtype).itemsize
    return int(redistribution_bytes([source], [target], shape, dtype)[0, 0])


@lru_cache(maxsize=8192)
def _bits(tl: TensorLayout, shape: tuple) -> Optional[tuple]:
    """Per dim (rank bits indexing its block, major first; block width), on a power-of-two mesh."""
    layout, where = tl.layout, {}
    for name, size, stride in zip(layout.alias_name, layout.device_matrix, layout.strides):
        if size & (size - 1):
            return None
        low, k = stride.bit_length() - 1, size.bit_length() - 1
        where[name] = tuple(range(low + k - 1, low - 1, -1))
    widths = tl.local_shape(shape)
    return tuple((tuple(b for a in axes for b in where[a]), w) for axes, w in zip(tl.tensor_map, widths))


def _prepare(targets: Sequence[tuple]) -> tuple:
    """Per dim of many targets' `_bits`: (distinct rank bits, each target's index there, widths); sizes."""
    dims = []
    for d in range(len(targets[0])):
        distinct: dict = {}
        index = np.array([distinct.setdefault(t[d][0], len(distinct)) for t in targets])
        dims.append((tuple(distinct), index, np.array([t[d][1] for t in targets], dtype=np.int64)))
    size = np.prod([w for _, _, w in dims], axis=0) if dims else np.ones(len(targets), dtype=np.int64)
    return dims, size


def _nested_needs(source: tuple, prepared: tuple) -> np.ndarray:
    """Per target (`_prepare`d), the elements the busiest rank lacks of its target block when every split
    is a power of two; each bit test once per distinct bits.

    Along each dim the finer block lies inside one coarser block; a rank holds
    its whole target block there (the smaller width) exactly when the coarser
    index is read from the same rank bits as the top of the finer one, on
    every rank; one rank that reads other bits holds nothing of it.
    """
    dims, size = prepared
    held = np.ones(len(size), dtype=np.int64)
    for (bits_s, w_s), (distinct, index, widths) in zip(source, dims):
        match = np.array([long[:len(short)] == short for bits_t in distinct
                          for short, long in [sorted((bits_s, bits_t), key=len)]])
        held *= match[index] * np.minimum(widths, w_s)
    return size - held


def _blocks_need(source: TensorLayout, targets: Sequence[TensorLayout], shape: tuple) -> np.ndarray:
    """Per target, elements the busiest rank lacks, from every rank's blocks (vectorised)."""
    out = np.zeros(len(targets), dtype=np.int64)
    lo, w = zip(*(_starts(t, shape) for t in targets))
    t_lo, t_w = np.stack(lo), np.stack(w)  # (T, dims, ranks), (T, dims)
    t_hi, t_size = t_lo + t_w[:, :, None], t_w.prod(axis=1)
    s_lo, s_w = _starts(source, shape)
    s_hi = s_lo + s_w[:, None]
    step = max(1, _CHUNK // max(1, s_lo.size))
    for first in range(0, len(targets), step):
        part = slice(first, first + step)
        overlap = np.minimum(s_hi, t_hi[part]) - np.maximum(s_lo, t_lo[part])
        held = np.clip(overlap, 0, None).prod(axis=1)  # (T, ranks)
        out[part] = t_size[part] - held.min(axis=1)
    return out
