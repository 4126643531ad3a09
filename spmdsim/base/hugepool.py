"""Arrays on 2 MiB transparent huge pages, from a small pool of anonymous maps; stdlib and numpy only.

Why: MPICH's cross-memory copy between two processes pins the *sender's* pages
for every copy; a send buffer on huge pages made it 1.7-2x faster, and a fresh
8 MiB array filled in 0.35 ms instead of 2-5 ms (scripts/bench_hugepages.py;
docs/explanation/performance.md, "Huge pages"). numpy advises arrays from 4 MiB to be huge,
but whether the kernel honours that depends on the heap's history, so it
differed by rank and launch.

`empty_bytes(n)` maps fresh memory aligned to 2 MiB, advised huge where the
array covers at least half of a 2 MiB stretch (so at most 1 MiB over its bytes
per array). When the array's last view dies its map goes back to a pool (up to
POOL_BYTES, sizes freed longest ago leave first) for the next array of the same
map size, without page faults. Where the OS has no MADV_HUGEPAGE, `enabled()`
is False and callers use the heap.
"""
from __future__ import annotations

import mmap
import weakref
from typing import Any

import numpy as np

HUGE_PAGE = 2 << 20  # x86-64 and arm64 (4 KiB base pages) transparent huge page size
POOL_BYTES = 64 << 20  # freed maps kept for reuse, per process (as _malloc keeps 64 MiB of heap)

_ADVICE_HUGE = getattr(mmap, "MADV_HUGEPAGE", None)
_ADVICE_SMALL = getattr(mmap, "MADV_NOHUGEPAGE", None)
_FLAGS = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
_uint8 = np.dtype(np.uint8)
_frombuffer = np.frombuffer

# (map size, huge part) -> freed (map, aligned start); _held: id(weakref) -> (weakref, key, map, start)
_pool: dict[tuple[int, int], list[tuple[mmap.mmap, int]]] = {}
_held: dict[int, tuple[Any, tuple[int, int], mmap.mmap, int]] = {}


def enabled() -> bool:
    """Whether huge-page arrays can be had: the OS can advise 2 MiB huge pages."""
    return _ADVICE_HUGE is not None and _FLAGS != 0 and _kernel_huge_page() == HUGE_PAGE


def _kernel_huge_page() -> int:
    # Kernels with 16 or 64 KiB base pages (some arm64) have 32 or 512 MiB huge
    # pages: aligning every array to those would waste too much, so they keep the heap.
    try:
        with open("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size") as f:
            return int(f.read())
    except (OSError, ValueError):
        return HUGE_PAGE


def pooled_bytes() -> int:
    """Bytes of freed maps waiting in the pool (a few dozen at most: summed when asked)."""
    return sum(size * len(maps) for (size, _), maps in _pool.items())


def _layout(nbytes: int, offset: int) -> tuple[int, int]:
    """(bytes to map, bytes of it advised huge) for an array of `nbytes` at `offset`.

    A stretch is huge where the data covers at least half of it: 2 MiB + 16 bytes hold 2 MiB + 4 KiB, not 4 MiB.
    """
    used = offset + nbytes
    size = -(-used // HUGE_PAGE) * HUGE_PAGE
    return size, (used + HUGE_PAGE // 2) // HUGE_PAGE * HUGE_PAGE


def _new_map(size: int, huge: int) -> tuple[mmap.mmap, int]:
    """A fresh anonymous map with a 2 MiB-aligned stretch of `size` bytes; (map, where it starts).

    One huge page more than needed leaves room to align; never touched, it costs address space only.
    """
    m = mmap.mmap(-1, size + HUGE_PAGE, flags=_FLAGS)
    start = (-_frombuffer(m, _uint8, count=1).ctypes.data) % HUGE_PAGE
    if huge:
        m.madvise(_ADVICE_HUGE, start, huge)
    if huge < size and _ADVICE_SMALL is not None:
        m.madvise(_ADVICE_SMALL, start + huge, size - huge)
    return m, start


def empty_bytes(nbytes: int, offset: int) -> np.ndarray | None:
    """A writeable uint8 array of `nbytes` starting `offset` bytes into a 2 MiB huge page.

    None when the OS refuses a new map (e.g. vm.max_map_count, with tens of thousands of arrays alive).
    """
    key = _layout(nbytes, offset)
    free = _pool.get(key)
    if free:
        m, start = free.pop()
        if not free:
            _pool.pop(key, None)
    else:
        try:
            m, start = _new_map(*key)
        except (OSError, ValueError):
            return None
    holder = _frombuffer(m, _uint8)
    # Every view of the result has `holder` as its base (numpy stops collapsing bases at an array that
    # views a non-array), so the weakref fires when the last view dies and the map can serve again.
    ref = weakref.ref(holder, _release)
    _held[id(ref)] = (ref, key, m, start)
    return holder[start + offset:start + offset + nbytes]


def _release(ref: Any) -> None:
    # Called while the holder is being freed: nothing can reach its memory any more.
    try:
        _, key, m, start = _held.pop(id(ref))
    except (KeyError, AttributeError, TypeError):  # interpreter shutdown cleared the module
        return
    size = key[0]
    if size > POOL_BYTES:
        return  # dropping the last reference unmaps it once the holder's export is released
    # Room for the newest: the sizes freed longest ago go first (a loop reuses
    # the sizes it just freed; an earlier phase's sizes may never come back).
    while pooled_bytes() + size > POOL_BYTES:
        oldest = next(iter(_pool))
        maps = _pool[oldest]
        maps.pop(0)
        if not maps:
            del _pool[oldest]
    maps = _pool.pop(key, [])
    maps.append((m, start))
    _pool[key] = maps  # re-inserted: the dict's order is the order sizes were last freed
