"""Operators and their backward on uneven shards (Layout cut "chunk"/"balanced"), against numpy.

The general operators run through tests/generalkit (forward against numpy, every operand's gradient
against central differences) on meshes whose sizes leave dims uneven: 6 ranks cut "balanced" (an
axis of 3 cuts 4 rows 2,1,1 and 8 rows 3,3,2) and 8 ranks cut "chunk" (4 rows over 8: half the
ranks empty). Megatron's layers and a training step run with feature counts no axis divides.
"""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import Layout, SeededTensor

from generalkit import random_case, run_case

# Elementwise, broadcasting, MatMul as einsum (a contracted dim split: pending sums), reductions,
# norms, softmax, a loss, slicing and joining of split dims.
OPS = ("add_broadcast", "mul", "exp_tanh", "einsum_matmul", "einsum_batched", "sum", "mean_keepdims", "max",
       "min_all", "var", "softmax_last", "layer_norm", "cross_entropy_rows", "narrow_split", "concatenate_split")


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("cut, ranks", [("balanced", 6), ("chunk", 8)])
def test_general_ops_forward_and_backward_on_uneven_shards(name, cut, ranks):
    uneven = 0
    for seed in range(3):
        case = random_case(name, ranks, np.random.default_rng(seed), cut=cut)
        results = spmdsim.simulate(ranks, lambda: run_case(spmdsim.world(), case))
        assert len(set(results)) == 1 and results[0][2] is None, results[0][2]
        uneven += any(size % len(case.mesh) for shape in case.shapes for size in shape)
    assert uneven  # the shapes' sizes do not all divide the mesh


def _mlp_step():
    """Column- then row-parallel Linear over tp = 3 (10 -> 7 -> 5 features), batch 5 over dp = 2, one SGD step."""
    from spmdsim import DTensor, Mesh
    from spmdsim.nn import ops
    from spmdsim.nn.optim import SGD

    mesh = Mesh(Layout((2, 3), ("dp", "tp"), "balanced"), spmdsim.world())
    fc1 = ops.ColumnParallelLinear(mesh, 10, 7, axes="tp", dtype="float64", seed=1)
    fc2 = ops.RowParallelLinear(mesh, 7, 5, axes="tp", input_is_parallel=True, dtype="float64", seed=3)
    rows = mesh.layout("dp", None)
    x = DTensor.from_seeded(mesh, rows, SeededTensor((5, 10), "float64", seed=5))
    target = DTensor.from_seeded(mesh, rows, SeededTensor((5, 5), "float64", seed=6))
    y = fc2(ops.relu(fc1(x)))
    loss = ops.mse_loss(y, target)
    loss.backward()
    params = [fc1.weight, fc1.bias, fc2.weight, fc2.bias]
    SGD(params, lr=0.5).step()
    shards = (fc1.weight.local.shape, fc2.weight.local.shape)
    return float(loss.item()), [p.gather() for p in params], shards


def test_megatron_layers_train_a_step_on_uneven_features():
    results = spmdsim.simulate(6, _mlp_step)
    x, t = SeededTensor((5, 10), "float64", seed=5).full(), SeededTensor((5, 5), "float64", seed=6).full()
    w1, b1 = SeededTensor((10, 7), "float64", 1).full(), SeededTensor((7,), "float64", 2).full()
    w2, b2 = SeededTensor((7, 5), "float64", 3).full(), SeededTensor((5,), "float64", 4).full()
    h = x @ w1 + b1
    a = np.maximum(h, 0)
    y = a @ w2 + b2
    loss = np.mean((y - t) ** 2)
    dy = 2 * (y - t) / y.size
    dw2, db2 = a.T @ dy, dy.sum(0)
    dh = (dy @ w2.T) * (h > 0)
    dw1, db1 = x.T @ dh, dh.sum(0)
    want = [w1 - 0.5 * dw1, b1 - 0.5 * db1, w2 - 0.5 * dw2, b2 - 0.5 * db2]
    for got_loss, params, _ in results:
        assert abs(got_loss - loss) <= 1e-12 * loss
        for got, expected in zip(params, want):
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-13)
    # 7 features over tp = 3, balanced: 3, 2, 2 columns of fc1 and rows of fc2 (every rank busy).
    assert [r[2] for r in results[:3]] == [((10, 3), (3, 5)), ((10, 2), (2, 5)), ((10, 2), (2, 5))]


