"""Reshape inference (pure): sound and complete against every rank's block, checked by brute force."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from spmdsim import Layout
from spmdsim.errors import OperatorError
from spmdsim.programs.infer.reshape import infer_reshape, reshape_shape

MESHES = [Layout((2, 4), ("a", "b")), Layout((2, 2, 2), ("a", "b", "c")), Layout((4, 1, 2), ("a", "b", "c")),
          Layout((8,), ("a",))]


def _blocks(layout, shape: tuple[int, ...]) -> list[np.ndarray]:
    """Every rank's block of arange(shape), as the flat indices it holds, in its row-major order."""
    full = np.arange(math.prod(shape)).reshape(shape)
    return [full[layout.slices(r, shape)].ravel() for r in range(layout.layout.num_devices)]


def _all_maps(mesh: Layout, ndim: int):
    """Every tensor map of `ndim` dims over `mesh` (each axis on one dim or none, any order within a dim)."""
    axes = mesh.alias_name
    for where in itertools.product(range(ndim + 1), repeat=len(axes)):
        per_dim = [[a for a, w in zip(axes, where) if w == d] for d in range(ndim)]
        for orders in itertools.product(*(itertools.permutations(p) for p in per_dim)):
            yield mesh(*(o or None for o in orders))


def _cases(seed: int, count: int):
    rng = np.random.default_rng(seed)
    factors = [1, 2, 2, 3, 4]
    for _ in range(count):
        mesh = MESHES[rng.integers(len(MESHES))]
        sizes = [int(rng.choice(factors)) for _ in range(int(rng.integers(3, 6)))]
        # The same factors cut two ways: into old dims and into new dims.

        def cut(values):
            dims, cur = [], 1
            for v in values:
                cur *= v
                if rng.random() < 0.5:
                    dims.append(cur)
                    cur = 1
            return tuple(dims + [cur]) if cur > 1 or not dims else tuple(dims)
        old, new = cut(sizes), cut(sizes)
        maps = [m for m in _all_maps(mesh, len(old)) if _fits(m, old)]
        if maps:
            yield maps[rng.integers(len(maps))], old, new


def _fits(layout, shape) -> bool:
    return all(s % layout.num_shards(d) == 0 for d, s in enumerate(shape))


def test_reshape_is_sound_and_complete_on_random_cases():
    accepted = refused = 0
    for x, old, new in _cases(seed=7, count=400):
        want = [b for b in _blocks(x, old)]
        try:
            layout, shape = infer_reshape(x, old, new)
        except OperatorError:
            refused += 1
            # Complete: no tensor map of the new dims gives every rank the block it holds.
            for cand in _all_maps(x.layout, len(new)):
                if _fits(cand, new):
                    got = _blocks(cand, new)
                    assert not all(np.array_equal(g, w) for g, w in zip(got, want)), (x, old, new, cand)
            continue
        accepted += 1
        assert shape == new and layout.partial == x.partial
        # Sound: each rank's reshaped shard is exactly its block of the reshaped tensor.
        for r, (g, w) in enumerate(zip(_blocks(layout, new), want)):
            assert np.array_equal(g, w), (x, old, new, layout, r)
    assert accepted > 50 and refused > 50  # both branches are really exercised


UNEVEN = [Layout((2, 4), ("a", "b"), cut="chunk"), Layout((3, 2), ("a", "b"), cut="balanced"),
          Layout((4,), ("a",), cut="chunk"), Layout((3,), ("a",), cut="balanced")]


@pytest.mark.parametrize("mesh", UNEVEN, ids=str)
def test_reshape_under_an_uneven_cut_runs_only_where_each_block_stays_one(mesh):
    """Under cut "chunk" or "balanced" a split dim whose size its pieces do not divide has unequal pieces; a reshape
    that regrouped it was planned as under the even cut ((3, 4) -> (12,) split on "a" over 2: blocks of 6 rows for
    pieces of 8 and 4), and each rank's reshape then raised ValueError on its own. Now refused in one line, and
    every accepted reshape is sound: each rank's block, reshaped, is its block of the new shape."""
    rng = np.random.default_rng(3)
    accepted = refused = 0
    for _ in range(300):
        sizes = [int(rng.choice([1, 2, 3, 4, 5, 6])) for _ in range(int(rng.integers(2, 4)))]
        old = tuple(sizes)
        new = tuple(int(v) for v in rng.permutation(sizes)) if rng.random() < 0.3 else (math.prod(sizes[:2]),
                                                                                            *sizes[2:])
        if math.prod(new) != math.prod(old):
            continue
        maps = list(_all_maps(mesh, len(old)))
        x = maps[int(rng.integers(len(maps)))]
        want = _blocks(x, old)
        try:
            layout, shape = infer_reshape(x, old, new)
        except OperatorError as e:
            refused += 1
            assert "\n" not in str(e) and str(e).startswith(f"reshape {old!r} -> {new!r}"), e
            continue
        accepted += 1
        for r, (g, w) in enumerate(zip(_blocks(layout, new), want)):
            assert np.array_equal(g, w), (x, old, new, layout, r)
    assert accepted > 30 and refused > 30


