"""Linear, Embedding, elementwise ops, the fused MLP and the Paddle split front end under MPI."""
from __future__ import annotations

import numpy as np
import engines
import pytest

from spmdsim import Layout, OperatorError, SeededTensor
from spmdsim.errors import ShapeError
from spmdsim.tools.demo.jobs import contraction_atol
from spmdsim.references.forward import embedding_region, linear_region

pytestmark = pytest.mark.mpi(min_size=2)

DTYPES = ("float32", "float64")


def _world():
    return engines.world()  # MPI.COMM_WORLD, or the simulated rank's (tests/engines.py)


@engines.per_rank
def mesh2d():
    """(dp, mp) = (2, size/2) mesh."""
    from spmdsim.runtime import Mesh

    m = Mesh(Layout((2, _world().size // 2), ("dp", "mp")), _world())
    yield m
    m.close()


def _dt(mesh, layout, src):
    from spmdsim.runtime import DTensor

    return DTensor.from_seeded(mesh, layout, src)


def _traced(fn):
    from spmdsim.runtime import collect_trace

    with collect_trace() as tr:
        out = fn()
    return out, tr.counts()


# -- Linear -------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gather", [False, True])
def test_column_parallel_linear(mesh2d, dtype, gather):
    from spmdsim.nn.ops import ColumnParallelLinear

    p = mesh2d.layout.axis_size("mp")
    xs = SeededTensor((6, 20), dtype, seed=1)
    x = _dt(mesh2d, mesh2d.layout("dp", None), xs)
    layer = ColumnParallelLinear(mesh2d, 20, 3 * p, gather_output=gather, axes="mp", dtype=dtype)
    out, counts = _traced(lambda: layer(x))
    assert counts == ({"allgather": 1} if gather else {})
    assert out.layout == mesh2d.layout("dp", None if gather else "mp")
    verdict = out.check(layer.reference(xs), atol=contraction_atol(20, dtype))
    assert verdict.passed, verdict


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("input_is_parallel", [False, True])
def test_row_parallel_linear_adds_bias_once(mesh2d, dtype, input_is_parallel):
    from spmdsim.nn.ops import RowParallelLinear

    p = mesh2d.layout.axis_size("mp")
    xs = SeededTensor((6, 5 * p), dtype, seed=1)
    x = _dt(mesh2d, mesh2d.layout("dp", "mp" if input_is_parallel else None), xs)
    layer = RowParallelLinear(mesh2d, 5 * p, 7, input_is_parallel=input_is_parallel,
                              axes="mp", dtype=dtype, seed=5)
    out, counts = _traced(lambda: layer(x))
    assert counts == {"allreduce": 1}
    assert out.layout == mesh2d.layout("dp", None)
    verdict = out.check(layer.reference(xs), atol=contraction_atol(5 * p, dtype))
    assert verdict.passed, verdict
    # Bias added p times would be off by (p - 1) * bias: the check above excludes it.
    assert np.abs(layer.bias.local).max() > 0.01


def test_row_linear_pending_sum_folds_bias_on_one_rank(mesh):
    from spmdsim.nn.ops import linear

    p = mesh.size
    xs, ws, bs = (SeededTensor(s, "float64", seed=i) for i, s in
                  enumerate([(4, 3 * p), (3 * p, 5), (5,)]))
    x = _dt(mesh, mesh.layout(None, "mp"), xs)
    w = _dt(mesh, mesh.layout("mp", None), ws)
    b = _dt(mesh, mesh.layout(None), bs)
    out, counts = _traced(lambda: linear(x, w, b, reduce=False))
    assert out.layout.partial == ("mp",) and counts == {}
    assert out.check(linear_region(xs, ws, bs)).passed


def test_linear_layout_errors(mesh):
    from spmdsim.nn.ops import linear

    x = _dt(mesh, mesh.layout(None, None), SeededTensor((4, 8), "float32"))
    w = _dt(mesh, mesh.layout(None, "mp"), SeededTensor((8, 2 * mesh.size), "float32"))
    b = _dt(mesh, mesh.layout(None), SeededTensor((2 * mesh.size,), "float32"))
    with pytest.raises(OperatorError, match="bias .* must be split like the output"):
        linear(x, w, b)
    # Plans are cached per layouts and shapes; a failed check is not, so it raises every time.
    wrong = _dt(mesh, mesh.layout("mp"), SeededTensor((mesh.size,), "float32"))
    for _ in range(2):
        with pytest.raises(ShapeError, match=r"bias of shape \(\d+,\) does not match out_features"):
            linear(x, w, wrong)
    good = _dt(mesh, mesh.layout("mp"), SeededTensor((2 * mesh.size,), "float32"))
    assert linear(x, w, good).check(linear_region(
        SeededTensor((4, 8), "float32"), SeededTensor((8, 2 * mesh.size), "float32"),
        SeededTensor((2 * mesh.size,), "float32"))).passed


# -- Embedding ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_vocab_parallel_embedding(mesh, dtype):
    from spmdsim.nn.ops import VocabParallelEmbedding

    vocab = 13 * mesh.size
    ids_src = SeededTensor((5, 3), "int64", seed=2, low=0, high=vocab)
    ids = _dt(mesh, mesh.layout(None, None), ids_src)
    layer = VocabParallelEmbedding(mesh, vocab, 6, dtype=dtype, seed=9)
    assert layer.padded_weight.shape == (14, 6) and not layer.padded_weight[-1].any()
    assert layer.vocab_end_index - layer.vocab_start_index == 13
    out, counts = _traced(lambda: layer(ids))
    assert counts == {"allreduce": 1}
    verdict = out.check(layer.reference(ids_src))
    assert verdict.passed and verdict.max_abs_error == 0.0, verdict


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gather", [True, False])
def test_dim_parallel_embedding_and_dp_split_ids(mesh2d, gather, dtype):
    from spmdsim.nn.ops import embedding

    p = mesh2d.layout.axis_size("mp")
    ids_src = SeededTensor((6,), "int64", seed=2, low=0, high=30)
    table_src = SeededTensor((30, 2 * p), dtype, seed=3)
    ids = _dt(mesh2d, mesh2d.layout("dp"), ids_src)
    table = _dt(mesh2d, mesh2d.layout(None, "mp"), table_src)
    out, counts = _traced(lambda: embedding(ids, table, gather_out=gather))
    assert counts == ({"allgather": 1} if gather else {})
    assert out.layout == mesh2d.layout("dp", None if gather else "mp")
    assert out.check(embedding_region(ids_src, table_src)).passed


def test_parallel_embedding_layer(mesh):
    from spmdsim.nn.ops import ParallelEmbedding

    ids_src = SeededTensor((4, 3), "int64", seed=2, low=0, high=11)
    ids = _dt(mesh, mesh.layout(None, None), ids_src)
    layer = ParallelEmbedding(mesh, 11, 3 * mesh.size, dtype="float32", seed=5)
    assert layer.weight.local.shape == (11, 3)
    out, counts = _traced(lambda: layer(ids))
    assert counts == {"allgather": 1} and out.layout == mesh.layout(None, None, None)
    assert out.check(layer.reference(ids_src)).max_abs_error == 0.0


@pytest.mark.parametrize("bad", ["high", "negative", "float"])
def test_bad_ids_raise_on_every_rank_before_communicating(mesh, bad):
    from spmdsim.nn.ops import VocabParallelEmbedding
    from spmdsim.runtime import DTensor

    layer = VocabParallelEmbedding(mesh, 4 * mesh.size, 3)
    values = {"high": [1, 4 * mesh.size], "negative": [-1, 2], "float": [1.0, 2.0]}[bad]
    ids = DTensor(mesh, np.array(values), mesh.layout(None), (2,))
    match = "must be integers" if bad == "float" else r"outside \[0, "
    from spmdsim.runtime import collect_trace

    with collect_trace() as tr, pytest.raises(OperatorError, match=match):
        layer(ids)
    assert len(tr) == 0  # raised before the Allreduce, on every rank


# -- elementwise and MLP ----------------------------------------------------------
def test_elementwise_keep_layout_and_reject_pending_sums(mesh2d):
    from spmdsim.nn.ops import add, bias_add, gelu, relu
    from spmdsim.references.forward import gelu as ref_gelu, relu as ref_relu

    src = SeededTensor((4, 2 * mesh2d.layout.axis_size("mp")), "float64", seed=1)
    x = _dt(mesh2d, mesh2d.layout("dp", "mp"), src)
    for op, ref in ((relu, ref_relu), (gelu, ref_gelu)):
        y = op(x)
        assert y.layout == x.layout
        assert y.check(lambda region, ref=ref: ref(src.region(region))).passed
    bsrc = SeededTensor((src.shape[1],), "float64", seed=2)
    b = _dt(mesh2d, mesh2d.layout("mp"), bsrc)
    assert bias_add(x, b).check(lambda r: src.region(r) + bsrc.region(r[-1:])).passed
    pending = _dt(mesh2d, mesh2d.layout("dp", None, partial=("mp",)), SeededTensor((4, 6), "float64"))
    # relu of a pending sum adds it up first (relu(a) + relu(b) != relu(a + b)).
    r = relu(pending)
    assert not r.layout.partial and r.check(lambda g: np.maximum(SeededTensor((4, 6), "float64").region(g), 0)).passed
    # pending + replicated: the replicated term joins the sum on one replica, so it is counted once.
    mixed = add(pending, _dt(mesh2d, mesh2d.layout("dp", None), SeededTensor((4, 6), "float64")))
    assert mixed.check(lambda g: 2 * SeededTensor((4, 6), "float64").region(g)).passed
    twice = add(pending, pending)  # pending + pending over the same axes stays right
    assert twice.layout.partial == ("mp",)
    assert twice.check(lambda r: 2 * SeededTensor((4, 6), "float64").region(r)).passed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_mlp_uses_exactly_one_allreduce(mesh, dtype, act):
    from spmdsim.nn.ops import ParallelMLP

    p = mesh.size
    xs = SeededTensor((5, 18), dtype, seed=1)
    x = _dt(mesh, mesh.layout(None, None), xs)
    mlp = ParallelMLP(mesh, 18, 9 * p, activation=act, dtype=dtype, seed=4)
    out, counts = _traced(lambda: mlp(x))
    assert counts == {"allreduce": 1}
    # Two contractions in a chain: the tolerance follows the magnitudes that entered each output
    # (ParallelMLP.rounding), not one sum of 9p products of values in [-1, 1).
    rtol, scale = mlp.rounding(xs)
    verdict = out.check(mlp.reference(xs), rtol=rtol, scale=scale)
    assert verdict.passed, verdict


def test_sequence_parallel_mlp_allgathers_and_reduce_scatters(mesh2d):
    # Megatron's sequence parallelism on a (dp, mp) mesh: x [s, b, h] split on the sequence
    # over mp and on the batch over dp; fc1 Allgathers the sequence, fc2 Reduce_scatters it
    # back, and the Allreduce is gone. The bias is added once, to each rank's own rows.
    from spmdsim.nn.ops import ColumnParallelLinear, ParallelMLP, RowParallelLinear

    L, mp = mesh2d.layout, mesh2d.layout.device_matrix[1]
    s, b, h = 2 * mp, 2, 6
    xs = SeededTensor((s, b, h), "float64", seed=1)
    x = _dt(mesh2d, L("mp", "dp", None), xs)
    mlp = ParallelMLP(mesh2d, h, 4 * mp, sequence_parallel=True, axes="mp", dtype="float64", seed=4)
    from spmdsim.runtime import collect_trace

    with collect_trace() as trace:
        out = mlp(x)
    assert out.layout == x.layout
    assert out.check(mlp.reference(xs)).passed
    calls = [(e.op, e.axes) for e in trace.entries if e.group_size > 1]
    assert calls == ([("allgather", ("mp",)), ("reduce_scatter", ("mp",))] if mp > 1 else [])
    # The same layers without sequence parallelism give the same values through one Allreduce.
    plain = ParallelMLP(mesh2d, h, 4 * mp, axes="mp", dtype="float64", seed=4)
    whole = plain(_dt(mesh2d, L(None, "dp", None), xs))
    assert np.allclose(whole.local[out.slices[0]], out.local)
    # Layer-level refusals name the flag and the layout they expected.
    col = ColumnParallelLinear(mesh2d, h, 4 * mp, sequence_parallel=True, axes="mp")
    with pytest.raises(OperatorError, match=r"sequence_parallel=True\) expects x .* dim 0 .* split over \('mp',\)"):
        col(_dt(mesh2d, L(None, "dp", None), SeededTensor((s, b, h), seed=2)))
    with pytest.raises(OperatorError, match="needs input_is_parallel=True"):
        RowParallelLinear(mesh2d, 4 * mp, h, sequence_parallel=True, axes="mp")
    row = RowParallelLinear(mesh2d, 4 * mp, h, input_is_parallel=True, sequence_parallel=True, axes="mp")
    with pytest.raises(OperatorError, match=r"dim 0 \(the sequence, \[s, b, h\]\) whole"):
        row(_dt(mesh2d, L("mp", "dp", None), SeededTensor((s, b, 4 * mp), seed=3)))


def test_layer_and_add_errors_name_the_sizes(mesh2d):
    from spmdsim.nn.ops import ColumnParallelLinear, RowParallelLinear, add

    L, mp = mesh2d.layout, mesh2d.layout.device_matrix[1]
    x = _dt(mesh2d, L(None, None), SeededTensor((4, 24), seed=1))
    for layer in (ColumnParallelLinear(mesh2d, 32, 4 * mp, axes="mp"),
                  RowParallelLinear(mesh2d, 32, 4 * mp, axes="mp")):
        with pytest.raises(ShapeError, match=r"has input_size 32 but x of shape \(4, 24\) has 24 features"):
            layer(x)
    scores = _dt(mesh2d, L("dp", None, None), SeededTensor((2, 4, 4), seed=2))
    with pytest.raises(ShapeError, match=r"add: shapes \(2, 4, 4\), \(3, 4\) do not broadcast"):
        add(scores, _dt(mesh2d, L(None, None), SeededTensor((3, 4), seed=3)))


# -- Paddle split -----------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis, gather", [(0, True), (1, True), (1, False)])
def test_paddle_split_linear(dtype, axis, gather):
    from spmdsim.nn.ops import paddle_mesh, split

    p = _world().size // 2
    mesh = paddle_mesh(p)
    assert mesh.layout == Layout((2, p), ("dp", "mp"))
    xs = SeededTensor((6, 3 * p), dtype, seed=1)
    ws, bs = SeededTensor((3 * p, 2 * p), dtype, seed=2), SeededTensor((2 * p,), dtype, seed=3)
    x = _dt(mesh, mesh.layout("dp", None), xs)
    out, counts = _traced(lambda: split(x, (3 * p, 2 * p), "linear", axis=axis,
                                        num_partitions=p, gather_out=gather,
                                        weight_attr=ws, bias_attr=bs))
    expected = {"allreduce": 1} if axis == 0 else ({"allgather": 1} if gather else {})
    assert counts == expected
    assert out.check(linear_region(xs, ws, bs), atol=contraction_atol(3 * p, dtype)).passed
    mesh.close()


def test_paddle_split_embedding_and_errors():
    from spmdsim.nn.ops import paddle_mesh, split

    p = _world().size
    mesh = paddle_mesh(p)
    ids_src = SeededTensor((10, 4), "int64", seed=1, low=0, high=8 * p)
    table = SeededTensor((8 * p, 8), "float32", seed=2)
    ids = _dt(mesh, mesh.layout(None, None), ids_src)
    out, counts = _traced(lambda: split(ids, (8 * p, 8), "embedding", num_partitions=p,
                                        weight_attr=table))
    assert counts == {"allreduce": 1} and out.global_shape == (10, 4, 8)
    assert out.check(embedding_region(ids_src, table)).passed
    with pytest.raises(OperatorError, match="needs a mesh axis 'mp'"):
        split(ids, (8 * p, 8), "embedding", num_partitions=p // 2)
    with pytest.raises(Exception, match="not divisible by num_partitions"):
        split(ids, (8 * p + 1, 8), "embedding", num_partitions=p)
    mesh.close()
