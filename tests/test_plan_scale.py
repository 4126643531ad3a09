"""The planner's whole-mesh shortcuts give what the per-rank definitions give.

rank_boxes (all ranks' boxes at once), Layout.group_indices (every rank's group
index at once) and exchange_transfers' grid lookup replaced per-rank loops and
a scan of every held box, so that plans at tens of thousands of devices run in
seconds; these tests pin them to the plain definitions on random layouts.
"""
from __future__ import annotations

import random

import pytest

from spmdsim.programs.transfer import Transfer
from spmdsim import Layout
from spmdsim.programs.plan import plan_redistribution
from spmdsim.programs.plan.volume import box_size, exchange_transfers, intersect, rank_boxes

MESHES = [(8,), (2, 4), (2, 2, 2), (4, 1, 2), (3, 2), (2, 3, 2), (1,)]


def _random_layout(rng: random.Random, layout: Layout, ndim: int, partial_ok: bool = True):
    axes = list(layout.alias_name)
    rng.shuffle(axes)
    tensor_map = []
    for _ in range(ndim):
        k = rng.choice([0, 1, 1, 2])
        take, axes = axes[:k], axes[k:]
        tensor_map.append(None if not take else take[0] if len(take) == 1 else tuple(take))
    partial = tuple(a for a in axes if partial_ok and rng.random() < 0.3)
    return layout(*tensor_map).with_partial(partial)


def _cases(seed: int, count: int):
    rng = random.Random(seed)
    for _ in range(count):
        dims = rng.choice(MESHES)
        layout = Layout(dims, tuple("abc"[:len(dims)]))
        ndim = rng.choice([0, 1, 2, 3])
        first, second = _random_layout(rng, layout, ndim), _random_layout(rng, layout, ndim)
        shape = tuple(rng.choice([12, 24, 36, 0]) for _ in range(ndim))
        try:
            first.check_shape(shape), second.check_shape(shape)
        except ValueError:
            continue
        yield first, second, shape


def test_group_indices_are_group_index_of_every_rank():
    for dims in MESHES + [(4, 4, 4)]:
        layout = Layout(dims, tuple("abc"[:len(dims)]))
        rng = random.Random(len(dims))
        for _ in range(10):
            axes = list(layout.alias_name)
            rng.shuffle(axes)
            axes = axes[:rng.randint(0, len(axes))]
            got = layout.group_indices(axes).tolist()
            assert got == [layout.group_index(r, axes) for r in range(layout.num_devices)], (dims, axes)


def test_rank_boxes_are_bounds_of_every_rank():
    checked = 0
    for tl, _, shape in _cases(seed=3, count=600):
        assert rank_boxes(tl, shape) == tuple(tl.bounds(r, shape) for r in range(tl.layout.num_devices))
        checked += 1
    assert checked > 300


def _scanned_transfers(before, after, shape):
    """exchange_transfers' definition, scanning every held box for every destination."""
    src, tgt = rank_boxes(before, shape), rank_boxes(after, shape)
    holders: dict = {}
    for r, box in enumerate(src):
        holders.setdefault(box, []).append(r)
    keys = [before.layout.group_index(r, before.partial) for r in range(len(src))]
    load, out = [0] * len(src), []
    for dst, want in enumerate(tgt):
        if src[dst] == want:
            continue
        for box, ranks in holders.items():
            part = None if box == src[dst] else intersect(box, want)
            if part is None:
                continue
            chosen = min((h for h in ranks if keys[h] == keys[dst]), key=lambda h: (load[h], (h - dst) % len(src)))
            load[chosen] += box_size(part)
            out.append(Transfer(chosen, dst, part))
    return tuple(out)


def test_exchange_transfers_match_the_scan():
    checked = 0
    for before, after, shape in _cases(seed=5, count=1500):
        before = before.with_partial(())  # exchanges move plain blocks (pending sums are resolved first)
        assert exchange_transfers(before, after.with_partial(()), shape) == \
            _scanned_transfers(before, after.with_partial(()), shape), (before, after, shape)
        checked += 1
    assert checked > 800


@pytest.mark.parametrize("dims, source, target, shape, bound", [
    # 64x64 blocks of 4096x4096 float32: 16 KiB each; a rank off the diagonal holds none of its new one.
    ((64, 64), ("a", "b"), ("b", "a"), (4096, 4096), 64 * 64 * 4),
    # 16x64 source blocks, 256x4 target blocks: 4 KiB each.
    ((16, 16, 16), (("a", "b"), "c"), ("c", ("a", "b")), (4096, 1024), 1024 * 4),
])
def test_plans_at_thousands_of_devices_meet_the_lower_bound(dims, source, target, shape, bound):
    layout = Layout(dims, ("a", "b", "c")[:len(dims)])
    plan = plan_redistribution(layout(*source), layout(*target), shape, "float32")
    assert plan.max_lower_bound == bound
    assert plan.meets_lower_bound and plan.max_bytes_received == bound
