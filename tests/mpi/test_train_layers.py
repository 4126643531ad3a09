"""Gradients of the layers (Megatron's linear layers, embeddings, ParallelMLP with sequence
parallelism, Paddle's split) against central differences, optimizers and bad input."""
from __future__ import annotations

import engines
import numpy as np
import pytest
from trainkit import check_grads, dt, mse_check

from spmdsim import Layout, OperatorError
from spmdsim.references import forward as reference

pytestmark = pytest.mark.mpi(min_size=4)


def _world():
    return engines.world()  # MPI.COMM_WORLD, or the simulated rank's (tests/engines.py)


@engines.per_rank
def mesh():
    """(dp, mp) = (2, size/2) mesh."""
    from spmdsim.runtime import Mesh

    m = Mesh(Layout((2, _world().size // 2), ("dp", "mp")), _world())
    yield m
    m.close()


def _assert(verdicts):
    for v in verdicts:
        assert v.passed, v


def _full(*tensors):
    return [t.gather() for t in tensors]


@pytest.mark.parametrize("gather_output", [False, True])
def test_column_then_row_parallel_linear(mesh, gather_output):
    from spmdsim.nn.ops import ColumnParallelLinear, RowParallelLinear

    p = mesh.layout.axis_size("mp")
    fc1 = ColumnParallelLinear(mesh, 5, 2 * p, gather_output=gather_output, axes="mp", dtype="float64", seed=1)
    fc2 = RowParallelLinear(mesh, 2 * p, 3, input_is_parallel=not gather_output, axes="mp",
                            dtype="float64", seed=3)
    x = dt(mesh, np.random.default_rng(0).standard_normal((4, 5)), mesh.layout("dp", None), grad=True)
    tensors = [x, fc1.weight, fc1.bias, fc2.weight, fc2.bias]
    y = fc2(fc1(x))
    ref = lambda x, w1, b1, w2, b2: reference.linear(reference.linear(x, w1, b1), w2, b2)  # noqa: E731
    _assert(mse_check(mesh, tensors, _full(*tensors), y, ref))


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_parallel_mlp(mesh, sequence_parallel):
    from spmdsim.nn.ops import ParallelMLP

    p = mesh.layout.axis_size("mp")
    mlp = ParallelMLP(mesh, 4, 2 * p, sequence_parallel=sequence_parallel, axes="mp", dtype="float64", seed=2)
    x_map = ("mp", "dp", None) if sequence_parallel else (None, "dp", None)
    x = dt(mesh, np.random.default_rng(1).standard_normal((p, 2, 4)), mesh.layout(*x_map), grad=True)
    fc1, fc2 = mlp.linear_fc1, mlp.linear_fc2
    tensors = [x, fc1.weight, fc1.bias, fc2.weight, fc2.bias]
    from spmdsim.runtime import collect_trace

    y = mlp(x)
    ref = lambda x, w1, b1, w2, b2: reference.mlp(x, w1, b1, w2, b2, "gelu")  # noqa: E731
    target = np.zeros(y.global_shape)
    from spmdsim.nn.ops import mse_loss

    loss = mse_loss(y, dt(mesh, target, y.layout))
    with collect_trace() as trace:
        verdicts = check_grads(tensors, _full(*tensors), lambda *a: float(np.mean(ref(*a) ** 2)), loss)
    _assert(verdicts)
    counts = trace.counts()
    if sequence_parallel:  # Reduce_scatter <-> Allgather swap places in the backward
        assert counts.get("allgather") == 1 and counts.get("reduce_scatter") == 1, counts


@pytest.mark.parametrize("kind", ["vocab", "dim_gather", "dim_split"])
def test_embeddings(mesh, kind):
    from spmdsim.nn.ops import ParallelEmbedding, VocabParallelEmbedding

    p = mesh.layout.axis_size("mp")
    if kind == "vocab":
        layer = VocabParallelEmbedding(mesh, 2 * p, 3, axes="mp", dtype="float64", seed=4)
    else:
        layer = ParallelEmbedding(mesh, 5, 2 * p, gather_output=kind == "dim_gather", axes="mp",
                                  dtype="float64", seed=4)
    ids_g = np.random.default_rng(2).integers(0, layer.weight.global_shape[0], (4, 3))
    ids = dt(mesh, ids_g, mesh.layout("dp", None))
    y = layer(ids)
    _assert(mse_check(mesh, [layer.weight], _full(layer.weight), y, lambda t: t[ids_g]))


def test_paddle_split_input_gradient():
    from spmdsim.nn.ops import paddle_mesh, split

    p = _world().size
    mesh = paddle_mesh(p)
    x = dt(mesh, np.random.default_rng(3).standard_normal((2, 4)), mesh.layout(None, None), grad=True)
    col = split(x, (4, 2 * p), "linear", axis=1, num_partitions=p, gather_out=False, weight_attr=5)
    y = split(col, (2 * p, 3), "linear", axis=0, num_partitions=p, weight_attr=7)
    from spmdsim.layouts.datagen import SeededTensor

    w1, b1 = SeededTensor((4, 2 * p), "float64", 5).full(), SeededTensor((2 * p,), "float64", 1).full()
    w2, b2 = SeededTensor((2 * p, 3), "float64", 7).full(), SeededTensor((3,), "float64", 1).full()
    _assert(mse_check(mesh, [x], _full(x), y, lambda a: reference.linear(reference.linear(a, w1, b1), w2, b2)))
    mesh.close()


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_optimizer_updates_the_vocab_table_the_lookup_reads(mesh, optimizer):
    from spmdsim.nn.ops import VocabParallelEmbedding, mse_loss
    from spmdsim.nn.optim import SGD, Adam

    p = mesh.layout.axis_size("mp")
    layer = VocabParallelEmbedding(mesh, 2 * p, 3, axes="mp", dtype="float64", seed=4)
    table = layer.weight.gather()
    ids_g = np.arange(2 * p).reshape(2, p)
    ids = dt(mesh, ids_g, mesh.layout("dp", None))
    opt = SGD([layer.weight], lr=0.1, momentum=0.5) if optimizer == "sgd" else Adam([layer.weight], lr=0.1)
    y = layer(ids)
    mse_loss(y, dt(mesh, np.zeros(y.global_shape), y.layout)).backward()
    opt.step()
    grad = 2.0 * table / (ids_g.size * 3)  # d mean(t[ids]^2) / dt = 2 t / n: each id once
    # Adam's first step: m_hat = g, v_hat = g^2, so lr * g / (|g| + eps).
    expected = table - 0.1 * (grad if optimizer == "sgd" else grad / (np.abs(grad) + 1e-8))
    verdict = layer(ids).check(expected[ids_g], rtol=1e-9, atol=1e-12)
    assert verdict.passed, verdict
    opt.zero_grad()
    assert layer.weight.grad is None


def _adamw_formula(p, grads, lr, b1, b2, eps, wd):
    """torch.optim.AdamW written out in numpy: the parameter after each of `grads` in turn."""
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        p = p * (1 - lr * wd)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g**2
        p = p - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return p


@pytest.mark.parametrize("decay", ["default", "predicate", "iterable"])
def test_adamw_matches_its_formula_on_split_and_replicated_parameters(mesh, decay):
    from spmdsim.nn.ops import mse_loss
    from spmdsim.nn.optim import AdamW

    p = mesh.layout.axis_size("mp")
    rng = np.random.default_rng(11)
    w0, b0 = rng.standard_normal((4, 2 * p)), rng.standard_normal(2 * p)
    w = dt(mesh, w0, mesh.layout("dp", "mp"), grad=True)
    b = dt(mesh, b0, mesh.layout(None), grad=True)
    choose = {"default": None, "predicate": lambda t: len(t.global_shape) == 2, "iterable": [w]}[decay]
    lr, betas, eps, wd = 0.05, (0.8, 0.95), 1e-8, 0.3
    opt = AdamW([w, b], lr=lr, betas=betas, eps=eps, weight_decay=wd, decay=choose)
    targets = [(rng.standard_normal(w0.shape), rng.standard_normal(b0.shape)) for _ in range(3)]
    w_grads, b_grads = [], []
    for tw, tb in targets:
        # d mean((x - t)^2) / dx = 2 (x - t) / n, from the parameters before this step
        w_grads.append(2 * (w.gather() - tw) / w0.size)
        b_grads.append(2 * (b.gather() - tb) / b0.size)
        mse_loss(w, dt(mesh, tw, w.layout)).backward()
        mse_loss(b, dt(mesh, tb, b.layout)).backward()
        opt.step()
        opt.zero_grad()
    assert opt.decays == (True, False)
    for t, want in ((w, _adamw_formula(w0, w_grads, lr, *betas, eps, wd)),
                    (b, _adamw_formula(b0, b_grads, lr, *betas, eps, 0.0))):
        verdict = t.check(want, rtol=1e-12, atol=1e-14)
        assert verdict.passed, verdict
    with pytest.raises(OperatorError, match="decay names 1 object"):
        AdamW([w], decay=[b0])
    with pytest.raises(OperatorError, match="decay predicate returned 1 for parameter 0"):
        AdamW([w], decay=lambda t: 1)
    with pytest.raises(OperatorError, match=r"weight_decay -0.1 must be a finite number >= 0"):
        AdamW([w], weight_decay=-0.1)


def test_bad_input_is_refused_on_every_rank(mesh):
    from spmdsim.nn.ops import cross_entropy, mse_loss
    from spmdsim.runtime.executor import redistribute

    p = mesh.layout.axis_size("mp")
    x = dt(mesh, np.ones((4, 2 * p)), mesh.layout("dp", "mp"), grad=True)
    with pytest.raises(OperatorError, match="scalar loss"):
        x.backward()
    with pytest.raises(OperatorError, match="only floating"):
        dt(mesh, np.ones((4, 2), np.int64), mesh.layout("dp", None)).requires_grad_()
    loss = mse_loss(x, dt(mesh, np.zeros((4, 2 * p)), x.layout))
    # A pending loss backpropagates: every addend gets the whole gradient (B -> P's backward moves nothing).
    redistribute(loss, loss.layout.with_partial("dp")).backward()
    assert np.allclose(x.grad.local, 2.0 / (8 * p))  # d mean(x^2) / dx at x = 1
    labels = dt(mesh, np.array([0, 1, 2, 2 * p]), mesh.layout("dp"))
    with pytest.raises(OperatorError, match="1 label outside"):
        cross_entropy(x, labels)  # the bad label is on one dp half only: every rank raises
    with pytest.raises(Exception, match="labels of shape"):
        cross_entropy(x, dt(mesh, np.zeros(2, np.int64), mesh.layout("dp")))
    with pytest.raises(Exception, match="target of shape"):
        mse_loss(x, dt(mesh, np.zeros((4, 2)), mesh.layout("dp", None)))
    loss = mse_loss(x, dt(mesh, np.zeros((4, 2 * p)), x.layout))
    loss.backward()
    with pytest.raises(OperatorError, match="second time"):
        loss.backward()
    with pytest.raises(OperatorError, match="does not require grad"):
        mse_loss(dt(mesh, np.ones(3), mesh.layout(None)), dt(mesh, np.ones(3), mesh.layout(None))).backward()
