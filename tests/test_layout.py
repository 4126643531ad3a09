"""Layout algebra: docs/explanation/semantics.md worked examples, tiling property, queries, errors."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spmdsim import Layout, LayoutError, ShapeError, SpmdsimError, TensorLayout


def _first_value_per_rank(layout: Layout, tensor_map, shape) -> list[int]:
    """With an arange tensor whose every shard is one element: the value each rank holds."""
    tl = layout(*tensor_map)
    data = np.arange(math.prod(shape)).reshape(shape)
    out = []
    for rank in range(layout.num_devices):
        block = data[tl.slices(rank, shape)]
        assert block.size == 1
        out.append(int(block.ravel()[0]))
    return out


@pytest.mark.parametrize(
    "matrix, tensor_map, shape, expected",
    [
        ((2, 1, 2, 2, 1), "bdeca", (1, 2, 1, 2, 2), [0, 4, 2, 6, 1, 5, 3, 7]),
        ((4, 1, 1, 2, 1), "bdea", (1, 2, 1, 4), [0, 4, 1, 5, 2, 6, 3, 7]),
        ((2, 1, 2, 2, 1), "beca", (1, 1, 2, 2), [0, 0, 2, 2, 1, 1, 3, 3]),
    ],
)
def test_seed_shard_numbering(matrix, tensor_map, shape, expected):
    layout = Layout(matrix, ("a", "b", "c", "d", "e"))
    assert _first_value_per_rank(layout, tuple(tensor_map), shape) == expected


def test_seed_two_axis_example_rank_holds_its_number():
    layout = Layout((2, 4), ("axis_0", "axis_1"))
    assert _first_value_per_rank(layout, ("axis_0", "axis_1"), (2, 4)) == list(range(8))


def test_multi_axis_first_listed_is_major():
    layout = Layout((2, 2, 2), ("dp", "sp", "mp"))
    x = layout("mp", ("sp", "dp"))
    shape = (32, 784)
    assert x.slices(layout.rank_of((0, 1, 0)), shape) == (slice(0, 16), slice(392, 588))
    assert x.slices(layout.rank_of((1, 0, 0)), shape) == (slice(0, 16), slice(196, 392))
    # Reversing the tuple swaps which axis is major.
    y = layout("mp", ("dp", "sp"))
    assert y.slices(layout.rank_of((1, 0, 0)), shape) == (slice(0, 16), slice(392, 588))


def test_rank_coords_row_major_last_axis_fastest():
    layout = Layout((2, 3, 4), ("a", "b", "c"))
    assert layout.strides == (12, 4, 1)
    for rank in range(24):
        assert layout.rank_of(layout.coords(rank)) == rank
    assert layout.coords(7) == (0, 1, 3)
    assert layout.coords(13) == (1, 0, 1)


def test_axis_groups_mixed_radix_order():
    layout = Layout((2, 2, 2), ("dp", "sp", "mp"))
    assert layout.axis_groups(("mp",)) == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert layout.axis_groups(("dp",)) == ((0, 4), (1, 5), (2, 6), (3, 7))
    # First listed axis is major: sp changes slowest within the group.
    assert layout.axis_groups(("sp", "dp")) == ((0, 4, 2, 6), (1, 5, 3, 7))
    assert layout.axis_groups(("dp", "sp")) == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert layout.axis_groups(()) == tuple((r,) for r in range(8))
    assert layout.axis_groups(("dp", "sp", "mp")) == (tuple(range(8)),)


def test_axis_groups_are_every_ranks_group_members_on_an_uneven_mesh():
    """axis_groups works every rank's group out at once (numpy); each group is group_members of its ranks, in
    mixed-radix order of the axes as listed, the groups by their smallest rank, for every order of every subset."""
    layout = Layout((3, 1, 4, 2), ("a", "b", "c", "d"))
    for k in range(5):
        for axes in itertools.permutations(("a", "b", "c", "d"), k):
            groups = layout.axis_groups(axes)
            assert [g[0] for g in groups] == sorted(min(g) for g in groups)
            assert all(layout.group_members(r, axes) == g for g in groups for r in g)
            assert sorted(r for g in groups for r in g) == list(range(24))


def test_split_color_key_matches_groups():
    layout = Layout((4, 1, 2), ("a", "b", "c"))
    for axes in [("a",), ("b",), ("c",), ("a", "c"), ("c", "a"), ("a", "b", "c")]:
        for group in layout.axis_groups(axes):
            colors = {layout.split_color_key(r, axes)[0] for r in group}
            keys = [layout.split_color_key(r, axes)[1] for r in group]
            assert len(colors) == 1
            assert keys == list(range(len(group)))


def test_group_members_are_the_axis_group_that_holds_the_rank():
    """Worked out from one rank's coordinates, in the same order as axis_groups (first listed axis major)."""
    import itertools

    for layout in (Layout((2, 2, 2), ("dp", "sp", "mp")), Layout((4, 1, 3), ("a", "b", "c")), Layout((5,), ("x",))):
        names = layout.alias_name
        for k in range(len(names) + 1):
            for axes in itertools.permutations(names, k):
                holding = {r: g for g in layout.axis_groups(axes) for r in g}
                assert [layout.group_members(r, axes) for r in range(layout.num_devices)] == \
                    [holding[r] for r in range(layout.num_devices)], axes
    with pytest.raises(LayoutError, match="repeats"):
        Layout((2, 2), ("a", "b")).group_members(0, ("a", "a"))


