"""Arrays placed at one fixed offset inside a memory page, for buffers MPI moves.

Why: MPICH copies large messages between processes with the kernel's
cross-memory attach, and on this project's AMD VM that copy depends on where
the receive buffer starts relative to the send buffer within their pages: 16
bytes apart (mod 32) costs 1.05-1.6x against 0 or 32 apart, 8 bytes apart 2-4x
(docs/explanation/performance.md, "Buffer placement"). Where the heap puts each array is
luck, so the same code ran 10-40% faster or slower from one launch to the next.

Every array spmdsim allocates for MPI, from 64 KiB up, starts `PAGE_OFFSET` =
16 bytes into a page: where glibc's own maps start (after its chunk header),
so 0 bytes from those too. Smaller arrays are plain ``np.empty``. From HUGE_MIN
(1 MiB) up the array also sits on 2 MiB transparent huge pages
(spmdsim.base.hugepool; a send buffer on them made the copies 1.7-2x faster);
``use_huge_pages(False)`` keeps every later array on the heap.

While a thread captures a step (spmdsim.runtime.replay), the arrays these
functions make are handed to the capture (``FRESH``): what is written into them
is recorded, and a replay zeroes or fills them again; `fresh` hands over an
array numpy just made. `as_array`, `contiguous` and `stacked` are numpy's
``asarray``, ``ascontiguousarray`` and ``array([...])`` for arrays a captured
step computes: a traced array stays traced, and a copy or conversion of it is
recorded (numpy's own would give a plain array the capture never sees).
"""
from __future__ import annotations

import ctypes
import math
import mmap
import sys
import threading
from typing import Any

import numpy as np

from . import hugepool as _hugepool
from .context import PROCESS
from .context import _THREAD
from .sizes import UnmappableError
from .tables import put

#: How many threads capture a step now (spmdsim.runtime.replay's count, this very list): while it is 0,
#: ``DTensor.local`` is every tensor's block itself. Hot paths test `CAPTURE` (this thread's) instead.
CAPTURING = [0]


class _Capture(threading.local):
    """`on`: 1 in a thread while it captures a step (spmdsim.runtime.replay sets it), 0 in every other
    thread. While it is 0, ``DTensor.local`` is every tensor's block itself in this thread, and a hot path
    may read ``x._local`` after one test (``x._local if not CAPTURE.on else x.local``) instead of calling the
    property's function per tensor: a rank (thread) that does not capture pays nothing for another's
    capture."""

    on = 0


#: This thread's capture flag (`_Capture`).
CAPTURE = _Capture()

__all__ = ["PAGE", "PAGE_OFFSET", "MIN_BYTES", "HUGE_MIN", "empty", "kept_empty", "full", "zeros", "ones",
           "page_offset", "placed_copy", "use_huge_pages", "lazy_zeros", "is_lazy", "owner", "owned_bytes", "owners_of",
           "LAZY_BYTES", "fresh", "as_array", "converted",
           "contiguous", "stacked", "into", "assign", "broadcast_zero"]

PAGE = mmap.PAGESIZE
PAGE_OFFSET = 16  # where glibc's own maps start (its chunk header); a multiple of every itemsize
MIN_BYTES = 64 << 10  # below this the 4 KiB of slack would cost more than it saves
# From here up a huge page holds at most 2x the array's bytes; smaller arrays would waste more.
HUGE_MIN = 1 << 20
_HUGE = _hugepool.enabled()


def use_huge_pages(on: bool) -> bool:
    """Whether arrays from HUGE_MIN up go on huge pages from now on (where the OS has them); returns it."""
    global _HUGE
    _HUGE = bool(on) and _hugepool.enabled()
    return _HUGE


_np_empty = np.empty
_ndarray = np.ndarray
_dtype = np.dtype
_uint8 = np.dtype(np.uint8)
# A fresh array's address: ctypes over its buffer takes ~0.15 us, ``ndarray.ctypes.data`` ~0.9.
_as_char, _address = ctypes.c_char.from_buffer, ctypes.addressof


#: Set by spmdsim.runtime.replay while a thread captures a step: the array each `empty` hands out goes
#: through it (a capture records what is written into new memory). None otherwise.
FRESH: Any = None


def empty(shape: Any, dtype: Any = float) -> np.ndarray:
    """Like ``np.empty`` (C order); from MIN_BYTES up the data starts PAGE_OFFSET bytes into a page."""
    out = kept_empty(shape, dtype)
    return out if FRESH is None or not CAPTURE.on else FRESH(out)


