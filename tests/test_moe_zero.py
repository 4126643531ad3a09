"""ZeRO-1 with MoE layers (spmdsim.nn.distrib_optim.DistributedAdamW over ("dp", "ep")): the dense layers' states
and master copy sharded over dp x ep, the experts' over dp alone (Megatron's expert-data-parallel group), every
step checked against one numpy process and equal to AdamW's, each bucket's Reduce_scatter and Allgather over its
own group, a dry run's bytes those of a real step (docs/howto/experts-memory.md, "ZeRO-1")."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import Layout
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.train import TOLERANCE, train

TEXT = encode(load_text(20_000))


def _cfg(dropless=False):
    from spmdsim.models.moe import MoEConfig

    moe = MoEConfig(experts=4, top_k=2, capacity_factor=1.0, dropless=dropless, aux_loss_coeff=0.5, z_loss_coeff=0.1)
    return GPTConfig(layers=2, d_model=32, heads=2, seq=16, batch=8, dropout=0.1, moe=moe)


def _run(cfg, dp, ep, tp, zero, steps=2, dry_run=False, **kwargs):
    from spmdsim.runtime.trace import collect_trace

    def main():
        with collect_trace() as trace:
            model, results = train(cfg, spmdsim.world(), dp, tp, steps, TEXT, ep=ep, zero=zero, memory=True,
                                   **kwargs)
        rows = [(e.op, e.axes, e.bytes_sent) for e in trace.entries if e.label and e.label.startswith("zero-1")]
        model.mesh.close()
        return results, rows

    return spmdsim.simulate(dp * ep * tp, main, dry_run=dry_run)


@pytest.mark.parametrize("dropless", [False, True])
def test_zero1_with_moe_layers_is_adamw_with_states_sharded_over_each_parameters_own_group(dropless):
    cfg = _cfg(dropless)
    zero, adam = (_run(cfg, 2, 2, 2, z, sp=True) for z in (1, 0))
    for (results, rows), (theirs, _) in zip(zero, adam):
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), [r.errors for r in results]
        for r, a in zip(results, theirs):
            assert r.loss == pytest.approx(a.loss, rel=1e-12, abs=0)
            # the experts' moments: 1/dp of AdamW's (split over ep already); the model's: 1/(dp ep) of AdamW's
            assert r.experts.states * 2 == a.experts.states
            dense = a.memory.states - a.experts.states
            assert r.memory.states - r.experts.states == pytest.approx(dense / 4, abs=2 * 8 * 3)
        # one bucket per group: the dense layers' gradients scattered over dp x ep, the experts' over dp
        assert sorted({(op, axes) for op, axes, _ in rows if op != "allreduce"}) == [
            ("allgather", ("dp",)), ("allgather", ("dp", "ep")),
            ("reduce_scatter", ("dp",)), ("reduce_scatter", ("dp", "ep"))]
        assert ("allreduce", ("tp",)) in {(op, axes) for op, axes, _ in rows}  # sp's norms and biases, over tp first


def test_zero1_with_moe_layers_in_a_dry_run_sends_and_holds_what_a_real_step_does():
    cfg = _cfg()
    real, dry = _run(cfg, 2, 2, 1, 1, steps=1), _run(cfg, 2, 2, 1, 1, steps=1, dry_run=True)
    (r,), real_rows = real[0]
    (d,), dry_rows = dry[0]
    assert dry_rows == real_rows and d.bytes_sent == r.bytes_sent
    assert d.memory.states == r.memory.states and d.experts.states == r.experts.states


def test_pipelined_moe_with_zero1_and_clipping_passes_every_step():
    """Each stage's optimizer over its own (dp, ep) mesh; the clipped joint norm counts every element once
    (the experts' slices over dp, the others' over dp x ep) and sums the stages' squares over pp."""
    import dataclasses

    from spmdsim.models.gpt.pipeline import train_pipelined

    cfg = dataclasses.replace(_cfg(), clip=0.05)

    def main():
        run, results = train_pipelined(cfg, spmdsim.world(), 2, 2, 1, 2, TEXT, ep=2, microbatches=2, zero=1)
        run.close()
        return results

    for results in spmdsim.simulate(8, main):
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in results), [r.errors for r in results]


