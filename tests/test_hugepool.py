"""spmdsim.base.hugepool: arrays from 1 MiB sit on advised 2 MiB pages, from a pool of maps; pure, no MPI."""
from __future__ import annotations

import gc
import os
import subprocess
import sys

import numpy as np
import pytest

from spmdsim.base import hugepool as _hugepool, buffers
from spmdsim.base.hugepool import HUGE_PAGE, POOL_BYTES
from spmdsim.base.buffers import HUGE_MIN, PAGE_OFFSET, page_offset

needs_pool = pytest.mark.skipif(not _hugepool.enabled(), reason="no MADV_HUGEPAGE on this OS")
MiB = 1 << 20


@pytest.fixture(scope="module", autouse=True)
def _frozen_heap():
    """Collect once what the earlier tests in this process left, then freeze the survivors, so each
    gc.collect() below walks only this module's objects (a full collection walked the whole worker's
    heap, ~0.4 s a test late in a run); unfrozen after the last test here."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def _empty_pool(_frozen_heap):
    """Start each test with an empty pool: earlier tests in this process may have filled it."""
    gc.collect()
    _hugepool._pool.clear()


@pytest.mark.parametrize("nbytes, want", [
    (MiB, (2 * MiB, 2 * MiB)),                    # half a stretch or more: huge
    (2 * MiB, (4 * MiB, 2 * MiB)),                # the 16 bytes past 2 MiB stay on 4 KiB pages
    (2 * MiB + MiB // 2, (4 * MiB, 2 * MiB)),     # 0.5 MiB into the second stretch: 4 KiB pages
    (3 * MiB, (4 * MiB, 4 * MiB)),
    (8 * MiB - 16, (8 * MiB, 8 * MiB)),
])
def test_layout_maps_every_touched_stretch_and_advises_the_half_covered_ones(nbytes, want):
    assert _hugepool._layout(nbytes, PAGE_OFFSET) == want


@needs_pool
@pytest.mark.parametrize("dtype", ["float32", "complex128", "int8"])
def test_large_buffers_come_from_the_pool_at_the_page_offset(dtype):
    a = buffers.empty((1024, 1024), dtype)
    assert a.nbytes >= HUGE_MIN and a.shape == (1024, 1024) and a.dtype == np.dtype(dtype)
    assert a.flags.c_contiguous and a.flags.writeable
    assert page_offset(a) == PAGE_OFFSET and a.ctypes.data % HUGE_PAGE == PAGE_OFFSET
    a[...] = 3
    assert (a == 3).all()


@needs_pool
def test_a_freed_map_serves_the_next_array_of_its_size_and_views_keep_it_alive():
    gc.collect()
    a = buffers.empty(3 * MiB // 8, np.float64)
    addr = a.ctypes.data
    view = a[10:20]
    view[...] = 5
    del a
    b = buffers.empty(3 * MiB // 8, np.float64)
    assert b.ctypes.data != addr  # the view still holds the first map
    assert (view == 5).all()
    b[...] = 1
    assert (view == 5).all()  # and the two never share memory
    before = _hugepool.pooled_bytes()
    del view
    assert _hugepool.pooled_bytes() == before + 4 * MiB  # back in the pool
    c = buffers.empty(3 * MiB, np.uint8)
    assert c.ctypes.data == addr and _hugepool.pooled_bytes() == before
    del b, c


@needs_pool
def test_the_pool_keeps_at_most_pool_bytes():
    gc.collect()
    arrays = [buffers.empty(4 * MiB - 64, np.uint8) for _ in range(POOL_BYTES // (4 * MiB) + 3)]
    del arrays
    assert 0 < _hugepool.pooled_bytes() <= POOL_BYTES
    big = buffers.empty(POOL_BYTES, np.uint8)  # a map larger than the pool is unmapped when freed
    before = _hugepool.pooled_bytes()
    del big
    assert _hugepool.pooled_bytes() == before


@needs_pool
def test_a_full_pool_makes_room_for_the_size_freed_last():
    gc.collect()
    olds = [buffers.empty(6 * MiB, np.uint8) for _ in range(POOL_BYTES // (8 * MiB))]
    del olds  # the pool now holds mostly 8 MiB maps
    new = buffers.empty(10 * MiB, np.uint8)
    addr = new.ctypes.data
    del new  # evicts the oldest maps to make room
    assert _hugepool.pooled_bytes() <= POOL_BYTES
    again = buffers.empty(10 * MiB, np.uint8)
    assert again.ctypes.data == addr


def test_small_arrays_stay_on_the_heap():
    a = buffers.empty(HUGE_MIN - 8, np.uint8)
    assert page_offset(a) == PAGE_OFFSET and a.base.flags.owndata  # a view of a heap array


@needs_pool
@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux only")
def test_the_kernel_sees_the_array_as_huge_page_eligible():
    mode = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    if "[never]" in mode:
        pytest.skip("transparent huge pages are off on this machine")
    a = buffers.empty(4 * MiB, np.uint8)
    addr = a.ctypes.data
    eligible = None
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "THPeligible:":
                eligible = line.split()[1]
    if eligible is None:
        pytest.skip("this kernel's smaps has no THPeligible field")
    assert eligible == "1"


def test_use_huge_pages_false_turns_the_pool_off():
    code = ("import numpy as np; from spmdsim.base import buffers; "
            "on = buffers.use_huge_pages(False); a = buffers.empty(4 << 20, np.uint8); "
            "print(on, isinstance(a.base, np.ndarray) and a.base.flags.owndata)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


@needs_pool
def test_a_refused_map_falls_back_to_the_heap(monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")
    monkeypatch.setattr(_hugepool, "_new_map", refuse)
    a = buffers.empty(5 * MiB + 3, np.uint8)  # a size no pooled map has
    assert a.shape == (5 * MiB + 3,) and page_offset(a) == PAGE_OFFSET and a.base.flags.owndata
    a[...] = 1
    assert a.sum() == a.size
