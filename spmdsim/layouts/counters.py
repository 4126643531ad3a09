"""The counters behind a seeded tensor's elements: splitmix64 of (flat global index + 1) * golden, mixed
with the seed's key (spmdsim.layouts.datagen's SeededTensor), and the tables that keep what does not change
from one seed to the next (a seed's key, a block's counters, a dropout mask's plan at one region).
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
from ..base.tables import put

_GOLDEN_INT, _M1_INT, _M2_INT = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1
_GOLDEN, _M1, _M2 = np.uint64(_GOLDEN_INT), np.uint64(_M1_INT), np.uint64(_M2_INT)


def _mix(x: np.ndarray, scratch: np.ndarray | None = None) -> np.ndarray:
    """splitmix64 finalizer, in place on a uint64 array (wraps modulo 2**64); `scratch`: a uint64
    array of x's shape for the shifted copies (else made each time)."""
    t = _empty_like(x) if scratch is None else scratch
    x ^= _right_shift(x, _S30, t)
    x *= _M1
    x ^= _right_shift(x, _S27, t)
    x *= _M2
    x ^= _right_shift(x, _S31, t)
    return x


_empty, _empty_like, _right_shift, _xor, _greater_equal = (
    np.empty, np.empty_like, np.right_shift, np.bitwise_xor, np.greater_equal)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
_KEYS: dict = {}  # seed -> its mixed key (the simulated ranks of one step ask for the same seeds)
_INNERS: dict = {}  # (shape, region's bounds) -> (inner flat index + 1) * golden, read-only
_BASES: dict = {}  # (shape, region's bounds) -> the block's (flat index + 1) * golden, read-only
_INNER_BYTES = [0]  # bytes held in _INNERS and _BASES
_INNER_MAX_BYTES = 64 << 20
#: id(region) -> (that region, the tensor's shape, the threshold, the block's shape, its kept counters (a
#: _BASES entry), the threshold's edge on the bits): what `at_least` checked and worked out for a dropout's
#: mask at one region, the region object held (its id is not reused) and compared by identity, shape and
#: threshold by value. Only regions nothing can change (tuples of slices or of int pairs) are kept; cleared
#: with _BASES (an entry holds one of its arrays).
_PLANS: dict = {}


def _key(seed: int) -> np.uint64:
    """The seed's key: splitmix64 of seed + golden, on Python integers (a new seed each step costs a
    few additions, not the arrays of a numpy pass)."""
    key = _KEYS.get(seed)
    if key is None:
        z = (seed + _GOLDEN_INT) & _MASK64
        z = ((z ^ (z >> 30)) * _M1_INT) & _MASK64
        z = ((z ^ (z >> 27)) * _M2_INT) & _MASK64
        key = np.uint64(z ^ (z >> 31))
        put(_KEYS, seed, key, 4096)
    return key


def _inner(shape: tuple, bounds: tuple) -> np.ndarray:
    """(flat index within the first dim's row + 1) * golden over the block's other dims (wrapping)."""
    cache_key = (shape, bounds[1:])
    found = _INNERS.get(cache_key)
    if found is not None:
        return found
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    inner = np.zeros(tuple(b - a for a, b in bounds[1:]), dtype=np.uint64)
    for d in range(1, len(shape)):
        ax = np.arange(bounds[d][0], bounds[d][1], dtype=np.uint64) * np.uint64(strides[d])
        inner = inner + ax.reshape((-1,) + (1,) * (len(shape) - 1 - d))
    inner += np.uint64(1)
    inner *= _GOLDEN
    inner.flags.writeable = False
    if _INNER_BYTES[0] + inner.nbytes > _INNER_MAX_BYTES:  # many regions: start over
        _INNERS.clear()
        _BASES.clear()
        _PLANS.clear()
        _INNER_BYTES[0] = 0
    if inner.nbytes <= _INNER_MAX_BYTES // 4:
        _INNERS[cache_key] = inner
        _INNER_BYTES[0] += inner.nbytes
    return inner


def _counters(shape: tuple, start: int, stop: int, inner: np.ndarray) -> np.ndarray:
    """(flat index + 1) * golden over rows [start, stop) of the first dim and the block `inner` (`_inner`) spans
    in the others, wrapping modulo 2**64: rows * stride * golden + (inner index + 1) * golden."""
    rows = np.arange(start, stop, dtype=np.uint64) * np.uint64(math.prod(shape[1:]))
    rows *= _GOLDEN
    return rows.reshape((-1,) + (1,) * (len(shape) - 1)) + inner


def _kept(shape: tuple, bounds: tuple, inner: np.ndarray) -> Optional[np.ndarray]:
    """The block's `_counters`, kept in _BASES (seed-independent: a dropout mask drawn at the same block each
    step makes its counters in one pass from them); None when the cache has no room."""
    base = _counters(shape, bounds[0][0], bounds[0][1], inner)
    if _INNER_BYTES[0] + base.nbytes > _INNER_MAX_BYTES or base.nbytes > _INNER_MAX_BYTES // 4:
        return None
    base.flags.writeable = False
    _BASES[(shape, bounds)] = base
    _INNER_BYTES[0] += base.nbytes
    return base