def kept_empty(shape: Any, dtype: Any = float) -> np.ndarray:
    """`empty` for a buffer kept across calls (a mesh's scratch), which a capture never sees as new."""
    try:  # a shape and builtin dtype asked before (each step's collectives ask for the same few): its sizes
        sized = _SIZED.get((shape, dtype))
    except TypeError:  # a shape given as a list
        sized = None
    if sized is None:
        sized = _sized(shape, dtype)
    dims, dtype, nbytes = sized
    if nbytes < MIN_BYTES:  # (and Python objects, -1: MPI never moves them as bytes)
        return _np_empty(dims, dtype)
    context = _THREAD.context  # current()'s, without its call
    if nbytes >= HUGE_MIN and _HUGE and context is PROCESS:  # the pool is not thread-safe: no simulated rank's
        mapped = _hugepool.empty_bytes(nbytes, PAGE_OFFSET)
        if mapped is not None:
            return _ndarray(dims, dtype, mapped)
    # A dry run's: zeros that cost no memory until written (`lazy_zeros`: a mapping of their own from MIN_BYTES,
    # as spmdsim.runtime.sim.dry's zeros, not numpy's calloc, which writes every page its heap served before), sized and
    # placed as a real run's.
    raw = lazy_zeros(nbytes + PAGE, _uint8, MIN_BYTES) if context.dry_run else _np_empty(nbytes + PAGE, _uint8)
    # One ndarray over the raw bytes at the offset: a third of slicing, viewing and reshaping.
    return _ndarray(dims, dtype, raw, (PAGE_OFFSET - _address(_as_char(raw))) % PAGE)