def test_replica_groups_and_partial():
    layout = Layout((2, 4), ("dp", "mp"))
    x = layout("dp", None)
    assert x.replicated_axes == ("mp",)
    assert x.replica_groups() == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert x.num_replicas() == 4
    p = layout("dp", "None", partial=("mp",))
    assert p.partial == ("mp",)
    assert p.replicated_axes == ()
    assert p.replica_groups() == tuple((r,) for r in range(8))
    assert str(p) == "(\"dp\", None) partial ('mp',)"
    # A bare string names one axis; it is not split into letters.
    assert layout("dp", None, partial="mp") == p
    assert x.with_partial("mp") == p


def test_ranks_holding_lists_replicas():
    layout = Layout((2, 1, 2, 2, 1), ("a", "b", "c", "d", "e"))
    tl = layout("b", "e", "c", "a")
    assert tl.ranks_holding((0, 0, 0, 0)) == (0, 1)
    assert tl.ranks_holding((0, 0, 1, 1)) == (6, 7)


def test_entries_normalize_and_repr_round_trips():
    layout = Layout((2, 4), ("dp", "mp"))
    a = layout("dp", "None")
    b = layout(("dp",), None)
    assert a == b and hash(a) == hash(b)
    assert a.tensor_map == (("dp",), ())
    namespace = {"Layout": Layout, "TensorLayout": TensorLayout}
    assert eval(repr(a), namespace) == a
    assert eval(repr(layout), namespace) == layout
    assert str(layout("mp", ("dp",))) == '("mp", "dp")'
    # One dim keeps the tuple comma: ("x") would be a string in Python.
    assert str(Layout((4,), ("x",))("x")) == '("x",)'
    assert str(Layout((4,), ("x",))(None, partial="x")) == "(None,) partial ('x',)"


def test_local_shape_and_bounds():
    layout = Layout((2, 4), ("dp", "mp"))
    tl = layout("mp", "dp")
    assert tl.local_shape((12, 6)) == (3, 3)
    assert tl.bounds(5, (12, 6)) == ((3, 6), (3, 6))


