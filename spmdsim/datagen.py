"""Counter-based data: any slice of a seeded global tensor, made directly.

Each element is a pure function of (seed, flat global index) through the
splitmix64 mixer, so a rank builds its own shard without the global tensor,
a reference builds exactly the slice it compares, and the same slice is
bit-identical whatever the number of ranks or the layout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

from . import buffers
from .errors import ShapeError, SpmdsimError

__all__ = ["SeededTensor", "FLOAT_DTYPES", "INT_DTYPES"]

FLOAT_DTYPES = ("float32", "float64")
INT_DTYPES = ("int32", "int64")

# Generate at most this many elements per pass so the uint64 temporaries stay
# small next to the output (matters for the memory run of large shards).
_CHUNK_ELEMENTS = 1 << 20

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)

Region = Sequence[Union[slice, Sequence[int]]]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer, in place on a uint64 array (wraps modulo 2**64)."""
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


@dataclass(frozen=True)
class SeededTensor:
    """A global tensor defined by a seed: ``SeededTensor((64, 32), "float32", seed=1)``.

    Floats are uniform in [low, high); integers uniform in [low, high).
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    seed: int = 0
    low: float = -1.0
    high: float = 1.0

    def __post_init__(self) -> None:
        try:
            shape = tuple(int(s) for s in self.shape)
        except (TypeError, ValueError):
            raise ShapeError(f"shape {self.shape!r} must be a sequence of integers") from None
        if any(s < 0 for s in shape):
            raise ShapeError(f"shape {shape!r} must not have negative sizes")
        dtype = np.dtype(self.dtype).name if _known_dtype(self.dtype) else self.dtype
        if dtype not in FLOAT_DTYPES + INT_DTYPES:
            raise SpmdsimError(
                f"dtype {self.dtype!r} is not supported; expected one of {FLOAT_DTYPES + INT_DTYPES!r}"
            )
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise SpmdsimError(f"seed {self.seed!r} must be an integer in [0, 2**63)")
        if not self.low < self.high:
            raise SpmdsimError(f"range [{self.low!r}, {self.high!r}) is empty; expected low < high")
        if dtype in INT_DTYPES:
            if int(self.low) != self.low or int(self.high) != self.high:
                raise SpmdsimError(
                    f"integer range [{self.low!r}, {self.high!r}) must have integer bounds"
                )
            if int(self.high) - int(self.low) > 2**32:
                raise SpmdsimError(
                    f"integer range [{self.low!r}, {self.high!r}) is wider than 2**32"
                )
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def full(self) -> np.ndarray:
        """The whole global tensor (references and small demos only)."""
        return self.region(tuple(slice(None) for _ in self.shape))

    def region(self, region: Region) -> np.ndarray:
        """The block given by per-dim slices or (start, stop) pairs, as a new array."""
        bounds = self._bounds(region)
        out_shape = tuple(b - a for a, b in bounds)
        out = buffers.empty(out_shape, self.dtype)
        if out.size == 0:
            return out
        strides = [1] * len(self.shape)
        for i in range(len(self.shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * self.shape[i + 1]
        key = _mix(np.array([self.seed], dtype=np.uint64) + _GOLDEN)[0]
        if not self.shape:
            self._fill(np.array([key + _GOLDEN], dtype=np.uint64), out.reshape(1))
            return out
        # Flat index of the block minus its first dim, built by broadcasting.
        inner = np.zeros(out_shape[1:], dtype=np.uint64)
        for d in range(1, len(self.shape)):
            ax = np.arange(bounds[d][0], bounds[d][1], dtype=np.uint64) * np.uint64(strides[d])
            inner = inner + ax.reshape((-1,) + (1,) * (len(self.shape) - 1 - d))
        rows_per_pass = max(1, _CHUNK_ELEMENTS // max(1, inner.size))
        start0 = bounds[0][0]
        for r0 in range(0, out_shape[0], rows_per_pass):
            r1 = min(out_shape[0], r0 + rows_per_pass)
            rows = np.arange(start0 + r0, start0 + r1, dtype=np.uint64) * np.uint64(strides[0])
            flat = rows.reshape((-1,) + (1,) * (len(self.shape) - 1)) + inner
            # Counter-based: mix (index + 1) * golden with the seed's key.
            counters = (flat + np.uint64(1)) * _GOLDEN
            counters ^= key
            self._fill(_mix(counters), out[r0:r1])
        return out

    def _fill(self, bits: np.ndarray, out: np.ndarray) -> None:
        if self.dtype in INT_DTYPES:
            span = np.uint64(int(self.high) - int(self.low))
            # Multiply-high on 32 bits: unbiased enough and exact in uint64.
            values = ((bits >> np.uint64(32)) * span) >> np.uint64(32)
            out[...] = values.astype(np.int64) + int(self.low)
            return
        if self.dtype == "float32":
            unit = (bits >> np.uint64(40)).astype(np.float32) * np.float32(2.0**-24)
            out[...] = np.float32(self.low) + np.float32(self.high - self.low) * unit
        else:
            unit = (bits >> np.uint64(11)).astype(np.float64) * (2.0**-53)
            out[...] = self.low + (self.high - self.low) * unit

    def _bounds(self, region: Region) -> tuple[tuple[int, int], ...]:
        region = tuple(region)
        if len(region) != len(self.shape):
            raise ShapeError(
                f"region {region!r} has {len(region)} dims but the tensor has shape {self.shape!r}"
            )
        out = []
        for d, (part, size) in enumerate(zip(region, self.shape)):
            if isinstance(part, slice):
                start, stop, step = part.indices(size)
                if step != 1:
                    raise ShapeError(f"region dim {d} slice {part!r} must have step 1")
            else:
                start, stop = (int(v) for v in part)
            if not 0 <= start <= stop <= size:
                raise ShapeError(
                    f"region dim {d} range [{start}, {stop}) is outside size {size}"
                )
            out.append((start, stop))
        return tuple(out)


def _known_dtype(dtype: object) -> bool:
    try:
        np.dtype(dtype)
    except TypeError:
        return False
    return True
