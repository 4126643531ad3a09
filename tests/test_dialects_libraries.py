"""The JAX and DTensor dialects give the blocks the libraries themselves give.

Every expected block below is what the library returned, copied by hand (neither library is imported):
jax 0.10.2 (CPU, XLA_FLAGS=--xla_force_host_platform_device_count=64),
``NamedSharding(Mesh(np.array(jax.devices()[:n]).reshape(shape), names), P(*spec)).devices_indices_map(gshape)``,
each device's slices as (start, stop); torch 2.13.0+cpu,
``torch.distributed.tensor._utils._compute_local_shape_and_global_offset(gshape, mesh_shape, coordinate,
placements)`` (what ``compute_local_shape_and_global_offset`` calls with the rank's mesh coordinate), each rank's
(offset, offset + local size) per dim. Rank r is JAX's device r and DTensor's rank r (row-major coordinates).
"""
from __future__ import annotations

import pytest

from spmdsim import DialectError, Layout
from spmdsim.errors import SpmdsimError
from spmdsim.layouts.dialects import partition_spec_to_layout, placements_to_layout


def _bounds(tl, shape) -> list:
    return [tl.bounds(rank, shape) for rank in range(tl.layout.num_devices)]


def _refusal(func, *args, **kwargs) -> str:
    with pytest.raises(SpmdsimError) as info:
        func(*args, **kwargs)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_tuple_entry_lists_its_axes_major_first_as_jax_does():
    """jax 0.10.2: mesh (2, 3, 2) named a, b, c; P(("c", "a"), "b"); shape (8, 6)."""
    jax_gives = [((0, 2), (0, 2)), ((4, 6), (0, 2)), ((0, 2), (2, 4)), ((4, 6), (2, 4)), ((0, 2), (4, 6)),
                 ((4, 6), (4, 6)), ((2, 4), (0, 2)), ((6, 8), (0, 2)), ((2, 4), (2, 4)), ((6, 8), (2, 4)),
                 ((2, 4), (4, 6)), ((6, 8), (4, 6))]
    tl = partition_spec_to_layout((("c", "a"), "b"), (2, 3, 2), 2, ("a", "b", "c"))
    assert _bounds(tl, (8, 6)) == jax_gives


def test_a_short_spec_leaves_the_trailing_dims_whole_as_jax_does():
    """jax 0.10.2: mesh (2, 2) named a, b; P("b"); shape (4, 3)."""
    jax_gives = [((0, 2), (0, 3)), ((2, 4), (0, 3)), ((0, 2), (0, 3)), ((2, 4), (0, 3))]
    assert _bounds(partition_spec_to_layout(("b",), (2, 2), 2, ("a", "b")), (4, 3)) == jax_gives


def test_what_jax_refuses_is_refused_in_one_line():
    """jax 0.10.2: P("a") over 4 devices for shape (5,) raises IndivisibleError (devices_indices_map, device_put,
    jit); P("a", "a") raises DuplicateSpecError; P(None, None) for shape (4,) makes device_put and jit raise
    ValueError ("incompatible with its sharding annotation")."""
    assert "dim 0 of size 5 is not divisible by 4 shards" in _refusal(
        lambda: partition_spec_to_layout(("a",), (4,), 1, ("a",)).check_shape((5,)))
    assert "uses mesh axis 'a' more than once" in _refusal(partition_spec_to_layout, ("a", "a"), (4,), 2, ("a",))
    assert "has 2 entries but the tensor has 1 dim" in _refusal(partition_spec_to_layout, (None, None), (4,), 1)


def test_shard_on_two_mesh_dims_cuts_as_dtensor_does():
    """torch 2.13.0+cpu: mesh (2, 3), (Shard(0), Shard(0)), shape (7,); rank 2's empty shard (offset 7 there)
    is rows [4:4] here: where its piece lies (docs/reference/dialects.md)."""
    torch_gives = [(0, 2), (2, 4), None, (4, 5), (5, 6), (6, 7)]
    got = _bounds(placements_to_layout("S(0), S(0)", (2, 3), 1, cut="chunk"), (7,))
    assert [b[0] if b[0][0] < b[0][1] else None for b in got] == torch_gives
    assert got[2] == ((4, 4),)


def test_partial_and_a_negative_shard_dim_cut_as_dtensor_does():
    """torch 2.13.0+cpu: mesh (2, 2, 2), (Shard(1), Partial(), Shard(-2)) (distribute_tensor normalizes -2 to 0),
    shape (5, 3)."""
    torch_gives = [((0, 3), (0, 2)), ((3, 5), (0, 2)), ((0, 3), (0, 2)), ((3, 5), (0, 2)), ((0, 3), (2, 3)),
                   ((3, 5), (2, 3)), ((0, 3), (2, 3)), ((3, 5), (2, 3))]
    tl = placements_to_layout("(Shard(dim=1), Partial(sum), Shard(dim=-2))", (2, 2, 2), 2, cut="chunk")
    assert _bounds(tl, (5, 3)) == torch_gives and tl.partial == ("axis_1",)


def test_strided_shard_is_the_later_axis_first_where_the_size_divides():
    """torch 2.13.0+cpu: mesh (2, 4), (_StridedShard(0, split_factor=4), Shard(0)), shape (8,); and mesh (3, 2),
    (_StridedShard(0, split_factor=2), Shard(0)), shape (7,), where it differs from the map on ranks 4 and 5."""
    torch_gives = [((0, 1),), ((2, 3),), ((4, 5),), ((6, 7),), ((1, 2),), ((3, 4),), ((5, 6),), ((7, 8),)]
    assert _bounds(Layout((2, 4), ("axis_0", "axis_1"))(("axis_1", "axis_0")), (8,)) == torch_gives
    uneven = [((0, 2),), ((4, 5),), ((2, 4),), ((5, 6),), ((6, 7),), ((7, 7),)]
    ours = _bounds(Layout((3, 2), ("axis_0", "axis_1"), cut="chunk")(("axis_1", "axis_0")), (7,))
    assert ours[:4] == uneven[:4] and ours[4:] == [((4, 4),), ((6, 7),)]


def test_strided_shard_refusal_says_where_the_map_gives_its_blocks():
    """The tensor map the refusal offers gives _StridedShard's blocks only where the size divides (above)."""
    with pytest.raises(DialectError) as info:
        placements_to_layout("_S(0, 4), S(0)", (2, 4), 1)
    assert "the same blocks where the dim's size divides by its shards" in str(info.value)