@pytest.mark.parametrize(
    "build, fragment",
    [
        (lambda: Layout((2, 4), ("dp", "mp"))("xx", None), "unknown alias 'xx'"),
        (lambda: Layout((2, 4), ("dp", "mp"))("dp", "dp"), "axis 'dp' is used more than once"),
        (lambda: Layout((2, 4), ("dp", "mp"))(("dp", "mp"), "mp"), "axis 'mp' is used more than once"),
        (lambda: Layout((2, 4), ("dp", "mp"))("dp", partial=("dp",)), "axis 'dp' is used more than once"),
        (lambda: Layout((2, 4), ("dp", "mp"))("dp", partial=1),
         "partial 1 must be a mesh axis name or a tuple of them (() for none), from ('dp', 'mp')"),
        (lambda: Layout((2, 4), ("dp", "mp"))("dp", partial=None), "partial None must be a mesh axis name"),
        (lambda: Layout((2, 4), ("dp", "mp"))("dp", partial=(1,)), "partial (1,) must be a mesh axis name"),
        (lambda: Layout((2, 0), ("dp", "mp")), "positive integers, got 0"),
        (lambda: Layout((2, -1), ("dp", "mp")), "positive integers, got -1"),
        (lambda: Layout((2, 4), ("dp",)),
         "alias_name ('dp',) has 1 name but device_matrix (2, 4) has 2 axes; expected one name per axis"),
        (lambda: Layout((2, 4), ("dp", "dp")),
         "alias_name ('dp', 'dp') names two axes 'dp'; expected a different name for each axis"),
        (lambda: Layout((2, 4), ("dp", "None")), "other than 'None'"),
        (lambda: Layout((2,), ("dp",))(("dp", None)), "must hold axis names only"),
        (lambda: Layout((2,), ("dp",))(3.5), "must be an axis name"),
    ],
)
def test_layout_errors_name_the_value(build, fragment):
    with pytest.raises(LayoutError) as info:
        build()
    assert fragment in str(info.value)
    assert isinstance(info.value, SpmdsimError) and isinstance(info.value, ValueError)


def test_shape_errors():
    tl = Layout((2, 2, 2), ("dp", "sp", "mp"))("mp", ("sp", "dp"))
    with pytest.raises(ShapeError,
                       match=r"tensor \(4, 10\): dim 1 of size 10 is not divisible by 4 shards over \('sp', 'dp'\)"):
        tl.check_shape((4, 10))
    with pytest.raises(ShapeError, match=r"has 2 entries but shape \(4, 8, 2\) has 3 dims"):
        tl.check_shape((4, 8, 2))
    with pytest.raises(LayoutError, match="rank 8 is outside device matrix"):
        tl.shard_index(8)


@st.composite
def _layout_cases(draw):
    ndim_mesh = draw(st.integers(1, 4))
    matrix = []
    for _ in range(ndim_mesh):
        budget = 64 // max(1, math.prod(matrix))
        matrix.append(draw(st.sampled_from([s for s in (1, 2, 3, 4) if s <= budget])))
    names = tuple(f"m{i}" for i in range(ndim_mesh))
    layout = Layout(tuple(matrix), names)
    tensor_ndim = draw(st.integers(1, 3))
    axes = list(draw(st.permutations(names)))
    # Spread a random subset of axes over tensor dims; the rest stay replicated.
    used = draw(st.integers(0, len(axes)))
    entries: list[list[str]] = [[] for _ in range(tensor_ndim)]
    for alias in axes[:used]:
        entries[draw(st.integers(0, tensor_ndim - 1))].append(alias)
    tl = layout(*[tuple(e) for e in entries])
    shape = tuple(tl.num_shards(d) * draw(st.integers(1, 3)) for d in range(tensor_ndim))
    return tl, shape


@settings(max_examples=200, deadline=None)
@given(_layout_cases())
def test_shards_tile_the_tensor_exactly(case):
    tl, shape = case
    counts = np.zeros(shape, dtype=np.int64)
    distinct = set()
    for rank in range(tl.layout.num_devices):
        bounds = tl.bounds(rank, shape)
        counts[tl.slices(rank, shape)] += 1
        distinct.add(bounds)
        assert tuple(b - a for a, b in bounds) == tl.local_shape(shape)
    # Every element is held by exactly (number of replicas) ranks ...
    assert (counts == tl.num_replicas()).all()
    # ... and the non-replicated ranks tile it: one distinct block per shard.
    assert len(distinct) == math.prod(tl.shards_per_dim)
    for group in tl.replica_groups():
        assert len({tl.bounds(r, shape) for r in group}) == 1


def test_tensor_layout_hash_is_kept_but_not_pickled():
    import pickle

    mesh = Layout((2, 4), ("dp", "mp"))
    a = mesh(("dp", "mp"), None)
    table = {a: "found"}
    copy = pickle.loads(pickle.dumps(a))
    # The kept hash stays out of the pickle (str hashes differ between processes)
    # and is worked out again, equal to the original's, on first use.
    assert "_hash" not in copy.__dict__ and table[copy] == "found"
    assert hash(a) == hash(copy) == hash(mesh(("dp", "mp"), None))
    assert a != mesh(("mp", "dp"), None) and mesh(("mp", "dp"), None) not in table