def _matmul_uneven():
    from spmdsim import DTensor, Mesh, collect_trace
    from spmdsim.nn import ops

    mesh = Mesh(Layout((2, 3), ("dp", "tp"), "chunk"), spmdsim.world())
    L = mesh.layout
    xs, ws = SeededTensor((7, 10), "float64", seed=7), SeededTensor((10, 5), "float64", seed=8)
    out = []
    # K (10) split over tp: chunk pieces 4, 4, 2; rows (7) over dp: 4, 3; columns (5) over tp: 2, 2, 1.
    for xm, wm, target in ((("dp", "tp"), ("tp", None), None), (("dp", "tp"), ("tp", None), L(("dp", "tp"), None)),
                           (("dp", None), (None, "tp"), None), ((None, "tp"), ("tp", None), L(None, "tp"))):
        x = DTensor.from_seeded(mesh, L(*xm), xs).requires_grad_()
        w = DTensor.from_seeded(mesh, L(*wm), ws).requires_grad_()
        with collect_trace() as trace:
            y = ops.matmul(x, w, out_layout=target)
        g = np.arange(35.0).reshape(7, 5) / 35
        y.backward(DTensor.from_global(mesh, g, y.layout))
        out.append((y.gather(), x.grad.gather(), w.grad.gather(), tuple(e.op for e in trace.entries)))
    return out


def test_matmul_with_uneven_contracted_and_free_dims():
    results = spmdsim.simulate(6, _matmul_uneven)
    x, w = SeededTensor((7, 10), "float64", seed=7).full(), SeededTensor((10, 5), "float64", seed=8).full()
    g = np.arange(35.0).reshape(7, 5) / 35
    for rank in results:
        for y, dx, dw, ops_traced in rank:
            np.testing.assert_allclose(y, x @ w, rtol=0, atol=1e-13)
            np.testing.assert_allclose(dx, g @ w.T, rtol=0, atol=1e-13)
            np.testing.assert_allclose(dw, x.T @ g, rtol=0, atol=1e-13)
    # The pending sums over tp: an Allreduce; onto rows split over (dp, tp), cut mesh dim by mesh dim as DTensor
    # does (the dp halves [0, 4), [4, 7), each in 3 over tp: 2, 2, 0 and 1, 1, 1 rows), a Reduce_scatter with
    # counts over tp inside each half (cut once into 6 they did not nest: an Allreduce, then an exchange); no
    # sum for column-parallel; onto 5 columns over tp, a Reduce_scatter with counts (2, 2, 1).
    assert [r[3] for r in results[0]] == [("allreduce",), ("reduce_scatter",), (), ("reduce_scatter",)]


def _embedding():
    from spmdsim import DTensor, Mesh
    from spmdsim.nn import ops

    mesh = Mesh(Layout((3,), ("tp",), "balanced"), spmdsim.world())
    table, ids = np.arange(40.0).reshape(10, 4), np.array([[0, 3, 9, 5], [4, 4, 8, 1]])
    t = DTensor.from_global(mesh, table, mesh.layout("tp", None)).requires_grad_()
    y = ops.embedding(DTensor.from_global(mesh, ids, mesh.layout(None, None)), t)
    ops.sum(y).backward()
    return y.gather(), t.grad.gather(), t.local.shape


