"""Which tokens of a sequence each context-parallel rank holds, and the causal attention work that follows.

Pure (no numpy). With context parallelism of size ``cp`` each rank holds part of every sequence for the
whole transformer block. Split naively (rank r the r-th of cp contiguous chunks), causal attention gives
the last rank cp times the first one's work, since its queries see every earlier key. Split as Megatron-LM
does for causal masks (the sequence cut into 2·cp chunks; rank r holds chunks r and 2·cp-1-r), every
rank's queries see the same number of keys. A rank's tokens are kept in position order; its part of a
sequence is one contiguous block of the `order` permutation, so a sequence dim split evenly over the
context axis holds exactly these tokens once the sequence is laid out in that order.

    >>> chunks(1, 2, balanced=True)
    (1, 2)
    >>> positions(1, 2, 8, balanced=True)
    (2, 3, 4, 5)
"""
from __future__ import annotations

import functools

from ...base.validate import as_int
from ...errors import ShapeError

__all__ = ["SPLITS", "check_split", "chunks", "positions", "order", "causal_pairs", "imbalance"]

#: The ways a sequence is split over the context axis: "balanced" (2·cp chunks, r and 2·cp-1-r) and
#: "naive" (cp contiguous chunks), the second only to show causal attention's imbalance.
SPLITS = ("balanced", "naive")


def check_split(cp: object, seq: object, balanced: bool = True) -> None:
    """Refuse a context size or a sequence length the split cannot take, in one line naming the value."""
    n, s = as_int(cp), as_int(seq)
    if n is None or n < 1:
        raise ShapeError(f"context-parallel size {cp!r} must be an int >= 1")
    if s is None or s < 1:
        raise ShapeError(f"sequence length {seq!r} must be an int >= 1")
    parts = 2 * n if balanced and n > 1 else n
    if s % parts:
        how = f"2 x cp = {parts} chunks (the balanced causal split)" if parts != n else f"cp = {n} chunks"
        raise ShapeError(f"sequence length {s} does not divide into {how}; expected a multiple of {parts}")


def chunks(rank: int, cp: int, balanced: bool = True) -> tuple[int, ...]:
    """The chunks rank `rank` holds: (r, 2·cp-1-r) of 2·cp when balanced, (r,) of cp when naive."""
    if not 0 <= rank < cp:
        raise ShapeError(f"rank {rank!r} is not in a context group of {cp}; expected 0 to {cp - 1}")
    return (rank, 2 * cp - 1 - rank) if balanced and cp > 1 else (rank,)


def positions(rank: int, cp: int, seq: int, balanced: bool = True) -> tuple[int, ...]:
    """The positions in a sequence of `seq` tokens that rank `rank` holds, in order."""
    check_split(cp, seq, balanced)
    size = seq // (2 * cp if balanced and cp > 1 else cp)
    return tuple(p for c in chunks(rank, cp, balanced) for p in range(c * size, (c + 1) * size))


@functools.lru_cache(maxsize=64, typed=True)
def order(cp: int, seq: int, balanced: bool = True) -> tuple[int, ...]:
    """The sequence's positions laid out rank after rank: split evenly over cp, block r is rank r's (a tuple,
    kept by value: each model of a dry run over cp asks for its sequence's)."""
    return tuple(p for r in range(cp) for p in positions(r, cp, seq, balanced))


def causal_pairs(rank: int, cp: int, seq: int, balanced: bool = True) -> int:
    """(query, key) pairs rank `rank`'s queries score under a causal mask (a key at or before its query):
    its share of the attention's products, forward and backward alike: over its chunks of z tokens, the
    sum of p + 1 for p from c·z to c·z + z - 1."""
    check_split(cp, seq, balanced)
    z = seq // (2 * cp if balanced and cp > 1 else cp)
    return sum(z * c * z + z * (z + 1) // 2 for c in chunks(rank, cp, balanced))


def imbalance(cp: int, seq: int, balanced: bool = True) -> float:
    """The busiest rank's causal attention work over the least busy one's (1.0: every rank alike)."""
    work = [causal_pairs(r, cp, seq, balanced) for r in range(cp)]
    return max(work) / min(work)