def test_an_uneven_regrouping_is_refused_in_one_line():
    x = Layout((2,), ("dp",), cut="chunk")("dp", None, None)
    with pytest.raises(OperatorError) as e:
        infer_reshape(x, (3, 4, 5), (12, 5))
    assert str(e.value) == (
        'reshape (3, 4, 5) -> (12, 5) of x mapped ("dp", None, None): old dims (0, 1) (3, 4) become new dims (0,) '
        '(12,), but the block each rank holds of them is not a block of the new dims (dims (0,) split over "dp" into '
        "unequal pieces (cut 'chunk')); redistribute x so those dims are whole, or split only the first of them into "
        "pieces the new dims' sizes divide")
    assert infer_reshape(x, (4, 3, 5), (12, 5))[0] == Layout((2,), ("dp",), cut="chunk")("dp", None)  # equal pieces


def test_attention_head_split_and_merge():
    mesh = Layout((2, 4), ("dp", "mp"))
    q = mesh(None, "mp")
    layout, shape = infer_reshape(q, (6, 32), (6, 8, 4))
    assert shape == (6, 8, 4) and layout.tensor_map == ((), ("mp",), ())
    back, shape = infer_reshape(layout, (6, 8, 4), (6, -1))
    assert shape == (6, 32) and back == q
    # Two axes on one dim merge in order, first major; and split back over two dims.
    both = mesh(("dp", "mp"), None)
    merged, _ = infer_reshape(mesh("dp", "mp", None), (2, 4, 3), (8, 3))
    assert merged == both
    split, _ = infer_reshape(both, (8, 3), (2, 4, 3))
    assert split.tensor_map == (("dp",), ("mp",), ())


def test_pending_sums_stay_pending():
    mesh = Layout((2, 4), ("a", "b"))
    layout, _ = infer_reshape(mesh("b", None).with_partial("a"), (4, 8), (32,))
    assert layout.tensor_map == (("b",),) and layout.partial == ("a",)


def test_refusals_name_the_dims():
    mesh = Layout((2, 4), ("a", "b"))
    with pytest.raises(OperatorError, match=r"old dims \(0, 1\) \(4, 8\) become new dims \(0,\) \(32,\)"):
        infer_reshape(mesh(None, "b"), (4, 8), (32,))  # a split minor dim leaves gaps in the run
    with pytest.raises(OperatorError, match='dims \\(1,\\) split over "b"'):
        infer_reshape(mesh(None, "b"), (3, 12), (3, 2, 6))  # 4 pieces do not divide 2 and are not 2 x 2
    with pytest.raises(OperatorError, match="element counts must match"):
        reshape_shape((4, 8), (5, 6))
    with pytest.raises(OperatorError, match="at most one -1"):
        reshape_shape((4, 8), (-1, -1))
    with pytest.raises(OperatorError, match="cannot fill the -1"):
        reshape_shape((4, 8), (5, -1))
    with pytest.raises(OperatorError, match="must hold non-negative integers"):
        reshape_shape((4, 8), ("a", 8))
    assert reshape_shape((4, 8), 32) == (32,)


