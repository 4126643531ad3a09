"""Gradients of every operator against central finite differences (float64), on a (dp, mp) mesh.

Each case builds a small network piece from global arrays every rank holds,
takes mse_loss against a seeded target (or a loss directly), runs backward and
checks every gradient shard against numpy central differences of the
single-process reference, and the backward's collectives where they say
something (the conjugates of the forward's).
"""
from __future__ import annotations

import engines
import numpy as np
import pytest
from trainkit import check_grads, dt, mse_check

from spmdsim import Layout, OperatorError
from spmdsim.references import forward as reference
from spmdsim.references import backward as rg

pytestmark = pytest.mark.mpi(min_size=4)


@engines.per_rank
def mesh():
    """(dp, mp) = (2, size/2) mesh over MPI.COMM_WORLD, or the simulated rank's world."""
    from spmdsim.runtime import Mesh

    world = engines.world()
    m = Mesh(Layout((2, world.size // 2), ("dp", "mp")), world)
    yield m
    m.close()


def _rand(*shape, seed=0):
    return np.random.default_rng(seed + 17 * len(shape)).standard_normal(shape)


def _assert(verdicts):
    for v in verdicts:
        assert v.passed, v


def _backward_counts(fn):
    from spmdsim.runtime import collect_trace

    with collect_trace() as trace:
        fn()
    return trace.counts()


def test_matmul_column_and_row(mesh):
    from spmdsim.nn.ops import matmul, relu

    p = mesh.layout.axis_size("mp")
    arrays = [_rand(4, 6), _rand(6, 2 * p, seed=1), _rand(2 * p, 3, seed=2)]
    x = dt(mesh, arrays[0], mesh.layout("dp", None), grad=True)
    w1 = dt(mesh, arrays[1], mesh.layout(None, "mp"), grad=True)
    w2 = dt(mesh, arrays[2], mesh.layout("mp", None), grad=True)
    y = matmul(relu(matmul(x, w1)), w2)
    ref = lambda x, a, b: reference.relu(x @ a) @ b  # noqa: E731
    _assert(mse_check(mesh, [x, w1, w2], arrays, y, ref))
    # Megatron's f: x replicated over mp feeds a column-split weight, so dX is
    # a pending sum over mp, Allreduced at the leaf; the weights' dp sums too.
    assert x.grad.layout == x.layout


def test_backward_collectives_are_the_conjugates(mesh):
    from spmdsim.nn.ops import matmul, mse_loss, relu

    p = mesh.layout.axis_size("mp")
    x = dt(mesh, _rand(4, 6), mesh.layout("dp", None), grad=True)
    w1 = dt(mesh, _rand(6, 2 * p, seed=1), mesh.layout(None, "mp"), grad=True)
    w2 = dt(mesh, _rand(2 * p, 3, seed=2), mesh.layout("mp", None), grad=True)
    y = matmul(relu(matmul(x, w1)), w2)  # forward: one Allreduce over mp
    loss = mse_loss(y, dt(mesh, np.zeros(y.global_shape), y.layout))
    counts = _backward_counts(loss.backward)
    # dX over mp (the f conjugate), dW1 and dW2 over dp (data parallel): three Allreduces.
    assert counts == {"allreduce": 3}


@pytest.mark.parametrize("how", ["reduce_scatter", "pending"])
def test_matmul_resolutions(mesh, how):
    from spmdsim.nn.ops import matmul
    from spmdsim.runtime.executor import redistribute

    p = mesh.layout.axis_size("mp")
    arrays = [_rand(2 * p, 2 * p), _rand(2 * p, 4, seed=3)]
    x = dt(mesh, arrays[0], mesh.layout(None, "mp"), grad=True)
    w = dt(mesh, arrays[1], mesh.layout("mp", None), grad=True)
    if how == "reduce_scatter":
        y = matmul(x, w, out_layout=mesh.layout("mp", None))
    else:
        y = redistribute(matmul(x, w, reduce=False), mesh.layout(None, "dp"))
    _assert(mse_check(mesh, [x, w], arrays, y, lambda a, b: a @ b))


def test_batched_transposed_matmul(mesh):
    from spmdsim.nn.ops import matmul

    p = mesh.layout.axis_size("mp")
    arrays = [_rand(2, 2 * p, 4), _rand(2, 3, 2 * p, seed=4)]
    x = dt(mesh, arrays[0], mesh.layout("dp", "mp", None), grad=True)
    w = dt(mesh, arrays[1], mesh.layout("dp", None, "mp"), grad=True)
    y = matmul(x, w, transpose_a=True, transpose_b=True)
    ref = lambda a, b: reference.matmul(a, b, True, True)  # noqa: E731
    _assert(mse_check(mesh, [x, w], arrays, y, ref))


def test_batched_x_shared_weight(mesh):
    from spmdsim.nn.ops import matmul

    p = mesh.layout.axis_size("mp")
    arrays = [_rand(2, 4, 6), _rand(6, 2 * p, seed=5)]
    x = dt(mesh, arrays[0], mesh.layout("dp", None, None), grad=True)
    w = dt(mesh, arrays[1], mesh.layout(None, "mp"), grad=True)
    _assert(mse_check(mesh, [x, w], arrays, matmul(x, w), lambda a, b: a @ b))


def test_elementwise_chain(mesh):
    from spmdsim.nn.ops import add, bias_add, gelu, relu, scale

    p = mesh.layout.axis_size("mp")
    layout = mesh.layout("dp", "mp")
    arrays = [_rand(4, 2 * p), _rand(4, 2 * p, seed=6), _rand(2 * p, seed=7)]
    a, b = (dt(mesh, arr, layout, grad=True) for arr in arrays[:2])
    bias = dt(mesh, arrays[2], mesh.layout("mp"), grad=True)
    y = bias_add(add(scale(gelu(a), 0.5), relu(add(a, b))), bias)
    ref = lambda a, b, c: 0.5 * reference.gelu(a) + reference.relu(a + b) + c  # noqa: E731
    _assert(mse_check(mesh, [a, b, bias], arrays, y, ref))


def test_reshape_transpose_softmax(mesh):
    from spmdsim.nn.ops import reshape, softmax, transpose

    p = mesh.layout.axis_size("mp")
    arrays = [_rand(4, 4 * p)]
    x = dt(mesh, arrays[0], mesh.layout("dp", "mp"), grad=True)
    y = softmax(transpose(reshape(x, (4, 2 * p, 2)), (0, 2, 1)), dim=1)
    ref = lambda a: reference.softmax(a.reshape(4, 2 * p, 2).transpose(0, 2, 1), 1)  # noqa: E731
    _assert(mse_check(mesh, [x], arrays, y, ref))


def test_redistribute_backward_is_the_reverse_move(mesh):
    from spmdsim.runtime.executor import redistribute

    p = mesh.layout.axis_size("mp")
    arrays = [_rand(2 * p, 4)]
    x = dt(mesh, arrays[0], mesh.layout("mp", "dp"), grad=True)
    y = redistribute(redistribute(x, mesh.layout("dp", "mp")), mesh.layout(None, None))
    _assert(mse_check(mesh, [x], arrays, y, lambda a: a))


@pytest.mark.parametrize("classes_split", [False, True])
def test_cross_entropy(mesh, classes_split):
    from spmdsim.nn.ops import cross_entropy

    p = mesh.layout.axis_size("mp")
    logits_g, labels_g = _rand(8, 2 * p), np.random.default_rng(3).integers(0, 2 * p, 8)
    layout = mesh.layout("dp", "mp" if classes_split else None)
    logits = dt(mesh, logits_g, layout, grad=True)
    labels = dt(mesh, labels_g, mesh.layout("dp"))
    loss = cross_entropy(logits, labels)
    _assert(check_grads([logits], [logits_g], lambda z: rg.cross_entropy(z, labels_g)[0], loss))
    exact = logits.grad.check(rg.cross_entropy(logits_g, labels_g)[1], rtol=1e-10, atol=1e-14)
    assert exact.passed, exact


def test_mse_loss_target_gradient(mesh):
    from spmdsim.nn.ops import mse_loss

    arrays = [_rand(4, 6), _rand(4, 6, seed=9)]
    y, t = (dt(mesh, a, mesh.layout("dp", None), grad=True) for a in arrays)
    loss = mse_loss(y, t)
    _assert(check_grads([y, t], arrays, lambda a, b: rg.mse_loss(a, b)[0], loss))
    # A loss scaled after mse_loss: its backward gets 0.25, not 1.
    from spmdsim.nn.ops import scale

    y, t = (dt(mesh, a, mesh.layout("dp", None), grad=True) for a in arrays)
    loss = scale(mse_loss(y, t), 0.25)
    _assert(check_grads([y, t], arrays, lambda a, b: 0.25 * rg.mse_loss(a, b)[0], loss))


def test_pending_sums_flow_through_the_backward(mesh):
    from spmdsim.nn.ops import add, matmul, scale
    from spmdsim.runtime.executor import redistribute

    p = mesh.layout.axis_size("mp")
    arrays = [_rand(4, 2 * p), _rand(2 * p, 3, seed=8), _rand(3, 5, seed=9)]
    x = dt(mesh, arrays[0], mesh.layout("dp", "mp"), grad=True)
    w1 = dt(mesh, arrays[1], mesh.layout("mp", None), grad=True)
    w2 = dt(mesh, arrays[2], mesh.layout(None, None), grad=True)
    pending = matmul(x, w1, reduce=False)  # a pending sum over mp
    # A pending x times a replicated w stays pending; pending sums add and scale as they are.
    z = matmul(add(pending, scale(pending, 0.5)), w2)
    y = redistribute(z, mesh.layout("dp", None))
    ref = lambda a, b, c: 1.5 * (a @ b) @ c  # noqa: E731
    _assert(mse_check(mesh, [x, w1, w2], arrays, y, ref))


def test_bucketed_gradients_share_one_allreduce(mesh):
    """x split over dp, three parameters replicated: their gradients are pending over dp. With
    bucket=True one Allreduce sums all three (the same bytes as three calls) and the gradients
    are those of three calls; the explanation names the bucket and the steps that read it."""
    from spmdsim.nn.autograd import backward
    from spmdsim.nn.ops import bias_add, matmul, mse_loss, relu
    from spmdsim.runtime import collect_trace

    arrays = [_rand(4, 6), _rand(6, 5, seed=1), _rand(5, seed=2), _rand(5, 3, seed=3), _rand(4, 3, seed=4)]

    def run(bucket):
        x = dt(mesh, arrays[0], mesh.layout("dp", None))
        w1, b1, w2 = (dt(mesh, a, mesh.layout(*(None,) * a.ndim), grad=True) for a in arrays[1:4])
        loss = mse_loss(matmul(relu(bias_add(matmul(x, w1), b1)), w2), dt(mesh, arrays[4], mesh.layout("dp", None)))
        explain = []
        with collect_trace() as trace:
            backward(loss, explain, bucket=bucket)
        return [t.grad for t in (w1, b1, w2)], trace, explain

    plain, one_each, _ = run(False)
    bucketed, one_call, explain = run(True)
    for a, b in zip(plain, bucketed):
        assert a.layout == b.layout and np.allclose(a.local, b.local, rtol=1e-13, atol=1e-15)
    assert one_each.counts() == {"allreduce": 3} and one_call.counts() == {"allreduce": 1}
    assert one_call.totals()["bytes_sent"] == one_each.totals()["bytes_sent"] > 0
    text = [step for step, entries in explain if entries]
    assert text == ["3 leaves (5, 3), (5,), (6, 5): their replicas' gradients summed in one bucket "
                    "(read by matmul, bias_add)"], text


def test_bucket_caps_and_bad_values(mesh):
    """A byte cap closes a bucket before it would pass the cap (global bytes: W2 120 B, b1 40 B,
    W1 240 B in backward order); a bad value is refused before any collective."""
    from spmdsim.nn.autograd import backward
    from spmdsim.nn.ops import bias_add, matmul, mse_loss, relu
    from spmdsim.runtime import collect_trace

    arrays = [_rand(4, 6), _rand(6, 5, seed=1), _rand(5, seed=2), _rand(5, 3, seed=3), _rand(4, 3, seed=4)]

    def calls(bucket):
        x = dt(mesh, arrays[0], mesh.layout("dp", None))
        w1, b1, w2 = (dt(mesh, a, mesh.layout(*(None,) * a.ndim), grad=True) for a in arrays[1:4])
        loss = mse_loss(matmul(relu(bias_add(matmul(x, w1), b1)), w2), dt(mesh, arrays[4], mesh.layout("dp", None)))
        with collect_trace() as trace:
            backward(loss, bucket=bucket)
        return [e.bytes_sent for e in trace.entries]  # dp has 2 ranks: each sends its whole buffer

    assert calls(160) == [160, 240] and calls(100) == [120, 40, 240] and calls(400) == [400]
    for bad in (-1, 0, 1.5, "yes"):
        with pytest.raises(OperatorError, match=r"^bucket .* must be True, False or a positive number of bytes"):
            calls(bad)
