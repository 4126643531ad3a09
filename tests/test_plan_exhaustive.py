"""Exhaustive proof of the planner: every pair of 2-D tensor maps, emulated bit-exactly.

Meshes (2,2), (2,4), (4,2), (2,2,2) and (8,), within a mesh and across the
8-device meshes. Without partial sums each rank must receive exactly its
lower bound; with partial sources values must still be exact and a resolved
axis the target splits must go through Reduce_scatter.
"""
from __future__ import annotations

import functools
import itertools
import time

import numpy as np

from spmdsim import Layout, TensorLayout
from spmdsim.programs.plan.meshes import common_refinement, translate
from spmdsim.programs.plan.planner import received_per_rank
from spmdsim.programs.plan import (
    ReduceScatter,
    emulate,
    partial_addends,
    plan_redistribution,
    shards_of,
    sum_partials,
)

SHAPE = (8, 16)
MESHES = {
    "2x2": Layout((2, 2), ("a", "b")),
    "2x4": Layout((2, 4), ("a", "b")),
    "4x2": Layout((4, 2), ("a", "b")),
    "2x2x2": Layout((2, 2, 2), ("a", "b", "c")),
    "8": Layout((8,), ("x",)),
}
EIGHT = ("2x4", "4x2", "2x2x2", "8")


def tensor_maps(layout: Layout, ndim: int = 2):
    """Every tensor map of an ndim tensor: each axis unused or on one dim, in every order."""
    names = layout.alias_name
    out = []
    for where in itertools.product(range(ndim + 1), repeat=len(names)):
        per_dim = [[a for a, w in zip(names, where) if w == d] for d in range(ndim)]
        for orders in itertools.product(*(itertools.permutations(p) for p in per_dim)):
            out.append(layout(*orders))
    return out


def with_partials(tl: TensorLayout):
    free = tl.replicated_axes
    return [tl.with_partial(c) for k in range(1, len(free) + 1)
            for c in itertools.combinations(free, k)]


FULL = np.arange(np.prod(SHAPE), dtype=np.float64).reshape(SHAPE)


@functools.lru_cache(maxsize=None)
def _blocks(tl: TensorLayout):
    return partial_addends(tl, FULL)


def _check(source, target):
    plan = plan_redistribution(source, target, SHAPE, "float64")
    # What pricing asks (no senders chosen) is what the plan's transfers deliver.
    assert received_per_rank(source, target, SHAPE, "float64") == plan.bytes_received, str(plan)
    out = emulate(plan, dict(_blocks(source)))
    want = _blocks(target) if not target.partial else None
    if want is not None:
        for r, block in want.items():
            assert np.array_equal(out[r], block), (str(source), str(target), r)
    return plan


def test_map_counts():
    assert len(tensor_maps(MESHES["2x2"])) == 11
    assert len(tensor_maps(MESHES["2x2x2"])) == 49
    assert len(tensor_maps(MESHES["8"])) == 3


def test_exhaustive_plain_pairs_meet_the_lower_bound():
    pairs = [(s, t) for m in MESHES.values() for s in tensor_maps(m) for t in tensor_maps(m)]
    pairs += [(s, t) for a in EIGHT for b in EIGHT if a != b
              for s in tensor_maps(MESHES[a]) for t in tensor_maps(MESHES[b])]
    start = time.perf_counter()
    for source, target in pairs:
        plan = _check(source, target)
        assert plan.bytes_received == plan.lower_bound, (str(source), str(target), str(plan))
    elapsed = time.perf_counter() - start
    print(f"{len(pairs)} plain pairs in {elapsed:.2f} s")
    # within meshes 121 + 2 * 121 + 49**2 + 3**2; across the 8-device meshes 74**2 minus those
    assert len(pairs) == 2773 + 74 * 74 - (2 * 121 + 49**2 + 9) == 5597


def test_exhaustive_partial_sources():
    pairs = [(p, t) for m in MESHES.values() for s in tensor_maps(m)
             for p in with_partials(s) for t in tensor_maps(m)]
    pairs += [(p, t) for a in EIGHT for b in EIGHT if a != b
              for s in tensor_maps(MESHES[a]) for p in with_partials(s)
              for t in tensor_maps(MESHES[b])]
    assert len(pairs) == 2341 + 2028
    reduce_scatter_expected = 0
    for source, target in pairs:
        plan = _check(source, target)
        assert all(got >= low for got, low in zip(plan.bytes_received, plan.lower_bound))
        mesh, first, second = common_refinement(source.layout, target.layout)
        src, tgt = translate(source, mesh, first), translate(target, mesh, second)
        if set(src.partial) & set(tgt.split_axes):
            reduce_scatter_expected += 1
            assert any(isinstance(s, ReduceScatter) for s in plan.steps), str(plan)
            assert all(s.op != "allreduce" or not set(s.axes) & set(tgt.split_axes)
                       for s in plan.steps), str(plan)
    assert reduce_scatter_expected > 100


def test_partial_targets_sum_to_the_value():
    checked = 0
    for name, step in (("2x2", 1), ("2x4", 1), ("2x2x2", 11)):
        maps = tensor_maps(MESHES[name])
        layouts = maps + [p for s in maps for p in with_partials(s)]
        targets = [p for s in maps for p in with_partials(s)]
        for source, target in list(itertools.product(layouts, targets))[::step]:
            plan = plan_redistribution(source, target, SHAPE, "float64")
            out = sum_partials(target, emulate(plan, dict(_blocks(source))))
            for r, block in _blocks(target.with_partial(())).items():
                assert np.array_equal(out[r], block), (str(source), str(target), r)
            assert all(got >= low for got, low in zip(plan.bytes_received, plan.lower_bound))
            checked += 1
    assert checked > 500


def test_sampled_3d_tensors_meet_the_lower_bound():
    """A seeded sample of 3-D maps, within (2,2,2) and across to (4,2) and (8,)."""
    rng = np.random.default_rng(0)
    shape = (8, 8, 16)
    full = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    cube = tensor_maps(MESHES["2x2x2"], 3)
    others = tensor_maps(MESHES["4x2"], 3) + tensor_maps(MESHES["8"], 3)
    pool = cube + others
    for _ in range(300):
        source = cube[rng.integers(len(cube))]
        target = pool[rng.integers(len(pool))]
        plan = plan_redistribution(source, target, shape, "float64")
        out = emulate(plan, shards_of(source, full))
        for r, block in shards_of(target, full).items():
            assert np.array_equal(out[r], block), (str(source), str(target), r)
        assert plan.bytes_received == plan.lower_bound, str(plan)