def test_reshape_on_ranks_keeps_its_plan_for_int_shapes_only():
    """ops.reshape keeps its plan and block shape per layout object for shapes of Python ints: the same
    call again gives each rank its block of the reshaped tensor, and a shape of equal floats (which hashes
    as the ints do) is refused after the int one passed, as it is before."""
    import spmdsim
    from spmdsim import DTensor, Mesh
    from spmdsim.nn import ops

    full = np.arange(48.0).reshape(6, 8)

    def body() -> None:
        mesh = Mesh(Layout((2,), ("a",)), spmdsim.world())
        x = DTensor.from_global(mesh, full, mesh.layout(None, "a"))
        for _ in range(2):
            y = ops.reshape(x, (6, 2, 4))
            assert y.layout == mesh.layout(None, "a", None) and y.global_shape == (6, 2, 4)
            np.testing.assert_array_equal(y.local, full.reshape(6, 2, 4)[y.slices])
        with pytest.raises(OperatorError, match=r"reshape shape \(6, 2\.0, 4\) must hold non-negative integers"):
            ops.reshape(x, (6, 2.0, 4))
        # The kept plan serves a tensor of another dtype, and one that takes a gradient (the node recorded).
        n = DTensor.from_global(mesh, full.astype(np.int32), x.layout)
        w = DTensor.from_global(mesh, full, x.layout).requires_grad_()
        m, v = ops.reshape(n, (6, 2, 4)), ops.reshape(w, (6, 2, 4))
        assert m.local.dtype == np.int32 and m.layout is y.layout and m._ag is None
        np.testing.assert_array_equal(m.local, full.reshape(6, 2, 4)[m.slices])
        (v * v).sum().backward()
        np.testing.assert_array_equal(w.grad.gather(), 2 * full)
        mesh.close()

    spmdsim.simulate(2, body)


def test_split_dims_of_size_one_keep_their_axes_under_an_uneven_cut():
    """A dim of size 1 split by an uneven cut is held by the first piece only (the other ranks' blocks are empty).
    A reshape that kept it, beside dims of size 1 added or dropped, was refused ((1, 3) -> (1, 1, 3), (1,) -> (1, 1):
    `stack` of such tensors, `x[..., i]` after a narrow): each split dim of size 1 now keeps its axes on a dim of
    size 1 of the result, and every rank's block is the old one reshaped. Where no dim of size 1 is left, the
    empty blocks would have to fill: refused in one line."""
    four = Layout((4,), ("a",), cut="chunk")
    grid = Layout((2, 3), ("a", "b"), cut="balanced")
    cases = [(four("a", None), (1, 3), (1, 1, 3), four("a", None, None)),
             (four("a"), (1,), (1, 1), four("a", None)),
             (four("a", None, None), (1, 2, 1), (2, 1), four(None, "a")),  # across runs: (1, 2) -> (2,), then 1
             (grid("a", None, "b"), (1, 5, 1), (5, 1, 1), grid(None, "a", "b")),
             (grid("a", "b", None), (1, 1, 4), (1, 4), grid(("a", "b"), None)),  # two onto one: held at (0, 0)
             (grid(("b", "a"), None), (1, 6), (1, 2, 3), grid(("b", "a"), None, None))]
    for x, old, new, want in cases:
        layout, shape = infer_reshape(x, old, new)
        assert (layout, shape) == (want, new), (x, old, new, layout)
        for r, (g, w) in enumerate(zip(_blocks(layout, new), _blocks(x, old))):
            assert np.array_equal(g, w), (x, old, new, layout, r)
    with pytest.raises(OperatorError) as e:
        infer_reshape(four(None, "a"), (5, 1), (5,))
    assert str(e.value) == (
        'reshape (5, 1) -> (5,) of x mapped (None, "a"): dims (1,) of size 1 are split over "a" (cut \'chunk\': the '
        "first piece holds the row, the others none) and the new shape has no dim of size 1 to keep that split; "
        "redistribute x so those dims are whole")
    # Sound on random cases with split dims of size 1: every accepted reshape keeps every rank's block.
    rng = np.random.default_rng(5)
    accepted = 0
    for _ in range(200):
        mesh = (four, grid)[int(rng.integers(2))]
        old = tuple(int(rng.choice([1, 1, 2, 3])) for _ in range(int(rng.integers(1, 4))))
        new = tuple(int(v) for v in rng.permutation(old + (1,) * int(rng.integers(0, 2))))
        if math.prod(new) != math.prod(old) or 1 not in old:
            continue
        maps = list(_all_maps(mesh, len(old)))
        x = maps[int(rng.integers(len(maps)))]
        try:
            layout, _ = infer_reshape(x, old, new)
        except OperatorError:
            continue
        accepted += 1
        for r, (g, w) in enumerate(zip(_blocks(layout, new), _blocks(x, old))):
            assert np.array_equal(g, w), (x, old, new, layout, r)
    assert accepted > 40
