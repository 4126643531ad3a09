"""Uneven shards (Layout cut "chunk" and "balanced"): the cutting rules, slices, plans at the bound.

The chunk rule is checked against torch.chunk's, written here from its documentation
(torch is not installed): "each chunk is a view of the input tensor ... the last chunk
will be smaller if the tensor size along the given dimension is not divisible by chunks",
chunks of ceil(size / chunks), and fewer chunks than asked where that division leaves
none; DTensor gives the ranks without a chunk an empty shard. A dim on several mesh axes
is checked against DTensor's own rule, written here from its source (torch 2.7-2.9,
torch/distributed/tensor: `Shard.local_shard_size_and_offset` in placement_types.py,
`compute_local_shape_and_global_offset` in _utils.py): the mesh dims cut it one after the
other, each torch.chunk-ing the piece the one before left (in mesh-dim order for plain
Shard placements; `_StridedShard`, or a later release's `shard_order`, names another).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from spmdsim import Layout
from spmdsim.errors import LayoutError, ShapeError
from spmdsim.programs.plan import emulate, plan_redistribution, shards_of
from spmdsim.programs.plan.steps import Allgather, Alltoall, Exchange, ReduceScatter
from spmdsim.programs.plan.uneven import check_fits
from spmdsim.programs.plan.volume import lower_bound, rank_boxes

CASES = 240


def torch_chunk(size: int, chunks: int) -> list[range]:
    """torch.chunk's pieces of range(size) (its documented rule), padded with empty ones to `chunks`."""
    if size == 0:
        return [range(0, 0)] * chunks
    step = -(-size // chunks)
    pieces = [range(start, min(start + step, size)) for start in range(0, size, step)]
    return pieces + [range(size, size)] * (chunks - len(pieces))


def dtensor_shard(size: int, num_chunks: int, rank: int) -> tuple[int, int]:
    """DTensor's `Shard.local_shard_size_and_offset`: (size, offset in the piece) of chunk `rank`."""
    if size % num_chunks == 0:
        return size // num_chunks, size // num_chunks * rank
    full = -(-size // num_chunks)
    start = full * rank
    if size < start:
        return 0, size
    return min(size, start + full) - start, start


def dtensor_bounds(size: int, mesh_shape: tuple, coords: tuple, mesh_dims: tuple) -> tuple[int, int]:
    """DTensor's [start, stop) of a dim of `size` sharded on `mesh_dims`, in that order, at mesh `coords`
    (`compute_local_shape_and_global_offset`: each mesh dim cuts the local piece again, offsets add up)."""
    local, offset = size, 0
    for m in mesh_dims:
        local, more = dtensor_shard(local, mesh_shape[m], coords[m])
        offset += more
    return offset, offset + local


def random_layout(rng: np.random.Generator, cut: str, ndim: int | None = None):
    """A random mesh of up to 3 axes (sizes 1-4, at most 12 devices) and a tensor map over it."""
    while True:
        sizes = tuple(int(n) for n in rng.integers(1, 5, size=int(rng.integers(1, 4))))
        if math.prod(sizes) <= 12:
            break
    layout = Layout(sizes, ("a", "b", "c")[:len(sizes)], cut)
    ndim = int(rng.integers(1, 4)) if ndim is None else ndim
    return layout, random_map(rng, layout, ndim)


def random_map(rng: np.random.Generator, layout: Layout, ndim: int):
    entries = [[] for _ in range(ndim)]
    for axis in rng.permutation(layout.alias_name):
        where = int(rng.integers(-1, ndim))
        if where >= 0:
            entries[where].append(str(axis))
    return layout(*(tuple(e) for e in entries))


def random_shape(rng: np.random.Generator, ndim: int) -> tuple[int, ...]:
    return tuple(int(n) for n in rng.integers(0, 14, size=ndim))


# -- the rules ------------------------------------------------------------------------------
def test_chunk_slices_agree_with_torch_chunk_and_dtensor_on_random_layouts():
    """One axis: torch.chunk's pieces. Several: DTensor's, axis after axis in tensor-map order (spmdsim cut
    such a dim once into the product of the axis sizes: 13 over (2, 4) gave rank 3 rows [6, 8), DTensor [6, 7))."""
    rng = np.random.default_rng(57)
    uneven = nested = 0
    for _ in range(CASES):
        layout, tl = random_layout(rng, "chunk")
        shape = random_shape(rng, tl.ndim)
        uneven += bool(tl.uneven_dims(shape))
        boxes = rank_boxes(tl, shape)
        for rank, bounds in tl.rank_slices(shape).items():
            coords = layout.coords(rank)
            for d, (lo, hi) in enumerate(bounds):
                axes = tl.tensor_map[d]
                if len([a for a in axes if layout.axis_size(a) > 1]) < 2:
                    piece = torch_chunk(shape[d], tl.num_shards(d))[layout.group_index(rank, axes)]
                    assert (lo, hi) == (piece.start, piece.stop), (tl, shape, rank, d)
                else:
                    nested += shape[d] % tl.num_shards(d) != 0
                assert (lo, hi) == dtensor_bounds(shape[d], layout.device_matrix, coords,
                                                  tuple(map(layout.axis_index, axes))), (tl, shape, rank, d)
            assert tl.local_shape(shape, rank) == tuple(hi - lo for lo, hi in bounds)
            assert boxes[rank] == bounds  # the planner's view of every rank's block
    assert uneven > CASES // 3  # many cases cut some dim unevenly
    assert nested > CASES // 4  # and many a dim over several axes


def test_dtensor_placements_cut_mesh_dim_by_mesh_dim():
    """5 rows on (Shard(0), Shard(0)) over 2 x 4: DTensor gives ranks rows [0], [1], [2], [], [3], [4], [], [];
    spmdsim gave [0], [1], [2], [3], [4], [], [], [] (one cut into 8). Then random placements on random meshes
    against DTensor's rule, every rank's bounds and the plan to replicated (every row arrives at the bound)."""
    from spmdsim.layouts.dialects import placements_to_layout
    from spmdsim.layouts.dialects.dtensor import Replicate, Shard

    tl = placements_to_layout((Shard(0), Shard(0)), (2, 4), 1, cut="chunk")
    assert [tl.bounds(r, (5,)) for r in range(8)] == [((0, 1),), ((1, 2),), ((2, 3),), ((3, 3),), ((3, 4),),
                                                      ((4, 5),), ((5, 5),), ((5, 5),)]
    assert tl.max_local_shape((5,)) == (1,)
    rng = np.random.default_rng(59)
    for _ in range(40):
        mesh_shape = tuple(int(n) for n in rng.integers(2, 4, size=int(rng.integers(2, 4))))
        ndim = int(rng.integers(1, 3))
        placements = tuple(Shard(int(rng.integers(0, ndim))) if rng.random() < 0.8 else Replicate()
                           for _ in mesh_shape)
        shape = tuple(int(n) for n in rng.integers(1, 12, size=ndim))
        tl = placements_to_layout(placements, mesh_shape, ndim, cut="chunk")
        for rank in range(tl.layout.num_devices):
            coords = tl.layout.coords(rank)
            want = tuple(dtensor_bounds(size, mesh_shape, coords,
                                        tuple(m for m, p in enumerate(placements) if p == Shard(d)))
                         for d, size in enumerate(shape))
            assert tl.bounds(rank, shape) == want, (placements, mesh_shape, shape, rank)
        whole = tl.layout(*([None] * ndim))
        plan = plan_redistribution(tl, whole, shape, "float32")
        assert plan.bytes_received == lower_bound(tl, whole, shape, 4), (placements, mesh_shape, shape)


def test_balanced_keeps_every_rank_busy_on_random_layouts():
    rng = np.random.default_rng(58)
    for _ in range(CASES):
        _, tl = random_layout(rng, "balanced")
        shape = random_shape(rng, tl.ndim)
        slices = tl.rank_slices(shape)
        for d, size in enumerate(shape):
            n = tl.num_shards(d)
            by_shard = {}
            for rank, bounds in slices.items():
                by_shard[tl.shard_index(rank)[d]] = bounds[d]
            pieces = [by_shard[i] for i in range(n)]
            lengths = [hi - lo for lo, hi in pieces]
            # Side by side over the whole dim; sizes differ by at most one, the longer ones first.
            assert [lo for lo, _ in pieces[1:]] == [hi for _, hi in pieces[:-1]] and pieces[0][0] == 0
            assert pieces[-1][1] == size
            assert lengths == sorted(lengths, reverse=True) and max(lengths) - min(lengths) <= 1
            assert lengths.count(size // n + 1) == size % n
            if size >= n:
                assert min(lengths) >= 1, (tl, shape, d)


def test_chunk_leaves_ranks_empty_where_balanced_does_not():
    chunk, balanced = (Layout((4,), ("x",), cut)("x") for cut in ("chunk", "balanced"))
    assert [b[0] for b in chunk.rank_slices((5,)).values()] == [(0, 2), (2, 4), (4, 5), (5, 5)]
    assert [b[0] for b in balanced.rank_slices((5,)).values()] == [(0, 2), (2, 3), (3, 4), (4, 5)]
    # A size that divides: every rule cuts alike.
    even = Layout((4,), ("x",))("x")
    for tl in (chunk, balanced):
        assert tl.rank_slices((8,)) == even.rank_slices((8,))
        assert tl.local_shape((8,)) == (2,)


def test_even_refuses_as_before_and_the_rules_are_named():
    tl = Layout((4,), ("x",))("x", None)
    with pytest.raises(ShapeError,
                       match=r"^tensor \(7, 3\): dim 0 of size 7 is not divisible by 4 shards over \('x',\)$"):
        tl.check_shape((7, 3))
    with pytest.raises(LayoutError, match=r"^cut 'ragged' must be one of \('even', 'chunk', 'balanced'\)$"):
        Layout((4,), ("x",), "ragged")
    uneven = Layout((4,), ("x",), "chunk")("x", None)
    with pytest.raises(ShapeError, match=r"^shards of tensor dim 0 of size 7 differ between ranks \(4 shards, "
                                         r"cut 'chunk'\); expected a rank to ask for its own shard's shape$"):
        uneven.local_shape((7, 3))
    assert [uneven.local_shape((7, 3), r) for r in range(4)] == [(2, 3), (2, 3), (2, 3), (1, 3)]
    assert uneven.max_local_shape((7, 3)) == (2, 3)


def test_layout_value_keeps_its_rule():
    even, chunk = Layout((2, 4), ("dp", "mp")), Layout((2, 4), ("dp", "mp"), "chunk")
    assert even != chunk and hash(even) != hash(chunk) and chunk.with_cut("even") == even
    assert repr(even) == "Layout(device_matrix=(2, 4), alias_name=('dp', 'mp'))"
    assert eval(repr(chunk)) == chunk and str(chunk) == "Layout(dp=2, mp=4, cut=chunk)"
    assert chunk("mp", None).with_partial("dp").layout.cut == "chunk"


# -- redistribution ---------------------------------------------------------------------------
def _independent_bound(source, target, shape, itemsize) -> tuple[int, ...]:
    """Per rank, the elements of its target block that its source block lacks, by marking them."""
    out = []
    for rank in range(source.layout.num_devices):
        held = np.zeros(shape, dtype=bool)
        held[source.slices(rank, shape)] = True
        out.append(int((~held[target.slices(rank, shape)]).sum()) * itemsize)
    return tuple(out)


def test_random_redistributions_agree_with_numpy_at_the_lower_bound():
    rng = np.random.default_rng(59)
    kinds: dict[str, int] = {}
    for case in range(CASES):
        cut = ("chunk", "balanced")[case % 2]
        layout, source = random_layout(rng, cut)
        target = random_map(rng, layout, source.ndim)
        shape = random_shape(rng, source.ndim)
        full = np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
        plan = plan_redistribution(source, target, shape, "float64")
        got = emulate(plan, shards_of(source, full))
        for rank, block in got.items():
            np.testing.assert_array_equal(block, full[target.slices(rank, shape)])
        bound = _independent_bound(source, target, shape, 8)
        assert lower_bound(source, target, shape, 8) == bound
        assert plan.bytes_received == bound, (source, target, shape, [str(s) for s in plan.steps])
        for step in plan.steps:
            kinds[type(step).__name__] = kinds.get(type(step).__name__, 0) + 1
    # Collectives with counts serve many uneven moves, the exchange the rest.
    assert kinds.get("Allgather", 0) > 10 and kinds.get("Alltoall", 0) > 10 and kinds.get("Exchange", 0) > 10


def test_partial_sources_on_uneven_shards_resolve_to_numpy():
    from spmdsim.programs.plan import partial_addends

    rng = np.random.default_rng(60)
    for case in range(60):
        layout = Layout((2, 3), ("a", "b"), ("chunk", "balanced")[case % 2])
        source = layout(None, None, partial="b") if case % 3 else layout("a", None, partial="b")
        target = random_map(rng, layout, 2)
        shape = random_shape(rng, 2)
        full = np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
        plan = plan_redistribution(source, target, shape, "float64")
        got = emulate(plan, partial_addends(source, full, seed=case))
        for rank, block in got.items():
            np.testing.assert_array_equal(block, full[target.slices(rank, shape)])


def test_collectives_with_counts_fit_only_where_pieces_nest():
    layout = Layout((2, 2), ("a", "b"), "balanced")
    # 10 rows: over a, [0, 5) and [5, 10); over a then b, [0, 3), [3, 6), [6, 8), [8, 10): they do not nest.
    gather = Allgather(layout(("a", "b"), None), layout("a", None), ("b",), tensor_dim=0)
    with pytest.raises(ShapeError, match="do not make up the gathered block"):
        check_fits(gather, (10, 2))
    check_fits(gather, (7, 2))  # [0, 4) = [0, 2) + [2, 4); [4, 7) = [4, 6) + [6, 7)
    plan = plan_redistribution(layout(("a", "b"), None), layout("a", None), (10, 2), "float32")
    assert [type(s) for s in plan.steps] == [Exchange]
    plan = plan_redistribution(layout(("a", "b"), None), layout("a", None), (7, 2), "float32")
    assert [type(s) for s in plan.steps] == [Allgather]
    assert plan.bytes_received == (16, 16, 8, 16)  # the partner's 2 rows (1 row) of 2 float32
    scatter = ReduceScatter(layout(None, None, partial="b"), layout("b", None), ("b",), tensor_dim=0)
    assert scatter.sized((5, 2), 4).bytes_received == (24, 16, 24, 16)  # (g-1) x its own piece
    swap = Alltoall(layout("b", None), layout(None, "b"), ("b",), split_dim=1, concat_dim=0)
    # Rank 0: rows [0, 3) to columns [0, 2) of 5 rows: 4 new elements; rank 1: rows [3, 5) to column 2: 3.
    assert swap.sized((5, 3), 4).bytes_received == (16, 12, 16, 12)


def test_chunk_plans_across_meshes_keep_each_mesh_cut():
    """Under the chunk rule a dim on several axes is cut axis by axis, so a mesh axis refined into several (the
    planner's common device matrix of (2, 4) and (8,)) would cut it otherwise: 5 rows over (8,) are 1, 1, 1, 1,
    1, 0, 0, 0, over the refined (2, 2, 2) 1, 1, 1, 0, 1, 1, 0, 0. The planner keeps a refinement only where
    every rank's block stays (else it exchanges boxes); the plans move the right rows at the bound."""
    for first, second in [((2, 4), (8,)), ((8,), (2, 4)), ((2, 4), (4, 2))]:
        a = Layout(first, ("a", "b")[:len(first)], "chunk")
        b = Layout(second, ("x", "y")[:len(second)], "chunk")
        for rows in (5, 6, 8):
            shape = (rows, 2)
            full = np.arange(rows * 2.0).reshape(shape)
            source = a(a.alias_name, None)
            for target in (b(b.alias_name, None), b(None, b.alias_name)):
                plan = plan_redistribution(source, target, shape, "float64")
                got, want = emulate(plan, shards_of(source, full)), shards_of(target, full)
                assert all(np.array_equal(got[r], want[r]) for r in want), (source, target, shape)
                assert plan.bytes_received == lower_bound(source, target, shape, 8), (source, target, shape)