def test_vocab_parallel_embedding_over_an_uneven_vocabulary():
    table, ids = np.arange(40.0).reshape(10, 4), np.array([[0, 3, 9, 5], [4, 4, 8, 1]])
    grad = np.zeros_like(table)
    np.add.at(grad, ids, 1.0)
    results = spmdsim.simulate(3, _embedding)
    for y, g, _ in results:
        np.testing.assert_array_equal(y, table[ids])
        np.testing.assert_array_equal(g, grad)
    assert [r[2] for r in results] == [(4, 4), (3, 4), (3, 4)]  # 10 rows balanced over 3


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_argmax_and_argmin_where_a_shard_of_the_reduced_dim_is_empty(kind):
    """A chunk cut of 3 rows over 4 shards leaves the last one empty (1, 1, 1, 0): numpy's argmax of that empty
    block raised on its rank alone (ValueError: attempt to get argmax of an empty sequence) while the others
    went on to the value's Allreduce. The empty shard now offers no candidate; every dim, the flattened
    tensor, NaN (numpy's: it wins) and integers agree with numpy."""
    from spmdsim import DTensor, Mesh
    from spmdsim.nn import ops

    rng = np.random.default_rng(4)
    floats = rng.standard_normal((3, 5))
    with_nan = floats.copy()
    with_nan[2, 3] = np.nan
    ints = rng.integers(-9, 9, (3, 5))

    def body():
        mesh = Mesh(Layout((2, 2), ("x", "y"), cut="chunk"), spmdsim.world())
        out = []
        for g in (floats, with_nan, ints):
            for tensor_map in ((("x", "y"), None), ("y", "x")):
                t = DTensor.from_global(mesh, g, mesh.layout(*tensor_map))
                for dim in (None, 0, 1):
                    out.append(getattr(ops, kind)(t, dim).gather())
        return out

    results = spmdsim.simulate(4, body)
    pick = getattr(np, kind)
    want = [pick(g, dim) for g in (floats, with_nan, ints) for _ in range(2) for dim in (None, 0, 1)]
    for got in results:
        assert [np.asarray(a).tolist() for a in got] == [np.asarray(w).tolist() for w in want]


@pytest.mark.parametrize("kind", ["max", "min", "argmax", "argmin"])
def test_bfloat16_reductions_where_a_shard_of_the_reduced_dim_is_empty(kind):
    """ml_dtypes' bfloat16 (numpy kind 'V') over a chunk cut whose last shard is empty (3 columns over 4): the
    empty shard's identity was asked of np.iinfo, which raised on that rank alone (ValueError: Invalid integer
    data type 'V'); a NaN on one rank is kept as numpy keeps it."""
    from spmdsim import DTensor, Mesh
    from spmdsim.nn import ops

    bf16 = np.dtype(pytest.importorskip("ml_dtypes").bfloat16)
    g = np.array([[0.5, -1.0, 2.0], [3.0, np.nan, -4.0]]).astype(bf16)

    def body():
        mesh = Mesh(Layout((4,), ("x",), cut="chunk"), spmdsim.world())
        t = DTensor.from_global(mesh, g, mesh.layout(None, "x"))
        return t.local.shape, getattr(ops, kind)(t, 1).gather()

    results = spmdsim.simulate(4, body)
    assert [shape for shape, _ in results] == [(2, 1)] * 3 + [(2, 0)]
    want = getattr(np, kind)(g, 1)
    for _, got in results:
        assert got.dtype == want.dtype and np.array_equal(got.astype(np.float64), want.astype(np.float64),
                                                          equal_nan=True), (got, want)