def _sized(shape: Any, dtype: Any) -> tuple:
    """`kept_empty`'s (dims, dtype, bytes; -1 for a dtype of Python objects) of `shape` and `dtype`, kept in
    `_SIZED` for a tuple of ints and a builtin numpy dtype (a pure function of the key)."""
    given = dtype
    if not isinstance(dtype, _dtype):
        dtype = np.dtype(dtype)
    dims = shape if type(shape) is tuple else (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    sized = (dims, dtype, -1 if dtype.hasobject else math.prod(dims) * dtype.itemsize)
    if type(shape) is tuple and all(type(n) is int for n in shape) and given is dtype and dtype.isbuiltin == 1 \
            and dtype.isnative:
        put(_SIZED, (shape, dtype), sized, 1024)
    return sized


_SIZED: dict = {}  # (shape, dtype) -> `_sized`'s answer, for tuples of ints and builtin native dtype objects


#: From this size up `lazy_zeros` gives an anonymous mapping of its own.
LAZY_BYTES = 1 << 20

#: A private mapping: a page only read is the kernel's one shared zero page (Python's default,
#: MAP_SHARED, backs even a read page with memory of its own: 8 MiB of RSS for summing 8 MiB of zeros).
#: Without swap reserved (Linux's MAP_NORESERVE, which Python's mmap does not name): the kernel's default
#: overcommit heuristic refuses one mapping larger than memory and swap, and a dry run's ZeRO bucket of a
#: 7.5B-parameter model is 56 GiB of pages never written.
_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
_PRIVATE = (mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _NORESERVE,) if hasattr(mmap, "MAP_ANONYMOUS") else ()  # flags


class _Lazy(mmap.mmap):
    """The mapping under a `lazy_zeros` array (its own type, so `is_lazy` can tell it from other maps)."""


def lazy_zeros(shape: Any, dtype: Any, at_least: int = LAZY_BYTES) -> np.ndarray:
    """Zeros whose pages cost no memory until written: a dry run's stand-in for any value.

    ``np.zeros`` is calloc, and glibc may serve a multi-MiB calloc from a heap
    it has used before and clear it, writing every page. A private anonymous
    mapping costs nothing where it is only read (its pages are the kernel's
    zero page), is filled page by page on first write, and is unmapped when
    the array is freed. Arrays below `at_least` bytes are numpy's own zeros (a mapping's page and system
    call cost more than such an array's memory, unless many are kept: a dry run's, spmdsim.runtime.sim.dry). A block
    beyond what this machine's address space has left raises spmdsim.base.sizes.UnmappableError naming it (one
    line: the modelled rank's need, not this machine's).
    """
    try:  # a shape and builtin dtype asked before (a dry run asks for the same few, ~100,000 times): its sizes
        sized = _SIZED.get((shape, dtype))
    except TypeError:  # a shape given as a list
        sized = None
    dims, dtype, nbytes = sized or _sized(shape, dtype)
    if nbytes < 0:  # Python objects: their pointers' bytes
        nbytes = math.prod(dims) * dtype.itemsize
    if at_least <= nbytes <= sys.maxsize:  # (more than sys.maxsize bytes: no address space holds them)
        try:
            return np.frombuffer(_Lazy(-1, nbytes, *_PRIVATE), dtype).reshape(dims)
        except OSError:  # out of mappings (vm.max_map_count) or address space: numpy's own
            pass
    try:
        if nbytes > sys.maxsize:
            raise MemoryError
        return np.zeros(dims, dtype)
    except MemoryError:  # beyond the address space: one line naming the block (numpy's names no caller)
        raise UnmappableError(dims, dtype, nbytes) from None


_ZEROS: dict = {}  # (shape, dtype) -> broadcast_zero's view


def broadcast_zero(shape: tuple, dtype: Any) -> np.ndarray:
    """A read-only zero of `dtype` broadcast to `shape` (no memory): an operand whose shape and dtype are all a
    kernel reads (a dry run's, spmdsim.runtime.sim.dry). One per (shape, dtype), made once: np.broadcast_to takes ~6 us,
    and a dry run asks for one before each product and each large elementwise result."""
    key = (shape, dtype)
    made = _ZEROS.get(key)
    if made is None:
        made = np.broadcast_to(np.zeros((), dtype), shape)
        put(_ZEROS, key, made, 4096)
    return made


def owner(a: np.ndarray) -> np.ndarray:
    """The array whose memory `a` views (itself when it owns it)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def owned_bytes(arrays: Any) -> int:
    """The bytes of these arrays' memory, each owner counted once (a view counts its owner's)."""
    return sum(owners_of(arrays).values())


def owners_of(arrays: Any) -> dict:
    """{id(owner): its bytes} of the memory these arrays view (`owner`: each owner once)."""
    owners: dict = {}
    for a in arrays:
        base = a.base  # `owner(a)`, inline: a memory look walks every parameter's blocks at each bucket
        while isinstance(base, np.ndarray):
            a = base
            base = a.base
        owners[id(a)] = a.nbytes
    return owners


def is_lazy(a: np.ndarray) -> bool:
    """Whether `a` views a `lazy_zeros` mapping (in a dry run: zeros unless written, which nothing large is)."""
    base = owner(a).base
    return isinstance(base.obj if isinstance(base, memoryview) else base, _Lazy)


def full(shape: Any, fill_value: Any, dtype: Any = float) -> np.ndarray:
    """Like ``np.full``, placed as `empty` places it. A dry run's large block (`empty` gives it lazy zeros) is not
    written: its values are no result (a fill touched every page: a ring's -inf running maxima took ~1 ms each)."""
    out = empty(shape, dtype)
    if not is_lazy(out):
        out.fill(fill_value)
    return out


def zeros(shape: Any, dtype: Any = float) -> np.ndarray:
    """Like ``np.zeros``, placed as `empty` places it."""
    return full(shape, 0, dtype)


def ones(shape: Any, dtype: Any = float) -> np.ndarray:
    """Like ``np.ones``, placed as `empty` places it."""
    return full(shape, 1, dtype)


def fresh(array: np.ndarray, fill: Any = None) -> np.ndarray:
    """`array`, memory the caller just made with numpy: while this thread captures a step, a traced view handed
    to the capture, with ``fill(fill)`` recorded when `fill` is given (each replay zeroes or fills it again);
    else `array` itself. ``fresh(np.zeros(shape, dtype), 0)`` is numpy's own allocation outside a capture."""
    if FRESH is None or not CAPTURE.on:
        return array
    out = FRESH(array)
    if fill is not None and out is not array:
        out.fill(fill)
    return out


def as_array(x: Any, dtype: Any = None) -> np.ndarray:
    """``np.asarray(x, dtype)``, but a subclass (a captured step's traced array) is kept and a conversion to
    `dtype` is its ``astype`` (recorded while capturing)."""
    x = np.asanyarray(x)
    return x if dtype is None or x.dtype == dtype else x.astype(dtype)


def converted(a: np.ndarray, dtype: Any) -> np.ndarray:
    """``a.astype(dtype)``, a new array, called as `a`'s method: a captured step's traced block records it
    (``np.ndarray.astype(a, dtype)`` would not, and a replay would read the capture's values)."""
    return a.astype(dtype)


def contiguous(x: Any) -> np.ndarray:
    """``np.ascontiguousarray(x)`` (C order, a 0-d array made 1-d), keeping a subclass; a copy is ``x.copy()``."""
    x = np.asanyarray(x)
    if not x.flags.c_contiguous:
        x = x.copy()
    return x if x.ndim else x.reshape(1)


def into(out: Any, values: np.ndarray) -> np.ndarray:
    """`values`, or, when `out` is an array (a kernel's out= on replay), `out` holding them."""
    if out is None:
        return values
    np.copyto(out, values)
    return out


def stacked(values: Any, dtype: Any) -> np.ndarray:
    """``np.array([v0, v1, ...], dtype)`` of numbers and 0-d arrays; recorded while capturing when one is traced."""
    return np.stack([np.asanyarray(v) for v in values], dtype=dtype, casting="unsafe")


def page_offset(array: np.ndarray) -> int:
    """Where `array`'s data starts within its memory page, in bytes."""
    return array.ctypes.data % PAGE


def assign(out: np.ndarray, values: Any) -> None:
    """``out[...] = values``, unless both view a dry run's lazy zeros: nothing to write, and the copy wrote every
    page (a collective's packing of a 1 GiB block: 1 GB of this machine's memory)."""
    if not (is_lazy(out) and isinstance(values, np.ndarray) and is_lazy(values)):
        out[...] = values


def placed_copy(array: Any) -> np.ndarray:
    """A C-contiguous copy of `array`, placed as `empty` places it."""
    array = np.asarray(array)
    out = empty(array.shape, array.dtype)
    if not (is_lazy(out) and is_lazy(array)):  # a dry run's zeros copied to its zeros: no page written
        out[...] = array
    return out