def test_with_partial_of_its_own_axes_is_the_layout_itself():
    """A gradient's layout is then its tensor's very object (the backward walk compares by `is` first);
    other axes give an equal value each time, the same object per layout."""
    t = Layout((2, 4), ("dp", "mp"))("dp", None)
    assert t.with_partial(()) is t and t.with_partial([]) is t
    p = t.with_partial("mp")
    assert p.partial == ("mp",) and t.with_partial(("mp",)) is p and p.with_partial("mp") is p
    assert p.with_partial(()) is t  # and back: the layout it was derived from
    q = TensorLayout(t.layout, t.tensor_map, ("mp",))  # built directly: an equal value, not linked
    assert q.with_partial(()) == t and q.with_partial(()) is not t


def test_autograds_pending_layout_sums_back_to_each_tensors_own_object():
    """autograd's with_partial and grad_layout answer per layout object: two parameters of equal layouts
    (two objects) each get a pending layout that, summed, is their own layout object again (the
    optimizer's check of each gradient's layout then stops at `is`)."""
    from spmdsim.nn.autograd.moves import grad_layout
    from spmdsim.nn.autograd.graph import with_partial

    mesh = Layout((2, 4), ("dp", "mp"))
    a, b = mesh("dp", None), mesh("dp", None)
    assert a == b and a is not b
    pending_a, pending_b = with_partial(a, ("mp",)), with_partial(b, ("mp",))
    assert pending_a == pending_b and pending_a.partial == ("mp",)
    assert with_partial(pending_a, ()) is a and with_partial(pending_b, ()) is b
    assert with_partial(b, ("mp",)) is pending_b and with_partial(b, ()) is b
    # Where the backward walk keeps a gradient: derived from the tensor's own layout object too.
    assert grad_layout(a, pending_a) is pending_a and grad_layout(b, pending_a) is pending_b


def test_a_layout_keeps_what_it_worked_out_and_refuses_as_before():
    """coords and group_size are kept per Layout (every shard, group and member query asks again), and
    a shape that passed check_shape is known to pass; the refusals and the answers are those worked out
    afresh, and the kept answers and hash stay out of pickles (str hashes differ between processes)."""
    import pickle

    mesh = Layout((2, 4), ("dp", "mp"))
    first = mesh.coords(5)
    assert first == (1, 1) and mesh.coords(5) is first  # kept: the same tuple
    assert [mesh.coords(r) for r in range(8)] == [(r // 4, r % 4) for r in range(8)]
    assert mesh.coords(np.int64(6)) == (1, 2)
    for bad in (8, -1, 2.5, True):
        with pytest.raises(LayoutError, match="rank"):
            mesh.coords(bad)
    assert mesh.group_size(("dp", "mp")) == 8 and mesh.group_size(["mp"]) == 4 and mesh.group_size(()) == 1
    for bad, name in ((("dp", "tp"), "'tp'"), ((["dp"],), r"\['dp'\]")):
        with pytest.raises(LayoutError, match=f"unknown alias {name}"):
            mesh.group_size(bad)
    copy = pickle.loads(pickle.dumps(mesh))
    assert not {"_coords", "_sizes", "_hash"} & set(copy.__dict__)
    assert copy == mesh and hash(copy) == hash(mesh) and copy.coords(5) == first

    tl = Layout((2, 2, 2), ("dp", "sp", "mp"))("mp", ("sp", "dp"))
    assert tl.check_shape((4, 8)) == (4, 8)
    # A shape that passed passes again; others are checked as before, named by `what`.
    assert tl.check_shape((4, 8), "x") == (4, 8)
    same = tl.check_shape((np.int64(4), 8))
    assert same == (4, 8) and all(type(n) is int for n in same)
    with pytest.raises(ShapeError, match="must hold integers, got 4.0"):  # equal to (4, 8), hashed alike
        tl.check_shape((4.0, 8))
    with pytest.raises(ShapeError, match=r"x \(4, 10\): dim 1 of size 10 is not divisible by 4 shards"):
        tl.check_shape((4, 10), "x")
    with pytest.raises(ShapeError, match=r"has 2 entries but shape \(4, 8, 2\) has 3 dims"):
        tl.check_shape((4, 8, 2))
    with pytest.raises(ShapeError, match="must not have negative sizes"):
        tl.check_shape((-4, 8))
