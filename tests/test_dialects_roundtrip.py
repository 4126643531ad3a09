"""Property tests: dialect -> TensorLayout -> dialect round trips, and cross-dialect agreement.

Random meshes have up to 4 axes and 64 devices.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spmdsim import DialectError, Layout, TensorLayout
from spmdsim.layouts.dialects import (
    Broadcast,
    Partial,
    PartialSum,
    Replicate,
    Shard,
    Split,
    format_strategy,
    layout_to_partition_spec,
    layout_to_placements,
    layout_to_sbp,
    layout_to_strategy,
    matmul_layouts,
    parse_strategy,
    partition_spec_to_layout,
    placements_to_layout,
    sbp_to_layout,
    strategy_to_layout,
)

_SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def sizes(draw, max_axes: int = 4, budget: int = 64, min_axes: int = 1) -> tuple[int, ...]:
    """Positive sizes whose product stays within `budget`."""
    count = draw(st.integers(min_axes, max_axes))
    out = []
    for _ in range(count):
        size = draw(st.integers(1, min(8, budget)))
        budget //= size
        out.append(size)
    return tuple(out)


@st.composite
def sbps(draw, partial: bool = True):
    """(sbp, placement shape, ndim)."""
    shape = draw(sizes())
    ndim = draw(st.integers(0, 3))
    choices = [Broadcast()] + ([PartialSum()] if partial else []) + [Split(d) for d in range(ndim)]
    sbp = tuple(draw(st.sampled_from(choices)) for _ in shape)
    return sbp, shape, ndim


@st.composite
def tensor_layouts(draw, partial: bool = True) -> TensorLayout:
    """Any TensorLayout: axes assigned to dims in any order, to partial, or replicated."""
    shape = draw(sizes())
    names = tuple(f"ax{i}" for i in range(len(shape)))
    ndim = draw(st.integers(0, 3))
    targets = list(range(ndim)) + [None] + (["partial"] if partial else [])
    where = [draw(st.sampled_from(targets)) for _ in names]
    entries = [draw(st.permutations([n for n, w in zip(names, where) if w == d])) for d in range(ndim)]
    return Layout(shape, names)(
        *(tuple(e) for e in entries), partial=[n for n, w in zip(names, where) if w == "partial"]
    )


def _is_ascending(tl: TensorLayout) -> bool:
    return all(
        [tl.layout.axis_index(a) for a in axes] == sorted(tl.layout.axis_index(a) for a in axes)
        for axes in tl.tensor_map
    )


def _global_shape(tl: TensorLayout) -> tuple[int, ...]:
    return tuple(2 * n for n in tl.shards_per_dim)


# -- round trips ----------------------------------------------------------------
@_SETTINGS
@given(sbps())
def test_sbp_round_trip(case):
    sbp, shape, ndim = case
    tl = sbp_to_layout(sbp, shape, ndim)
    assert layout_to_sbp(tl) == sbp
    assert sbp_to_layout(layout_to_sbp(tl), shape, ndim) == tl


@_SETTINGS
@given(sbps())
def test_placements_round_trip(case):
    sbp, shape, ndim = case
    placements = tuple(
        Shard(s.tensor_dim) if isinstance(s, Split) else Partial() if isinstance(s, PartialSum)
        else Replicate() for s in sbp
    )
    tl = placements_to_layout(placements, shape, ndim)
    assert layout_to_placements(tl) == placements


@_SETTINGS
@given(tensor_layouts())
def test_layout_to_sbp_and_placements_exact_or_refused(tl):
    names, shape = tl.layout.alias_name, tl.layout.device_matrix
    if _is_ascending(tl):
        assert sbp_to_layout(layout_to_sbp(tl), shape, tl.ndim, mesh_axis_names=names) == tl
        assert placements_to_layout(layout_to_placements(tl), shape, tl.ndim, names) == tl
    else:
        for convert in (layout_to_sbp, layout_to_placements):
            try:
                convert(tl)
            except DialectError as err:
                assert "major" in str(err)
            else:
                raise AssertionError(f"{convert.__name__} accepted {tl}")


@_SETTINGS
@given(tensor_layouts(partial=False))
def test_partition_spec_round_trip(tl):
    names, shape = tl.layout.alias_name, tl.layout.device_matrix
    spec = layout_to_partition_spec(tl)
    assert len(spec) == tl.ndim
    assert partition_spec_to_layout(spec, shape, None, names) == tl
    assert layout_to_partition_spec(partition_spec_to_layout(spec, shape, None, names)) == spec


@_SETTINGS
@given(sizes(min_axes=0), st.integers(1, 8))
def test_strategy_round_trip_and_rep_neighbours(counts, rep):
    world = math.prod(counts) * rep
    tl = strategy_to_layout(counts, world)
    assert layout_to_strategy(tl) == counts
    if counts:  # a bare () is "no inputs" to parse_strategy; "((),)" is the scalar
        assert parse_strategy(format_strategy(counts)) == (counts,)
    assert tl.num_replicas() == rep
    for group in tl.replica_groups():  # MindSpore default: neighbouring ranks repeat
        assert group == tuple(range(group[0], group[0] + rep))


@st.composite
def matmul_cases(draw):
    batch = draw(sizes(max_axes=2, budget=8, min_axes=0))
    a, k, c = draw(sizes(max_axes=3, budget=16, min_axes=3))
    ta, tb = draw(st.booleans()), draw(st.booleans())
    x_batch = batch[len(batch) - draw(st.integers(0, len(batch))):]
    w_batch = batch if len(x_batch) < len(batch) else batch[len(batch) - draw(st.integers(0, len(batch))):]
    xs = x_batch + ((k, a) if ta else (a, k))
    ws = w_batch + ((c, k) if tb else (k, c))
    rep = draw(st.sampled_from([1, 2]))
    return (xs, ws), math.prod(batch) * a * k * c * rep, ta, tb, batch, (a, k, c)


@settings(max_examples=60, deadline=None)
@given(matmul_cases())
def test_matmul_round_trip_and_product(case):
    strategy, world, ta, tb, batch, (a, k, c) = case
    m = matmul_layouts(strategy, world, ta, tb)
    assert tuple(map(layout_to_strategy, (m.x, m.w))) == strategy
    assert m.out.shards_per_dim == batch + (a, c)
    assert m.out.partial == (("k",) if k > 1 else ())
    assert m.layout.num_devices == world
    # Numerically: local products summed over "k" groups give the reference slices.
    rng = np.random.default_rng(0)
    x_shape = tuple(2 * n for n in strategy[0])
    w_shape = tuple(2 * n for n in strategy[1])
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    t = lambda arr, flag: np.swapaxes(arr, -1, -2) if flag else arr  # noqa: E731
    ref = t(x, ta) @ t(w, tb)
    for group in m.layout.axis_groups(m.out.partial):
        total = sum(
            t(x[m.x.slices(r, x_shape)], ta) @ t(w[m.w.slices(r, w_shape)], tb) for r in group
        )
        np.testing.assert_allclose(total, ref[m.out.slices(group[0], ref.shape)], atol=1e-12)


# -- cross-dialect agreement --------------------------------------------------------
@_SETTINGS
@given(sbps())
def test_same_layout_in_every_dialect_gives_the_same_slices(case):
    sbp, shape, ndim = case
    # Spell the same sharding in each dialect by hand, not through TensorLayout.
    placements = [
        Shard(s.tensor_dim) if isinstance(s, Split) else Partial() if isinstance(s, PartialSum)
        else Replicate() for s in sbp
    ]
    names = tuple(f"mesh_{i}" for i in range(len(shape)))
    split_axes = [[n for n, s in zip(names, sbp) if s == Split(d)] for d in range(ndim)]
    spec = tuple(None if not ax else ax[0] if len(ax) == 1 else tuple(ax) for ax in split_axes)
    from_sbp = sbp_to_layout(sbp, shape, ndim)
    from_dt = placements_to_layout(placements, shape, ndim)
    from_ps = partition_spec_to_layout(spec, shape, None, names)
    global_shape = _global_shape(from_sbp)
    expected = from_sbp.rank_slices(global_shape)
    assert from_dt.rank_slices(global_shape) == expected
    assert from_ps.rank_slices(global_shape) == expected
    partial_positions = [i for i, s in enumerate(sbp) if s == PartialSum()]
    assert [from_dt.layout.axis_index(a) for a in from_dt.partial] == partial_positions
    assert [from_sbp.layout.axis_index(a) for a in from_sbp.partial] == partial_positions


@_SETTINGS
@given(sizes(), st.integers(1, 4))
def test_strategy_layout_expressed_in_mesh_dialects(counts, rep):
    tl = strategy_to_layout(counts, math.prod(counts) * rep)
    shape, names = tl.layout.device_matrix, tl.layout.alias_name
    global_shape = _global_shape(tl)
    expected = tl.rank_slices(global_shape)
    via_sbp = sbp_to_layout(layout_to_sbp(tl), shape, tl.ndim)
    via_dt = placements_to_layout(layout_to_placements(tl), shape, tl.ndim)
    via_ps = partition_spec_to_layout(layout_to_partition_spec(tl), shape, None, names)
    for other in (via_sbp, via_dt, via_ps):
        assert other.rank_slices(global_shape) == expected
    assert layout_to_sbp(tl)[: len(counts)] == tuple(Split(i) for i in range(len(counts)))
