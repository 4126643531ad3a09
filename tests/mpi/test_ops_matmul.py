"""MatMul under MPI: MindSpore strategies, Layout tuples, transposes, batches, out_strategy."""
from __future__ import annotations

import engines
import pytest

from spmdsim import Layout, OperatorError, SeededTensor
from spmdsim.layouts.dialects.strategy import matmul_layouts
from spmdsim.programs.infer import out_layout_from_strategy
from spmdsim.references.forward import matmul_region, matmul_rounding

pytestmark = pytest.mark.mpi(min_size=2)

DTYPES = ("float32", "float64")

# Strategies per world size; shapes below divide all of them and are not powers of two.
STRATEGIES = {
    8: ["((2,1),(1,4))", "((2,4),(4,1))", "((1,8),(8,1))", "((2,2),(2,2))", "((1,2),(2,1))"],
    4: ["((2,1),(1,2))", "((2,2),(2,1))", "((1,4),(4,1))", "((1,2),(2,1))"],
    2: ["((2,1),(1,1))", "((1,2),(2,1))"],
}


def _world():
    return engines.world()  # MPI.COMM_WORLD, or the simulated rank's (tests/engines.py)


def _strategies():
    return STRATEGIES.get(_world().size, [])


def _run(x_layout, w_layout, x_shape, w_shape, dtype, **kw):
    """Run matmul on seeded data; return (out DTensor, verdict, per-rank collective counts)."""
    from spmdsim.nn.ops import matmul
    from spmdsim.runtime import DTensor, Mesh, collect_trace

    mesh = Mesh(x_layout.layout, _world())
    xs, ws = SeededTensor(x_shape, dtype, seed=3), SeededTensor(w_shape, dtype, seed=4)
    x = DTensor.from_seeded(mesh, x_layout, xs)
    w = DTensor.from_seeded(mesh, w_layout, ws)
    with collect_trace() as tr:
        out = matmul(x, w, **kw)
    ta, tb = kw.get("transpose_a", False), kw.get("transpose_b", False)
    # The magnitudes that entered each output (|x| @ |w|), not contraction_atol(K): at 8 ranks the Layout
    # tuple's K = 784 summed largest products first is 1.2x beyond K eps + 1e-4 |y| (tests/test_ops_cli.py).
    rtol, scale = matmul_rounding(xs, ws, ta, tb)
    verdict = out.check(matmul_region(xs, ws, ta, tb), rtol=rtol, scale=scale)
    mesh.close()
    return out, verdict, tr.counts()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index", range(5))
def test_mindspore_strategies(index, dtype):
    strategies = _strategies()
    if index >= len(strategies):
        pytest.skip("no such strategy at this world size")
    m = matmul_layouts(strategies[index], _world().size)
    out, verdict, counts = _run(m.x, m.w, (24, 40), (40, 36), dtype)
    assert verdict.passed, verdict
    assert out.layout == m.reduced_out and out.local.dtype.name == dtype
    k_split = m.layout.axis_size("k") > 1
    assert counts == ({"allreduce": 1} if k_split else {})


@pytest.mark.parametrize("dtype", DTYPES)
def test_out_strategy_reduce_scatter(dtype):
    strategies = [s for s in _strategies() if matmul_layouts(s, _world().size).layout.axis_size("k") > 1]
    m = matmul_layouts(strategies[0], _world().size)
    counts = m.x.shards_per_dim[0] * m.layout.axis_size("k"), m.w.shards_per_dim[1]
    out_layout = out_layout_from_strategy(m.out, counts)
    out, verdict, trace = _run(m.x, m.w, (24, 40), (40, 36), dtype, out_layout=out_layout)
    assert verdict.passed, verdict
    assert out.layout == out_layout and trace == {"reduce_scatter": 1}
    assert out.local.shape[0] == 24 // counts[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_layout_tuple(dtype):
    size = _world().size
    if size == 8:
        layout = Layout((2, 2, 2), ("dp", "sp", "mp"))
        x_l, w_l = layout("mp", ("sp", "dp")), layout(("sp", "dp"), None)
        x_shape, w_shape = (32, 784), (784, 40)
    elif size == 4:
        layout = Layout((2, 2), ("sp", "dp"))
        x_l, w_l = layout(None, ("sp", "dp")), layout(("sp", "dp"), None)
        x_shape, w_shape = (6, 44), (44, 10)
    else:
        pytest.skip("needs 4 or 8 ranks")
    out, verdict, counts = _run(x_l, w_l, x_shape, w_shape, dtype)
    assert verdict.passed, verdict
    assert counts == {"allreduce": 1} and not out.layout.partial
    if size == 8 and out.mesh.rank == 2:  # (dp, sp, mp) = (0, 1, 0): seed table row
        assert out.layout.slices(2, out.global_shape)[0] == slice(0, 16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ta, tb", [(True, False), (False, True), (True, True)])
def test_transposes(ta, tb, dtype):
    size = _world().size
    a, k = (2, size // 2)
    xs = (k, a) if ta else (a, k)
    ws = (1, k) if tb else (k, 1)
    m = matmul_layouts((xs, ws), size, transpose_a=ta, transpose_b=tb)
    x_shape = (40, 6) if ta else (6, 40)
    w_shape = (10, 40) if tb else (40, 10)
    out, verdict, counts = _run(m.x, m.w, x_shape, w_shape, dtype, transpose_a=ta, transpose_b=tb)
    assert verdict.passed, verdict
    assert out.global_shape == (6, 10)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batched_w", [True, False])
def test_batched(batched_w, dtype):
    size = _world().size
    k = size // 4 if size >= 4 else 1
    strategy = ((2, 2, k), (2, k, 1)) if batched_w else ((2, 2, k), (k, 1))
    m = matmul_layouts(strategy, size)
    w_shape = (6, 12, 5) if batched_w else (12, 5)
    out, verdict, _ = _run(m.x, m.w, (6, 10, 12), w_shape, dtype)
    assert verdict.passed, verdict
    assert out.global_shape == (6, 10, 5)


def test_pending_sum_is_kept_and_checks_after_summing():
    m = matmul_layouts(_strategies()[-1], _world().size)
    out, verdict, counts = _run(m.x, m.w, (24, 40), (40, 36), "float64", reduce=False)
    assert out.layout.partial == ("k",) and counts == {}
    assert verdict.passed, verdict


def test_inconsistent_layouts_raise_on_every_rank_before_communicating():
    from spmdsim.nn.ops import matmul
    from spmdsim.runtime import DTensor, Mesh, collect_trace

    size = _world().size
    layout = Layout((2, size // 2), ("dp", "mp"))
    mesh = Mesh(layout, _world())
    x = DTensor.from_seeded(mesh, layout("dp", "mp"), SeededTensor((8, 12), "float32"))
    w = DTensor.from_seeded(mesh, layout("dp", None), SeededTensor((12, 6), "float32"))
    with collect_trace() as tr, pytest.raises(OperatorError, match="contraction dim K"):
        matmul(x, w)
    w_bad = DTensor.from_seeded(mesh, layout(None, None), SeededTensor((10, 6), "float32"))
    with pytest.raises(Exception, match="contraction sizes differ"):
        matmul(x.__class__.from_seeded(mesh, layout("dp", None), SeededTensor((8, 12), "float32")),
               w_bad)
    assert len(tr) == 0
    mesh.close()