def test_a_size_one_dim_split_by_an_uneven_cut_takes_elementwise_ops_where_nothing_broadcasts_it():
    """A chunk cut of a size-1 dim over 2 ranks gives one rank the row and the other none. Every elementwise
    op refused it ("operand 0 dim 0 has size 1 but is split"), reading any size-1 dim as a broadcast one: it
    runs now where the output keeps the dim at size 1 (forward and gradients as numpy's), and a split size-1
    dim stretched to a larger one is still refused, in one line on every rank."""
    from spmdsim import DTensor, Mesh
    from spmdsim.nn import ops
    from spmdsim.errors import OperatorError

    g = np.array([[0.5, -1.0, 2.0, 0.25, -3.0]])
    h = np.cos(g)

    def body():
        mesh = Mesh(Layout((2,), ("x",), cut="chunk"), spmdsim.world())
        a = DTensor.from_global(mesh, g, mesh.layout("x", None)).requires_grad_()
        b = DTensor.from_global(mesh, h, mesh.layout("x", None)).requires_grad_()
        y = ops.exp(a) * b + ops.tanh(a)
        ops.sum(y * y).backward()
        try:
            a + DTensor.from_global(mesh, np.ones((2, 5)), mesh.layout(None, None))
            refused = None
        except OperatorError as e:
            refused = str(e)
        return y.gather(), a.grad.gather(), b.grad.gather(), a.local.shape, refused

    results = spmdsim.simulate(2, body)
    y = np.exp(g) * h + np.tanh(g)
    dy = 2 * y
    assert [r[3] for r in results] == [(1, 5), (0, 5)]  # the row on rank 0, none on rank 1
    for got, ga, gb, _, refused in results:
        assert np.allclose(got, y, rtol=1e-15, atol=0)
        assert np.allclose(ga, dy * (np.exp(g) * h + 1 - np.tanh(g) ** 2), rtol=1e-14, atol=0)
        assert np.allclose(gb, dy * np.exp(g), rtol=1e-14, atol=0)
        assert refused == 'add: operand 0 dim 0 has size 1 but is split over "x"'


def test_a_bool_operand_joins_a_pending_sum_in_the_result_dtype():
    """A bool operand the rule makes join a pending sum (its value on one replica, zeros on the others) was
    moved as a bool and refused ("a bool tensor cannot be a pending sum"), where numpy gives an answer: the
    variance of a bool whose one entry is split over 4 ranks (x minus its pending mean), and a pending integer
    sum plus a bool DTensor. It joins in the result's dtype now."""
    from spmdsim import DTensor, Mesh
    from spmdsim.nn import ops

    g, m = np.array([True]), np.array([[1, 2, 3, 4], [0, -1, 2, 5]], np.int32)

    def body():
        mesh = Mesh(Layout((4,), ("x",), cut="balanced"), spmdsim.world())
        flag = DTensor.from_global(mesh, g, mesh.layout("x"))
        ints = DTensor.from_global(mesh, m, mesh.layout("x", None))
        true = DTensor.from_global(mesh, np.array(True), mesh.layout())
        return ops.var(flag, 0).gather(), (ops.sum(ints, 0) + true).gather(), (true - ops.mean(ints, 0)).gather()

    for var, added, subtracted in spmdsim.simulate(4, body):
        assert var.dtype == np.var(g).dtype and var == 0.0
        assert added.dtype == (m.sum(0) + True).dtype and added.tolist() == [2, 2, 6, 10]
        assert subtracted.tolist() == (True - m.mean(0)).tolist()


