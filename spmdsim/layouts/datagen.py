"""Counter-based data: any slice of a seeded global tensor, made directly.

Each element is a pure function of (seed, flat global index) through the
splitmix64 mixer, so a rank builds its own shard without the global tensor,
a reference builds exactly the slice it compares, and the same slice is
bit-identical whatever the number of ranks or the layout.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np

from ..base import buffers
from ..base.context import current as _context
from ..base.context import _THREAD  # the running thread's context (current()'s read, without its call)
from ..base.tables import put
from ..errors import ShapeError, SpmdsimError
from ..base.validate import as_int, counted, dtype_name, float_max, shape_arg
from .counters import (_BASES, _GOLDEN, _KEYS, _PLANS, _counters, _empty, _greater_equal, _inner,
                       _key, _kept, _mix, _xor)

__all__ = ["SeededTensor", "FLOAT_DTYPES", "INT_DTYPES"]

FLOAT_DTYPES = ("float32", "float64")
INT_DTYPES = ("int32", "int64")

# Generate at most this many elements per pass so the uint64 temporaries stay
# small next to the output (matters for the memory run of large shards).
_CHUNK_ELEMENTS = 1 << 20

Region = Sequence[Union[slice, Sequence[int]]]


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
        low, high = self.low, self.high
        if (type(self.dtype) is str and self.dtype in FLOAT_DTYPES and type(self.seed) is int and 0 <= self.seed < 2**63
                and type(low) is float and type(high) is float and low < high
                and max(abs(low), abs(high), high - low) <= float_max(self.dtype)
                and type(self.shape) is tuple and all(type(n) is int and n >= 0 for n in self.shape)):
            return  # a model's parameters: every check below passes and keeps every field as given
        shape = shape_arg(self.shape)
        dtype = dtype_name(np.dtype(self.dtype)) if _known_dtype(self.dtype) else self.dtype
        if dtype not in FLOAT_DTYPES + INT_DTYPES:
            raise SpmdsimError(
                f"dtype {self.dtype!r} is not supported; expected one of {FLOAT_DTYPES + INT_DTYPES!r}"
                f"{_narrow_hint(self.dtype)}")
        seed = as_int(self.seed)
        if seed is None or not 0 <= seed < 2**63:
            raise SpmdsimError(f"seed {self.seed!r} must be an integer in [0, 2**63)")
        for what, bound in (("low", self.low), ("high", self.high)):
            # An infinite bound fills the tensor with inf or NaN (inf - inf).
            if isinstance(bound, bool) or not isinstance(bound, numbers.Real) or not math.isfinite(bound):
                raise SpmdsimError(f"{what} {bound!r} must be a finite number")
        if not self.low < self.high:
            raise SpmdsimError(f"range [{self.low!r}, {self.high!r}) is empty; expected low < high")
        if dtype in INT_DTYPES:
            if int(self.low) != self.low or int(self.high) != self.high:
                raise SpmdsimError(f"integer range [{self.low!r}, {self.high!r}) must have integer bounds")
            if int(self.high) - int(self.low) > 2**32:
                raise SpmdsimError(f"integer range [{self.low!r}, {self.high!r}) is wider than 2**32")
            info = np.iinfo(dtype)
            if int(self.low) < info.min or int(self.high) - 1 > info.max:
                raise SpmdsimError(f"integer range [{self.low!r}, {self.high!r}) does not fit {dtype}")
        elif max(abs(self.low), abs(self.high), self.high - self.low) > float_max(dtype):
            # Values (or the span they are scaled by) would round to inf in this dtype.
            raise SpmdsimError(f"range [{self.low!r}, {self.high!r}) does not fit {dtype}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "seed", seed)

    def with_seed(self, seed: int) -> "SeededTensor":
        """This tensor under another seed: only the seed is checked (the rest was, when this one was made),
        so a dropout mask drawn each step does not check its shape and range again."""
        value = seed if type(seed) is int else as_int(seed)
        if value is None or not 0 <= value < 2**63:
            raise SpmdsimError(f"seed {seed!r} must be an integer in [0, 2**63)")
        other = _new(SeededTensor)
        other.__dict__.update(self.__dict__, seed=value)
        return other

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def full(self) -> np.ndarray:
        """The whole global tensor (references and small demos only)."""
        return self.region(tuple(slice(None) for _ in self.shape))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """Refused: numpy read a SeededTensor as a 0-d object array (``reference.matmul(xs, ws)`` said "got
        shapes () and ()"); the whole tensor is made only when asked for by name."""
        raise SpmdsimError(f"numpy array of a SeededTensor of shape {self.shape!r}: its values are made only when "
                           "asked; xs.full() makes the whole tensor, and the *_region references "
                           "(reference.matmul_region(xs, ws)) take SeededTensors")

    def region(self, region: Region) -> np.ndarray:
        """The block given by per-dim slices or (start, stop) pairs, as a new array."""
        bounds = self._bounds(region)
        out_shape = tuple(b - a for a, b in bounds)
        context = _context()
        if context.dry_run:  # the dry engine's stand-in: shape and dtype, no data
            return context.engine.blank(out_shape, self.dtype)
        out = buffers.empty(out_shape, self.dtype)
        for bits, rows in self._bits(bounds, out_shape):
            self._fill(bits, out.reshape(1) if rows is None else out[rows])
        return out

    def at_least(self, region: Region, threshold: float, out: np.ndarray | None = None) -> np.ndarray:
        """``self.region(region) >= threshold`` as a bool block (a dropout's keep mask), the same values
        (into `out`, a bool array of the region's shape, when given: a replayed mask's).

        For float64 in [0, 1), the default of a mask, it compares the generator's bits with the
        threshold's (each value is (bits >> 11) * 2**-53 exactly), without making the floats. A mask
        drawn again at the same region object and threshold (each step's dropout, each seed) reuses
        what the first draw checked and worked out there (`_PLANS`): one pass of numpy calls.
        """
        plan = _PLANS.get(id(region))
        if (plan is not None and plan[0] is region and plan[1] == self.shape and plan[2] == threshold
                and self.dtype == "float64" and self.low == 0 and self.high == 1 and not _THREAD.context.dry_run):
            key = _KEYS.get(self.seed)
            bits = _xor(plan[4], _key(self.seed) if key is None else key)
            if out is None:
                out = _empty(plan[3], bool)
            _greater_equal(_mix(bits), plan[5], out)
            return out
        if self.dtype != "float64" or self.low != 0 or self.high != 1 or _context().dry_run:
            if out is None:
                return self.region(region) >= threshold
            return np.greater_equal(self.region(region), threshold, out=out)
        bounds = self._bounds(region)
        out_shape = tuple(b - a for a, b in bounds)
        if out is None:
            out = np.empty(out_shape, dtype=bool)
        # value >= t  <=>  bits >> 11 >= ceil(t * 2**53) (an exact product)  <=>  bits >= that << 11.
        first = math.ceil(threshold * 2.0**53) if threshold == threshold else None
        if first is None or first > (1 << 53) - 1:  # NaN or above every value: nothing kept
            out[...] = False
            return out
        if first <= 0:  # at or below 0: every value kept
            out[...] = True
            return out
        edge = np.uint64(first << 11)
        for bits, rows in self._bits(bounds, out_shape, keep=True):
            np.greater_equal(bits, edge, out=out.reshape(1) if rows is None else out[rows])
        base = _BASES.get((self.shape, bounds))
        if base is not None and _fixed(region):
            put(_PLANS, id(region), (region, self.shape, threshold, out_shape, base, edge), 4096)
        return out

    def _bits(self, bounds: tuple, out_shape: tuple,
              keep: bool = False) -> Iterator[tuple[np.ndarray, Optional[slice]]]:
        """(the mixed uint64 bits, the rows of the block they fill; None: the whole 0-d block), pass by pass.
        `keep`: a block of one pass keeps its seed-independent counters for the next seed (_kept)."""
        if not math.prod(out_shape):
            return
        key = _key(self.seed)
        if not self.shape:
            # An array sum wraps modulo 2**64 silently (a numpy scalar sum warns of overflow).
            yield np.array([key], dtype=np.uint64) + _GOLDEN, None
            return
        # Counter-based: mix (flat index + 1) * golden with the seed's key. Modulo 2**64 that is
        # rows * stride * golden + (inner + 1) * golden, inner the flat index of the block minus its
        # first dim: the second term is the same for every seed, kept per (shape, region).
        base = _BASES.get((self.shape, bounds))
        if base is None:
            inner = _inner(self.shape, bounds)
            rows_per_pass = max(1, _CHUNK_ELEMENTS // max(1, inner.size))
            if keep and rows_per_pass >= out_shape[0]:
                base = _kept(self.shape, bounds, inner)
        if base is not None:  # the block's counters, kept: one pass makes this seed's
            yield _mix(np.bitwise_xor(base, key)), slice(0, out_shape[0])
            return
        start0, scratch = bounds[0][0], None
        for r0 in range(0, out_shape[0], rows_per_pass):
            r1 = min(out_shape[0], r0 + rows_per_pass)
            counters = _counters(self.shape, start0 + r0, start0 + r1, inner)
            counters ^= key
            if scratch is None or scratch.shape != counters.shape:
                scratch = np.empty_like(counters)
            yield _mix(counters, scratch), slice(r0, r1)

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
        elif out.flags.c_contiguous and out.shape == bits.shape:
            # In place: the same conversions and roundings as low + (high - low) * unit, unit the top
            # 53 bits times 2**-53 (exact), with no temporaries of the block's size.
            bits >>= np.uint64(11)
            np.multiply(bits, 2.0**-53, out=out)
            out *= self.high - self.low
            out += self.low
        else:
            unit = (bits >> np.uint64(11)).astype(np.float64) * (2.0**-53)
            out[...] = self.low + (self.high - self.low) * unit

    def _bounds(self, region: Region) -> tuple[tuple[int, int], ...]:
        region = tuple(region)
        if len(region) != len(self.shape):
            raise ShapeError(
                f"region {region!r} has {counted(len(region), 'dim')} but the tensor has shape {self.shape!r}"
            )
        out = []
        for d, (part, size) in enumerate(zip(region, self.shape)):
            if isinstance(part, slice):
                start, stop, step = part.indices(size)
                if step != 1:
                    raise ShapeError(f"region dim {d} slice {part!r} must have step 1")
            else:
                start, stop = _pair(part, d)
            if not 0 <= start <= stop <= size:
                raise ShapeError(f"region dim {d} range [{start}, {stop}) is outside size {size}")
            out.append((start, stop))
        return tuple(out)


_new = object.__new__


def bind_keep(func: Callable, args: tuple, kwargs: dict) -> Optional[Callable[[], None]]:
    """spmdsim.runtime.replay.kernel's `bind` for a dropout's keep mask, ``func(shape, seed, region, p,
    out=mask)`` (spmdsim.nn.ops' keep_mask: ``SeededTensor(shape, "float64", seed, 0, 1).at_least(region, p,
    mask)``, `seed` an int or a callable giving one): a function a replay calls in its place, or None.

    The block's counters `at_least` kept at the capture's draw (`_BASES`) and the threshold's edge, bound
    once: each replay reads the seed, checks it as `SeededTensor.with_seed` does, and makes the numpy calls
    of `at_least`'s kept plan into `mask` (the same calls, the same values). A seed that is not a Python int
    in [0, 2**63), or a dry run, calls `func` itself (its conversion, or its one-line error)."""
    if len(args) != 4 or set(kwargs) != {"out"}:
        return None
    shape, seed, region, threshold = args
    out = kwargs["out"]
    if type(shape) is not tuple or not _fixed(region) or type(threshold) not in (int, float) \
            or type(out) is not np.ndarray or out.dtype != bool or not out.flags.writeable:
        return None
    try:
        bounds = SeededTensor(shape, "float64", seed=0, low=0.0, high=1.0)._bounds(region)
    except SpmdsimError:
        return None
    base = _BASES.get((shape, bounds))
    first = math.ceil(threshold * 2.0**53) if threshold == threshold else None
    if base is None or first is None or not 0 < first <= (1 << 53) - 1 \
            or out.shape != tuple(b - a for a, b in bounds):
        return None
    edge = np.uint64(first << 11)  # as at_least's
    get, called = _KEYS.get, callable(seed)

    def keep() -> None:
        value = seed() if called else seed
        if type(value) is int and 0 <= value < _SEEDS and not _THREAD.context.dry_run:
            key = get(value)
            _greater_equal(_mix(_xor(base, _key(value) if key is None else key)), edge, out)
        else:
            func(*args, **kwargs)
    return keep


_SEEDS = 1 << 63  # seeds are in [0, 2**63)


def uniform_at_least(uniform: SeededTensor, seed: Any, region: Region, threshold: float,
                     out: np.ndarray | None = None) -> np.ndarray:
    """``uniform.with_seed(seed).at_least(region, threshold, out)`` for `uniform`, a float64 SeededTensor of [0, 1)
    (spmdsim.nn.ops' dropout draws: its dtype and range are not looked at again), without the tensor of `seed`:
    where a mask was drawn at this region object, shape and threshold before (`_PLANS`) and `seed` is a Python
    int in [0, 2**63) outside a dry run, `at_least`'s kept plan's numpy calls (the same values); else that call
    (its conversion, or its one-line error). Each step's dropout masks: no object made, no checks again."""
    plan = _PLANS.get(id(region))
    if (plan is not None and plan[0] is region and plan[1] == uniform.shape and plan[2] == threshold
            and type(seed) is int and 0 <= seed < _SEEDS and not _THREAD.context.dry_run):
        key = _KEYS.get(seed)
        bits = _xor(plan[4], _key(seed) if key is None else key)
        if out is None:
            out = _empty(plan[3], bool)
        _greater_equal(_mix(bits), plan[5], out)
        return out
    return uniform.with_seed(seed).at_least(region, threshold, out)


def _fixed(region: object) -> bool:
    """Whether nothing can change `region`: a tuple of slices of ints or None, or of pairs of ints."""
    if type(region) is not tuple:
        return False
    for part in region:
        if type(part) is slice:
            if not all(v is None or type(v) is int for v in (part.start, part.stop, part.step)):
                return False
        elif type(part) is not tuple or len(part) != 2 or not all(type(v) is int for v in part):
            return False
    return True


def _pair(part: object, d: int) -> tuple[int, int]:
    """A region dim given as (start, stop): two integers, never truncated floats."""
    items = None if isinstance(part, (str, bytes)) else tuple(part) if hasattr(part, "__iter__") else None
    pair = None if items is None or len(items) != 2 else tuple(as_int(v) for v in items)
    if pair is None or None in pair:
        raise ShapeError(f"region dim {d} {part!r} must be a slice or a (start, stop) pair of integers")
    return pair  # type: ignore[return-value]


#: Narrow floats' names (and their short spellings) a SeededTensor is not made in, by the name astype takes.
_NARROW = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16", "half": "float16"}


def _narrow_hint(dtype: object) -> str:
    """How to get a tensor of a narrow float `dtype` (its values drawn in float32, then rounded), or ""."""
    name = _NARROW.get(str(dtype).lower()) if isinstance(dtype, str) else None
    return (f": draw it in float32 and convert, DTensor.from_seeded(mesh, tl, xs).astype({name!r}); x.check(xs) "
            f"then allows {name}'s rounding") if name else ""


def _known_dtype(dtype: object) -> bool:
    try:
        np.dtype(dtype)
    except (TypeError, ValueError):
        return False
    return True
