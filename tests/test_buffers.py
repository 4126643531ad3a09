"""spmdsim.base.buffers: arrays MPI moves start PAGE_OFFSET bytes into a page; pure, no MPI."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from spmdsim import SeededTensor
from spmdsim.base import buffers
from spmdsim.base.buffers import MIN_BYTES, PAGE, PAGE_OFFSET, page_offset
from spmdsim.base.sizes import UnmappableError, format_size
from spmdsim.nn.ops._common import local_matmul
from spmdsim.nn.ops.embedding import pad_vocab_shard, vocab_parallel_lookup


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "complex128", "uint8", "float16"])
@pytest.mark.parametrize("shape", [(MIN_BYTES,), (256, 1024), (3, 129, 257), 40000])
def test_large_arrays_start_at_the_page_offset(dtype, shape):
    a = buffers.empty(shape, dtype)
    want = (shape,) if isinstance(shape, int) else shape
    assert a.shape == want and a.dtype == np.dtype(dtype) and a.flags.c_contiguous and a.flags.writeable
    if a.nbytes >= MIN_BYTES:
        assert page_offset(a) == PAGE_OFFSET
    a[...] = 7  # the whole array is writable memory of its own
    assert (a == 7).all()


def test_placed_arrays_are_0_bytes_apart_from_each_other_and_from_glibc_maps():
    # 16 bytes into a page is where glibc puts an array it maps on its own (after
    # its 16-byte chunk header): placed arrays share that offset with those too.
    assert PAGE_OFFSET == 16 and PAGE % PAGE_OFFSET == 0
    a, b = buffers.empty(1 << 20, np.float32), buffers.empty(1 << 20, np.complex128)
    assert (a.ctypes.data - b.ctypes.data) % PAGE == 0
    assert not np.shares_memory(a, b)


def test_small_arrays_are_plain_numpy_arrays():
    a = buffers.empty((4, 4), np.float64)
    assert a.flags.owndata and a.shape == (4, 4)
    assert buffers.empty((), np.float32).shape == ()
    assert buffers.empty((0, 100000), np.float32).size == 0
    assert buffers.empty(np.int64(3), np.int32).shape == (3,)
    assert buffers.empty(MIN_BYTES, object).dtype == object  # never a byte view of objects


def test_zeros_and_placed_copy():
    z = buffers.zeros((300, 300), np.float32)
    assert page_offset(z) == PAGE_OFFSET and not z.any()
    f = buffers.full((300, 300), 1.5, np.float32)
    assert page_offset(f) == PAGE_OFFSET and f.dtype == np.float32 and (f == 1.5).all()
    src = np.arange(600 * 400, dtype=np.float64).reshape(600, 400)[:, ::2]  # not contiguous
    c = buffers.placed_copy(src)
    assert c.flags.c_contiguous and page_offset(c) == PAGE_OFFSET
    assert np.array_equal(c, src) and not np.shares_memory(c, src)
    assert np.array_equal(buffers.placed_copy([[1, 2], [3, 4]]), [[1, 2], [3, 4]])


def test_generated_shards_and_local_products_are_placed():
    region = SeededTensor((512, 512), "float32", seed=3).region((slice(0, 256), slice(None)))
    assert page_offset(region) == PAGE_OFFSET
    rng = np.random.default_rng(0)
    a, b = rng.random((2, 1, 200, 100)), rng.random((3, 100, 300))
    got = local_matmul(a, b)
    assert got.shape == (2, 3, 200, 300) and page_offset(got) == PAGE_OFFSET
    np.testing.assert_allclose(got, np.matmul(a, b))
    ints = local_matmul(np.ones((2, 3), np.int32), np.ones((3, 4), np.int64))
    assert ints.dtype == np.int64 and (ints == 3).all()


def test_vocab_lookup_is_placed_and_pads_unowned_ids():
    shard = np.arange(40 * 600, dtype=np.float32).reshape(40, 600)
    padded = pad_vocab_shard(shard)
    ids = np.array([[0, 39, 40, 100], [5, 80, 41, 7]] * 8)  # rows 40.. belong to another rank
    got = vocab_parallel_lookup(ids, padded, 0)
    want = np.where((ids < 40)[..., None], shard[np.minimum(ids, 39)], 0)
    assert np.array_equal(got, want) and page_offset(got) == PAGE_OFFSET


def test_add_bias_works_in_place_only_when_the_sum_keeps_shape_and_dtype():
    from spmdsim.nn.ops._common import add_bias

    owned = np.arange(12, dtype=np.float32).reshape(3, 4)
    got = add_bias(owned, np.ones(4, np.float32))
    assert got is owned and np.array_equal(got, np.arange(12).reshape(3, 4) + 1)
    wider = add_bias(np.zeros((3, 4), np.float32), np.full(4, 0.5, np.float64))  # would lose precision
    assert wider.dtype == np.float64 and (wider == 0.5).all()
    grown = add_bias(np.zeros((1, 4), np.float32), np.ones((3, 4), np.float32))  # would not fit
    assert grown.shape == (3, 4) and (grown == 1).all()
    frozen = np.zeros((2, 2), np.float32)
    frozen.flags.writeable = False
    assert (add_bias(frozen, np.ones(2, np.float32)) == 1).all() and not frozen.any()


@pytest.mark.parametrize("shape", [(1 << 55,), (1 << 62, 4)])
def test_a_block_beyond_the_address_space_is_refused_in_one_line_naming_it(shape):
    """A dry run's block no address space holds (256 PiB, beyond even 57-bit addresses; 128 EiB, more than numpy
    can index) is one
    UnmappableError naming its shape and bytes: numpy's own was a MemoryError (or an OverflowError) that named
    no block."""
    with pytest.raises(UnmappableError, match=re.escape(f"the dry run cannot map a block of shape {shape} float64 "
                                                        f"({format_size(8 * math.prod(shape))}): more than this "
                                                        "machine's address space has left")) as caught:
        buffers.lazy_zeros(shape, np.float64)
    assert caught.value.shape == shape and caught.value.nbytes == 8 * math.prod(shape)
