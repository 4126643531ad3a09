"""Training on simulated ranks (spmdsim.simulate): the same gradient and step checks as under MPI."""
from __future__ import annotations

import numpy as np
import pytest
from trainkit import check_grads, dt, mse_check

import spmdsim
from spmdsim import Layout
from spmdsim.references import forward as reference
from spmdsim.references import backward as rg


def _mesh():
    from spmdsim.runtime import Mesh

    return Mesh(Layout((2, spmdsim.world().size // 2), ("dp", "mp")))


def _passed(verdicts):
    return all(v.passed for v in verdicts), [v for v in verdicts if not v.passed]


@pytest.mark.parametrize("ranks", [4, 8])
def test_matmul_chain_and_vocab_parallel_cross_entropy(ranks):
    from spmdsim.nn.ops import cross_entropy, matmul, relu

    def body():
        mesh = _mesh()
        p = mesh.layout.axis_size("mp")
        rng = np.random.default_rng(0)
        arrays = [rng.standard_normal((4, 6)), rng.standard_normal((6, 2 * p)), rng.standard_normal((2 * p, 3))]
        x = dt(mesh, arrays[0], mesh.layout("dp", None), grad=True)
        w1 = dt(mesh, arrays[1], mesh.layout(None, "mp"), grad=True)
        w2 = dt(mesh, arrays[2], mesh.layout("mp", None), grad=True)
        ref = lambda a, b, c: reference.relu(a @ b) @ c  # noqa: E731
        first = mse_check(mesh, [x, w1, w2], arrays, matmul(relu(matmul(x, w1)), w2), ref)
        logits_g, labels_g = rng.standard_normal((8, 2 * p)), rng.integers(0, 2 * p, 8)
        logits = dt(mesh, logits_g, mesh.layout("dp", "mp"), grad=True)
        loss = cross_entropy(logits, dt(mesh, labels_g, mesh.layout("dp")))
        second = check_grads([logits], [logits_g], lambda z: rg.cross_entropy(z, labels_g)[0], loss)
        return _passed(first + second)

    for ok, failed in spmdsim.simulate(ranks, body):
        assert ok, failed


def _sequence_parallel_mlp(mesh):
    """A sequence-parallel MLP over mp and its input (p, 2, 4), split on mp then dp, with a gradient."""
    from spmdsim.nn.ops import ParallelMLP

    p = mesh.layout.axis_size("mp")
    mlp = ParallelMLP(mesh, 4, 2 * p, sequence_parallel=True, axes="mp", dtype="float64", seed=2)
    x = dt(mesh, np.random.default_rng(1).standard_normal((p, 2, 4)), mesh.layout("mp", "dp", None), grad=True)
    return mlp, x


def test_sequence_parallel_mlp_on_4_ranks():
    def body():
        mesh = _mesh()
        mlp, x = _sequence_parallel_mlp(mesh)
        fc1, fc2 = mlp.linear_fc1, mlp.linear_fc2
        tensors = [x, fc1.weight, fc1.bias, fc2.weight, fc2.bias]
        ref = lambda *a: reference.mlp(*a, "gelu")  # noqa: E731
        return _passed(mse_check(mesh, tensors, [t.gather() for t in tensors], mlp(x), ref))

    for ok, failed in spmdsim.simulate(4, body):
        assert ok, failed


def test_seed_003_trains_on_8_simulated_ranks():
    from spmdsim.models.nets import mindspore_tutorial
    from spmdsim.models.nets.digits import load_digits
    from spmdsim.models.nets.train import NetworkTrainer
    from spmdsim.models.nets.reference import ReferenceTrainer

    data = load_digits(synthetic=True)

    def body():
        net = mindspore_tutorial(8, dtype="float64")
        trainer, ref = NetworkTrainer(net, spmdsim.world()), ReferenceTrainer(net)
        verdicts = []
        for step in range(1):  # one step: loss, gradients and the updated parameters
            x, labels = data.batch(step, 32)
            result = trainer.step(x, labels, anchor=True)
            verdicts += trainer.check(result, ref.step(x, labels, anchor=result.anchor), 1e-12)
        return _passed(verdicts)

    for ok, failed in spmdsim.simulate(8, body):
        assert ok, failed


def test_an_anchored_step_holds_one_table_the_simulated_ranks_share():
    """NetworkTrainer's Anchor: every rank's parameters at the step's start, a row per rank. Simulated ranks share
    one table (spmdsim.models.gpt.train.all_rows): an Allgather gave each of p ranks its own p rows (731 MB at 240 ranks
    of examples/train_seed_networks.py's Paddle network, 341 MB shared)."""
    from spmdsim.models.nets import seeds
    from spmdsim.models.nets.train import NetworkTrainer

    def body():
        comm = spmdsim.world()
        net = seeds.paddle_tp(comm.size, dtype="float64")
        trainer = NetworkTrainer(net, comm)
        labels = np.random.default_rng(1).integers(0, net.out_shape[-1], int(np.prod(net.out_shape[:-1])))
        anchor = trainer.step(net.source.full(), labels, anchor=True).anchor
        trainer.close()
        return anchor.rows, comm.rank, np.concatenate([b.reshape(-1) for b in anchor.blocks["params"]])

    ran = spmdsim.simulate(4, body)
    first = ran[0][0]
    assert first.shape[0] == 4 and all(np.shares_memory(rows, first) for rows, _, _ in ran)
    for rows, rank, mine in ran:  # each rank's row is its parameters at the step's start
        np.testing.assert_array_equal(rows[rank, :mine.size], mine)


@pytest.mark.parametrize("x_map,activation,bias", [
    ((None, None), "gelu", True), (("dp", None), "relu", True), ((None, "dp", None), "gelu", False)])
def test_fused_mlp_matches_its_layers_one_by_one(x_map, activation, bias):
    """ParallelMLP's one-node way (no sequence parallelism) against fc1 -> act -> fc2 called apart:
    the same output, loss and every gradient, to the last bits the products allow, and the same
    collectives in the same order."""
    from spmdsim.nn.ops import ParallelMLP, mse_loss
    from spmdsim.nn.ops.elementwise import activation as act
    from spmdsim.runtime import collect_trace

    def body():
        mesh = _mesh()
        p = mesh.layout.axis_size("mp")
        shape = (4, 6) if len(x_map) == 2 else (2, 4, 6)
        x_g = np.random.default_rng(5).standard_normal(shape)
        results = []
        for fused in (True, False):
            mlp = ParallelMLP(mesh, 6, 2 * p, activation=activation, bias=bias, axes="mp",
                              dtype="float64", seed=9)
            x = dt(mesh, x_g, mesh.layout(*x_map), grad=True)
            with collect_trace() as trace:
                if fused:
                    y = mlp(x)
                else:
                    y = mlp.linear_fc2(act(mlp.linear_fc1(x, label="mlp.fc1"), activation), label="mlp.fc2")
                one_node = len(y._ag.inputs) == 5  # x and the four parameters: one node
                mse_loss(y, dt(mesh, np.ones(y.global_shape), y.layout)).backward()
            params = [t for t in (mlp.linear_fc1.weight, mlp.linear_fc1.bias, mlp.linear_fc2.weight,
                                  mlp.linear_fc2.bias) if t is not None]
            results.append((y.local, [t.grad.local for t in [x] + params],
                            [(e.op, e.label, e.bytes_sent) for e in trace.entries], one_node))
        (y1, g1, t1, node1), (y2, g2, t2, node2) = results
        same = np.allclose(y1, y2, rtol=1e-12, atol=0) and all(
            np.allclose(a, b, rtol=1e-12, atol=1e-15) for a, b in zip(g1, g2))
        shown = "\n".join(map(str, [same, node1, node2] + t1 + ["--"] + t2))
        return same and t1 == t2 and node1 and not node2, shown

    for ok, traces in spmdsim.simulate(8, body):
        assert ok, traces


def test_one_step_has_no_trend_to_judge():
    from spmdsim.models.nets.train import loss_trend

    assert loss_trend([2.5]) == ("loss 2.5000000 (1 step: no trend to judge)", True)
    assert loss_trend([2.5, 2.0]) == ("loss first 2.5000000, last 2.0000000 (falling)", True)
    # --lr 0: the parameters stay; the loss moves only with the batches (train_gpt's): no trend either way
    assert loss_trend([2.5, 2.6], lr=0.0) == ("loss first 2.5000000, last 2.6000000 (--lr 0: no trend to judge)", True)
    assert loss_trend([2.5, 2.5]) == ("loss first 2.5000000, last 2.5000000 (NOT falling)", False)


def test_a_diverging_loss_keeps_its_row_and_its_trend_short():
    """A loss of 1e27 (a learning rate of 1e9) in scientific notation: the step's row stays within 100 columns
    and under its header's loss column; losses below 1e5 print as before."""
    from types import SimpleNamespace

    from spmdsim.models.gpt.options import step_header, step_row
    from spmdsim.models.nets.train import loss_trend

    assert loss_trend([4.7168190, 3.5722405e27]) == ("loss first 4.7168190, last 3.5722405e+27 (NOT falling)", False)
    row = step_row(SimpleNamespace(step=2, loss=3.5722405e27, calls=23, bytes_sent=8860176, errors=(0.0, 3.8e-15)),
                   True)
    assert row.split()[1] == "3.5722e+27" and len(row) <= 100 and len(step_header(True)) <= 100
    kept = step_row(SimpleNamespace(step=0, loss=4.71682, calls=23, bytes_sent=8860176, errors=()), False)
    assert kept == "    0  4.7168           23   8,860,176           "


@pytest.mark.parametrize("ranks", [4, 8])
def test_clip_grad_norm_is_the_global_norm_on_any_layout(ranks):
    """Gradients split, replicated over dp and tp, and on mixed axes: the joint norm equals numpy's over the
    gathered gradients (each block counted once), and every gradient is scaled by PyTorch's coefficient."""
    from spmdsim.nn import ops
    from spmdsim.nn.optim import clip_grad_norm_
    from spmdsim.runtime import DTensor

    rng = np.random.default_rng(ranks)
    a, b, c = rng.normal(size=(8, 4)), rng.normal(size=(4, 8)), rng.normal(size=(8,))

    def body():
        mesh = _mesh()
        L = mesh.layout
        pa = DTensor.from_global(mesh, a, L("mp", None)).requires_grad_()
        pb = DTensor.from_global(mesh, b, L(None, ("dp", "mp"))).requires_grad_()
        pc = DTensor.from_global(mesh, c, L(None)).requires_grad_()
        unused = DTensor.from_global(mesh, c, L("dp")).requires_grad_()  # no gradient: skipped
        ops.sum(ops.tanh(ops.einsum("ik,kj->ij", pa, pb)) * pc).backward()
        before = [p.grad.gather() for p in (pa, pb, pc)]
        norm = clip_grad_norm_([pa, pb, pc, unused], 0.5)
        after = [p.grad.gather() for p in (pa, pb, pc)]
        again = clip_grad_norm_([pa, pb, pc], 10.0)  # within the bound now: nothing scaled
        errors = []
        for bad in (0, -1.0, float("inf"), True, "1"):
            try:
                clip_grad_norm_([pa], bad)
            except spmdsim.OperatorError as e:
                errors.append(str(e))
        return before, norm, after, again, errors

    before, norm, after, again, errors = spmdsim.simulate(ranks, body)[0]
    want = np.sqrt(sum(float((g * g).sum()) for g in before))
    assert abs(norm - want) <= 1e-13 * want and want > 0.5
    for g0, g1 in zip(before, after):
        np.testing.assert_allclose(g1, g0 * (0.5 / (want + 1e-6)), rtol=1e-14, atol=0)
    assert abs(again - 0.5) < 1e-6
    assert errors == [f"clip_grad_norm_: max_norm {v!r} must be a finite number > 0"
                      for v in (0, -1.0, float("inf"), True, "1")]


def test_clip_coefficient_refuses_an_eps_as_clip_grad_norm_does():
    """clip_coefficient (exported beside clip_grad_norm_) took any eps: -1 with norm 1 divided by zero."""
    from spmdsim.nn.optim import clip_coefficient

    assert clip_coefficient(2.0, 1.0) == 1.0 / (2.0 + 1e-6) and clip_coefficient(2.0, 1.0, 0) == 0.5
    for bad in (-1, float("nan"), True, "1e-6"):
        with pytest.raises(spmdsim.OperatorError) as refused:
            clip_coefficient(1.0, 1.0, bad)
        assert str(refused.value) == f"clip_coefficient: eps {bad!r} must be a finite number >= 0"


def test_clip_grad_norm_refuses_an_eps_that_is_negative_or_not_finite():
    """A negative eps turned a small norm's coefficient negative (eps -1 with norm 0.15: every gradient times
    -1.17); eps 0 is PyTorch's formula without the guard: a zero norm leaves the gradients as they are."""
    from spmdsim.nn import ops
    from spmdsim.nn.optim import clip_grad_norm_
    from spmdsim.runtime import DTensor

    a = np.full((4, 2), 0.01)

    def body():
        mesh = _mesh()
        w = DTensor.from_global(mesh, a, mesh.layout("mp", None)).requires_grad_()
        ops.sum(w * w).backward()
        before = w.grad.gather()
        errors = []
        for bad in (-1.0, -1e-12, float("nan"), float("inf"), True, "1e-6"):
            try:
                clip_grad_norm_([w], 1.0, eps=bad)
            except spmdsim.OperatorError as e:
                errors.append(str(e))
        kept = w.grad.gather()
        norm = clip_grad_norm_([w], 0.01, eps=0)  # clipped by exactly max_norm / norm
        clipped = w.grad.gather()
        z = DTensor.from_global(mesh, a, mesh.layout(None, "mp")).requires_grad_()
        ops.sum(z * 0.0).backward()
        return before, errors, kept, norm, clipped, clip_grad_norm_([z], 1.0, eps=0.0), z.grad.gather()

    before, errors, kept, norm, clipped, zero_norm, zero_grad = spmdsim.simulate(4, body)[0]
    assert errors == [f"clip_grad_norm_: eps {v!r} must be a finite number >= 0"
                      for v in (-1.0, -1e-12, float("nan"), float("inf"), True, "1e-6")]
    np.testing.assert_array_equal(kept, before)  # refused before anything was scaled
    assert norm == pytest.approx(0.02 * np.sqrt(8), rel=1e-14)
    np.testing.assert_allclose(clipped, before * (0.01 / norm), rtol=1e-15, atol=0)
    assert zero_norm == 0.0 and not zero_grad.any() and np.isfinite(zero_grad).all()


def test_a_backward_through_redistributions_leaves_no_cycle_holding_blocks():
    """A moved tensor's node names its layouts, not the tensors: a closure over the output made a cycle
    (out -> its node -> the name -> out) that kept the blocks of every redistribution until the garbage
    collector ran."""
    import gc

    from spmdsim.runtime import DTensor

    def body():
        mesh = _mesh()
        mlp, x = _sequence_parallel_mlp(mesh)
        out = mlp(x)
        from spmdsim.nn.autograd.checks import _topological

        assert any(n.describe().startswith("redistribute ") for n in _topological(out._ag))  # moves recorded
        (out * out).sum().backward()
        mesh.close()

    enabled = gc.isenabled()
    gc.disable()
    # What the process held before, its garbage too, frozen out of the collection below (unfrozen after): it
    # finds the cycles `body` left among the objects made since, without walking the worker's whole heap twice
    # (a collection first, to keep the earlier tests' garbage out of gc.garbage, and this one: 2-4 CPU-s late
    # in a run) and without counting an earlier test's garbage.
    gc.freeze()
    try:
        spmdsim.simulate(4, body)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        found = [o for o in gc.garbage if type(o) is DTensor]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.unfreeze()
        if enabled:
            gc.enable()
    assert found == []