def test_a_parameter_split_over_every_dp_axis_keeps_its_states_whole():
    """DistributedAdamW shards a parameter's states over the dp axes it is replicated over: none left for one
    split over dp, so it steps as AdamW on its own block (no collective for its bucket)."""
    from spmdsim.nn import ops
    from spmdsim.nn.distrib_optim import DistributedAdamW
    from spmdsim.nn.optim import AdamW
    from spmdsim.runtime.dtensor import DTensor
    from spmdsim.runtime.mesh import Mesh

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        values = np.arange(8.0) / 8
        mine, ref = (DTensor.from_global(mesh, values, mesh.layout("dp")).requires_grad_() for _ in range(2))
        zero, adamw = DistributedAdamW([mine], mesh, lr=0.1), AdamW([ref], lr=0.1)
        for p, opt in ((mine, zero), (ref, adamw)):
            loss = ops.sum(ops.mul(p, p))
            loss.backward(keep_pending=[p]) if opt is zero else loss.backward()
            opt.step()
        return zero.buckets[0].axes, zero.memory()["optimizer states"], float(np.max(np.abs(mine.local - ref.local)))

    for axes, states, diff in spmdsim.simulate(4, body):
        assert axes == () and states == 2 * 4 * 8 and diff == 0.0


def test_zero2_with_moe_layers_is_zero1_bit_for_bit_with_the_gradients_sharded():
    """dp 2 x ep 2: ZeRO-2 checked against the reference every step, the parameters ZeRO-1's bit for bit, the
    experts' gradients (sharded over dp alone) half of ZeRO-1's buffer's, every gradient 1/dp of its group."""
    cfg = _cfg()

    def run(zero):
        def main():
            model, results = train(cfg, spmdsim.world(), 2, 1, 2, TEXT, ep=2, zero=zero, memory=True)
            blocks = {n: t.local.copy() for n, t in model.params.items()}
            model.mesh.close()
            return results, blocks
        return spmdsim.simulate(4, main)

    for (r1, p1), (r2, p2) in zip(run(1), run(2)):
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in r2), r2
        assert all(p1[n].tobytes() == p2[n].tobytes() for n in p1)
        assert r2[-1].experts.grads * 2 == r1[-1].experts.grads
        assert r2[-1].memory.grads < r1[-1].memory.grads // 2


def test_zero0_cuts_its_buffer_again_where_a_router_gradient_is_whole_over_tp(monkeypatch):
    """ZeRO-0's gradient buffer (spmdsim.nn.autograd.grad_buffer) guesses each gradient pending over the axes its
    parameter is replicated on; an MoE layer's router weight is replicated over tp but its gradient is whole
    there. The first step sums the buckets that touches in blocks of their own (reduce_grads, the same calls as
    every step's), the buffer is cut again from the axes found, and from the second step on every bucket is
    summed in place: a rank then holds its gradients once (the buffer, and beside it in the walk the tied
    table's), where the first step held a bucket's copy too. Every step passes its check."""
    import spmdsim.nn.autograd.engine as engine

    cfg = _cfg()
    copies: list = []  # (rank 0) a call of reduce_grads: a bucket summed in a block of its own
    reduce_grads = engine.reduce_grads
    monkeypatch.setattr(engine, "reduce_grads", lambda *a, **k: (copies.append(len(copies)) if
                                                                spmdsim.world().Get_rank() == 0 else None)
                        or reduce_grads(*a, **k))
    firsts = _run(cfg, 2, 2, 2, 0, steps=1, sp=True)
    first_copies = len(copies)
    copies.clear()
    laters = _run(cfg, 2, 2, 2, 0, steps=3, sp=True)
    assert first_copies > 0 and len(copies) == first_copies  # in the first step alone
    first, later = firsts[0][0][-1].memory, laters[0][0][-1].memory
    assert first.grads == later.grads and later.grads <= later.grads_peak < first.grads_peak
    assert all(r.passed for results, _ in firsts + laters for r in results)