def _empty_columns():
    """Backward where some ranks hold no columns (chunk cuts: 2 output features over 4 ranks, a (6, 1) table's
    one column over 2, a hidden layer of 2 over 3): Linear with its bias, a table split by its columns,
    ParallelMLP (fused). Each rank's gradients of an empty block reshaped its rows as numpy cannot infer them
    (``reshape(-1, 0)``: ValueError on those ranks alone)."""
    from spmdsim import DTensor, Mesh
    from spmdsim.nn import ops

    rng = np.random.default_rng(7)
    out = {}
    mesh = Mesh(Layout((spmdsim.world().size,), ("tp",), cut="chunk"), spmdsim.world())
    L = mesh.layout
    x = DTensor.from_global(mesh, rng.standard_normal((3, 3)), L(None, None)).requires_grad_()
    w = DTensor.from_global(mesh, rng.standard_normal((3, 2)), L(None, "tp")).requires_grad_()
    b = DTensor.from_global(mesh, rng.standard_normal(2), L("tp")).requires_grad_()
    y = ops.linear(x, w, b)
    ops.sum(y * y).backward()
    out["linear"] = [t.gather() for t in (y, x.grad, w.grad, b.grad)] + [w.local.shape]
    table = DTensor.from_global(mesh, np.arange(6.0).reshape(6, 1), L(None, "tp")).requires_grad_()
    ids = DTensor.from_global(mesh, np.array([[0, 2, 2]]), L(None, None))
    ops.sum(ops.embedding(ids, table)).backward()
    out["embedding"] = table.grad.gather()
    mlp = ops.ParallelMLP(mesh, 4, 2, activation="relu", dtype="float64", seed=3)
    h = DTensor.from_global(mesh, rng.standard_normal((5, 4)), L(None, None)).requires_grad_()
    ops.sum(mlp(h)).backward()
    fc1, fc2 = mlp.linear_fc1, mlp.linear_fc2
    out["mlp"] = [t.gather() for t in (h, fc1.weight, fc1.bias, fc2.weight, h.grad, fc1.weight.grad, fc1.bias.grad,
                                      fc2.weight.grad, fc2.bias.grad)] + [fc1.weight.local.shape]
    return out


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_backward_where_a_rank_holds_no_columns(ranks):
    results = spmdsim.simulate(ranks, _empty_columns)
    first = results[0]
    y, gx, gw, gb, _ = first["linear"]
    rng = np.random.default_rng(7)
    x, w, b = rng.standard_normal((3, 3)), rng.standard_normal((3, 2)), rng.standard_normal(2)
    dy = 2 * (x @ w + b)
    np.testing.assert_allclose(y, x @ w + b, rtol=1e-14, atol=1e-15)
    np.testing.assert_allclose(gx, dy @ w.T, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(gw, x.T @ dy, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(gb, dy.sum(0), rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(first["embedding"], [[1.0], [0.0], [2.0], [0.0], [0.0], [0.0]])
    h, w1, b1, w2, gh, gw1, gb1, gw2, gb2, _ = first["mlp"]
    a = h @ w1 + b1
    dz = (a > 0) * (np.ones((5, 4)) @ w2.T)
    np.testing.assert_allclose(gh, dz @ w1.T, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(gw1, h.T @ dz, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(gb1, dz.sum(0), rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(gw2, np.maximum(a, 0).T @ np.ones((5, 4)), rtol=1e-13, atol=1e-14)
    np.testing.assert_array_equal(gb2, np.full(4, 5.0))
    # Some rank holds no column of w (2 over `ranks`, chunk) and of fc1's 2 hidden features once ranks > 2.
    assert min(r["linear"][-1][1] for r in results) == (0 if ranks > 2 else 1)
    assert min(r["mlp"][-1][1] for r in results) == (0 if ranks > 2 else 1)
    for r in results[1:]:  # every rank gathered the same
        for key in ("linear", "mlp"):
            for mine, theirs in zip(r[key][:-1], first[key][:-1]):
                np.testing.assert_array_equal(mine, theirs)


def test_placements_of_a_tensor_dtensor_would_cut_otherwise_are_refused():
    """`DTensor.placements` gave (S(0), S(0)) for a balanced cut that does not divide, which DTensor cannot make;
    the property refuses it as `slices` and `convert` do. 6 rows cut "chunk" over 2 x 2 are cut mesh dim by mesh
    dim as DTensor cuts them (2, 1, 2, 1 rows), so they have placements (spmdsim cut them 2, 2, 2, 0 once and
    refused them)."""
    from spmdsim import DTensor, Mesh
    from spmdsim.layouts.dialects import placements_to_layout
    from spmdsim.layouts.dialects.dtensor import Replicate, Shard
    from spmdsim.errors import DialectError

    def body():
        out = []
        for cut, spec, n in [("chunk", "S(0), S(0)", 6), ("balanced", None, 6), ("balanced", None, 8),
                             ("chunk", "S(0), R", 5), ("chunk", "S(0), S(0)", 8)]:
            mesh = Mesh(Layout((2, 2), ("dp", "tp"), cut=cut), spmdsim.world())
            layout = placements_to_layout(spec, mesh, 1) if cut == "chunk" else mesh.layout(("dp", "tp"))
            x = DTensor.from_global(mesh, np.arange(float(n)), layout)
            try:
                out.append(x.placements)
            except DialectError as e:
                out.append(str(e))
        return out

    got = spmdsim.simulate(4, body)
    assert all(r == got[0] for r in got)
    assert got[0] == [
        (Shard(0), Shard(0)),
        "tensor dim 0 of size 6 is cut 'balanced' into 4 unequal pieces: DTensor cuts a dim that does not divide "
        "by torch.chunk's rule only, so these placements would name another cut; expected a size that divides, "
        "or cut 'chunk'",
        (Shard(0), Shard(0)), (Shard(0), Replicate()), (Shard(0), Shard(0))]


def test_stack_and_getitem_keep_a_split_dim_of_size_one():
    """A dim of size 1 cut "chunk" over 4 ranks: rank 0 holds its row, the others nothing. `stack` (a reshape
    adding a dim of size 1, then a join) and ``x[-2:, -1, 1]`` (narrows, then a reshape dropping dims of size 1)
    were refused, the latter after its narrow had already moved rows; now both run, forward and gradients as
    numpy's."""
    from spmdsim import DTensor, Mesh
    from spmdsim.nn import ops

    g, h = np.array([[0.5, -1.0, 2.0]]), np.array([[1.5, 0.25, -3.0]])
    up = np.arange(6.0).reshape(1, 2, 3) / 6

    def body():
        mesh = Mesh(Layout((4,), ("x",), cut="chunk"), spmdsim.world())
        L = mesh.layout
        a = DTensor.from_global(mesh, g, L("x", None)).requires_grad_()
        b = DTensor.from_global(mesh, h, L("x", None)).requires_grad_()
        s = ops.stack([a, b], 1)
        s.backward(DTensor.from_global(mesh, up, L(None, None, None)))
        c = DTensor.from_global(mesh, g.reshape(1, 1, 3), L("x", None, None)).requires_grad_()
        y = c[-2:, -1, 1] * 3.0
        ops.sum(y).backward()
        return s.gather(), str(s.layout), a.grad.gather(), b.grad.gather(), y.gather(), str(y.layout), c.grad.gather()

    for s, s_layout, ga, gb, y, y_layout, gc in spmdsim.simulate(4, body):
        np.testing.assert_array_equal(s, np.stack([g, h], 1))
        assert s_layout == '("x", None, None)'
        np.testing.assert_array_equal(ga, up[:, 0])
        np.testing.assert_array_equal(gb, up[:, 1])
        np.testing.assert_array_equal(y, g.reshape(1, 1, 3)[-2:, -1, 1] * 3.0)
        assert y_layout == '("x",)'
        np.testing.assert_array_equal(gc, [[[0.0, 3.0, 0.0]]])


def test_an_index_whose_reshape_is_refused_moves_nothing_first():
    """``x[i, a:b, c:c]`` narrows dim by dim, then reshapes: an empty result of split dims was refused by the
    reshape after the narrows had run their Alltoallv, in terms of a reshape the user never wrote. Now the whole
    index is checked first: refused on every rank, naming the index, before any collective."""
    from spmdsim import DTensor, Mesh, collect_trace
    from spmdsim.errors import OperatorError

    def body():
        mesh = Mesh(Layout((2, 2), ("a", "b"), cut="chunk"), spmdsim.world())
        x = DTensor.from_global(mesh, np.ones((5, 5, 5)), mesh.layout("a", "b", None))
        with collect_trace() as trace:
            try:
                x[-4, 2:-6, 1:1]
            except OperatorError as e:
                return str(e), len(trace.entries)
        return None

    assert spmdsim.simulate(4, body) == [(
        'x[-4, 2:-6, 1:1]: reshape of an empty tensor (1, 0, 0) mapped (None, "b", None): make every dim whole '
        "first", 0)] * 4
