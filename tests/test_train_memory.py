"""Memory-saving training on simulated ranks: activation recomputation, ZeRO-1, the memory tracker.

Recomputation must give the gradients of the run without it (the same dropout masks, drawn again from
their seeds); ZeRO-1 must give AdamW's parameters with 1/dp of its states; the tracker's figures are
measured on the graph and the optimizers, and move as each feature promises.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import spmdsim
from spmdsim import Layout
from spmdsim.errors import OperatorError, SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.memory import korthikanti_bytes, per_layer_units
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.nn.optim import SGD, AdamW, DistributedAdamW

ROOT = pathlib.Path(__file__).resolve().parent.parent

CFG = GPTConfig(layers=2, d_model=32, heads=4, seq=16, batch=8, dropout=0.2)
TEXT = encode(load_text(20_000))


def _one_step(recompute: str, zero: int = 0, ranks: int = 4, dp: int = 2, tp: int = 2, **kw) -> list:
    """Per rank: (loss, {name: gradient block}, {name: parameter block}, StepResult) after one step (ZeRO-1's
    step consumes the gradients: its gradient buffer receives the parameters, so no gradient block)."""

    def body():
        model, results = train(CFG, spmdsim.world(), dp, tp, 1, TEXT, sp=True, recompute=recompute, zero=zero,
                               **kw)
        grads = {n: p.grad.local.copy() for n, p in model.params.items() if p.grad is not None}
        return results[0].loss, grads, {n: p.local.copy() for n, p in model.params.items()}, results[0]

    return spmdsim.simulate(ranks, body)


def _relative(a: dict, b: dict) -> float:
    return max(float(np.max(np.abs(a[n] - b[n]))) / max(float(np.max(np.abs(b[n]))), 1e-300) for n in b)


def test_recomputation_gives_the_gradients_of_the_run_without_it():
    """dp 2 x tp 2 with sequence parallelism and dropout 0.2: every gradient block of one step, on every rank,
    selective and full against none, within 1e-12 relative (measured: bit for bit)."""
    runs = {mode: _one_step(mode, check=False) for mode in ("none", "selective", "full")}
    for mode in ("selective", "full"):
        for rank in range(4):
            assert runs[mode][rank][0] == runs["none"][rank][0]
            assert _relative(runs[mode][rank][1], runs["none"][rank][1]) <= 1e-12, (mode, rank)
            assert _relative(runs[mode][rank][2], runs["none"][rank][2]) <= 1e-12, (mode, rank)
    # Full recomputation runs each block's forward collectives again in the backward: 2 Allgathers and
    # 2 Reduce_scatters a block with sp.
    assert runs["full"][0][3].calls == runs["none"][0][3].calls + 4 * CFG.layers
    assert runs["selective"][0][3].calls == runs["none"][0][3].calls


def test_recomputed_runs_match_one_numpy_process_each_step():
    for mode in ("selective", "full"):
        steps = spmdsim.simulate(8, lambda: train(CFG, spmdsim.world(), 2, 4, 2, TEXT, sp=True,
                                                  recompute=mode)[1])[0]
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in steps), (mode, steps)


def test_the_tracker_sees_selective_drop_the_attention_core_and_full_keep_only_block_inputs():
    """kept_bytes on the graph after the forward: selective keeps nothing of the core and the rest as
    without recomputation; full keeps, inside the blocks, exactly each block's input (its sequence
    shard with sp: s/tp x b/dp x h float64 values)."""
    kept = {mode: dict(spmdsim.simulate(4, lambda: train(CFG, spmdsim.world(), 2, 2, 1, TEXT, sp=True,
                                                           recompute=mode, check=False,
                                                           memory=True)[1][0].memory.kept)[0])
            for mode in ("none", "selective", "full")}
    s, b, h, a = CFG.seq, CFG.batch // 2, CFG.d_model, CFG.heads
    # p, pd and the dropout factors of (b, a/tp, s, s) per layer, float64
    assert kept["none"]["attention core"] == CFG.layers * 3 * b * (a // 2) * s * s * 8
    assert "attention core" not in kept["selective"]
    assert {k: v for k, v in kept["selective"].items()} == {k: v for k, v in kept["none"].items()
                                                            if k != "attention core"}
    block_kinds = {"layer norm", "attention", "attention core", "mlp", "block input"}
    assert {k for k in kept["full"] if k in block_kinds} == {"block input"}
    assert kept["full"]["block input"] == CFG.layers * (s // 2) * b * h * 8
    assert sum(kept["full"].values()) < sum(kept["selective"].values()) < sum(kept["none"].values())
    rest, core = per_layer_units(kept["none"], CFG.layers, s, b, h, a)
    assert core == 3 * 8 / 2  # 24 bytes of a*s^2*b over tp 2
    assert per_layer_units(kept["full"], CFG.layers, s, b, h, a) == (8 / 2, 0.0)


def test_a_dry_run_recomputes_and_measures_what_a_real_run_does():
    """Shapes only: the same collectives and bytes as the real run, and the same kept bytes by kind (a dry
    run's saved blocks are zeros of their real size, never touched), on blocks large enough for the dry
    engine's zeros (spmdsim.nn.ops._common.DRY_ZEROS_BYTES)."""
    cfg = GPTConfig(layers=1, d_model=128, heads=4, seq=128, batch=16, dropout=0.1)
    for mode in ("none", "selective", "full"):
        def body():
            return train(cfg, spmdsim.world(), 2, 2, 1, TEXT, sp=True, recompute=mode, check=False,
                         memory=True)[1][0]

        real, dry = spmdsim.simulate(4, body)[0], spmdsim.simulate(4, body, dry_run=True)[0]
        assert (dry.calls, dry.bytes_sent) == (real.calls, real.bytes_sent), mode
        assert dry.memory.kept == real.memory.kept, mode


def test_zero1_matches_one_numpy_process_and_adamw():
    """ZeRO-1 on dp 2 x tp 2 with sp (the LayerNorm gradients pending over tp summed first): each step's
    loss, the summed gradient slice each rank updated and every updated parameter against the reference;
    the parameters equal AdamW's within 1e-12 relative; one Reduce_scatter and one Allgather over dp
    in place of the dp Allreduce, and the states 1/dp of AdamW's."""
    steps = spmdsim.simulate(4, lambda: train(CFG, spmdsim.world(), 2, 2, 3, TEXT, sp=True, zero=1)[1])[0]
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in steps), steps
    plain, zero = _one_step("none", 0, check=False, memory=True), _one_step("none", 1, check=False, memory=True)
    for rank in range(4):
        assert _relative(zero[rank][2], plain[rank][2]) <= 1e-12
    assert zero[0][3].calls == plain[0][3].calls + 1  # Reduce_scatter + Allgather for one Allreduce
    m0, m1 = plain[0][3].memory, zero[0][3].memory
    params = sum(block.nbytes for block in plain[0][2].values())  # this rank's blocks (an even number of values)
    assert m0.states == 2 * params and m1.states * 2 == m0.states
    assert m0.master == 0 and m1.master * 2 == params


def test_zero2_matches_one_numpy_process_and_zero1_bit_for_bit():
    """ZeRO-2 on dp 2 x tp 2 with sp: each step checked against the reference as ZeRO-1's (the loss, the summed
    gradient slice each rank updated, every updated parameter); the same buckets, sums and update as ZeRO-1's,
    so every parameter block equals ZeRO-1's bit for bit after 3 steps, through the same collectives; the
    gradients after the step are this rank's slices, 1/dp of ZeRO-1's gradient buffer."""
    def run(zero):
        def body():
            model, results = train(CFG, spmdsim.world(), 2, 2, 3, TEXT, sp=True, zero=zero, memory=True)
            return results, {n: p.local.copy() for n, p in model.params.items()}
        return spmdsim.simulate(4, body)

    one, two = run(1), run(2)
    for (r1, p1), (r2, p2) in zip(one, two):
        assert all(r.passed and max(r.errors) <= TOLERANCE for r in r2), r2
        assert all(p1[n].tobytes() == p2[n].tobytes() for n in p1)
        assert [(r.loss, r.calls, r.bytes_sent) for r in r1] == [(r.loss, r.calls, r.bytes_sent) for r in r2]
        m1, m2 = r1[-1].memory, r2[-1].memory
        assert m2.grads * 2 == m1.grads and (m2.states, m2.master, m2.params) == (m1.states, m1.master, m1.params)


def test_zero2_reduces_each_bucket_in_the_backward_as_it_fills(monkeypatch):
    """Buckets of 2,000 elements (12 of them here): ZeRO-2's backward reduce-scatters each as soon as its members
    have their last gradients and frees their blocks, so the most gradient bytes a rank held in the step (measured
    before each bucket's Reduce_scatter: the walk's gradients, the .grad blocks, the summed slices) are well below
    what it held with one bucket (every gradient whole and the slices, as before this was done) and below
    ZeRO-1's whole gradients; the parameters are ZeRO-1's bit for bit after 2 steps, each rank's own
    Reduce_scatters in the walk's order."""
    import spmdsim.models.gpt.buckets as trainer
    from spmdsim.nn.distrib_optim import DistributedAdamW

    ready: list = []
    hook = DistributedAdamW._bucket_ready
    monkeypatch.setattr(DistributedAdamW, "_bucket_ready", lambda self, k, grads: (
        self.shard_grads and ready.append(k), hook(self, k, grads)))

    def run(zero):
        def body():
            model, results = train(CFG, spmdsim.world(), 2, 2, 2, TEXT, sp=True, zero=zero, memory=True)
            return results[-1].memory, {n: p.local.copy() for n, p in model.params.items()}
        return spmdsim.simulate(4, body)

    one, whole = run(1), run(2)
    monkeypatch.setattr(trainer, "ZERO_BUCKET", 2000)
    monkeypatch.setattr(trainer, "ZERO_BUCKET_PER_DP", 1)  # 2,000 elements at any dp
    ready.clear()
    small = run(2)
    assert len(ready) == 4 * 2 * 12 and sorted(set(ready)) == list(range(12))  # every bucket, in the backward
    for (m1, p1), (mw, _), (m2, p2) in zip(one, whole, small):
        assert all(p1[n].tobytes() == p2[n].tobytes() for n in p1)
        grads = m1.grads  # ZeRO-1's gradient buffer: every gradient whole
        assert mw.grads_peak == grads + grads // 2  # one bucket: all whole and the slices, when it fills
        assert m2.grads == grads // 2 and m2.grads < m2.grads_peak < 0.8 * grads  # the slices and a few whole
        assert m1.grads_peak < 1.2 * grads  # ZeRO-1's gradient buffer (and in the walk the tied table's)


def test_gradient_buckets_are_megatrons_default_size():
    """Megatron's default bucket_size, max(40M, 1M x the data-parallel size), in elements of a rank's shards; on an
    MoE mesh the data-parallel size counts dp and ep (the dense layers' gradients are summed over both)."""
    from types import SimpleNamespace

    from spmdsim.models.gpt.buckets import buckets

    def on(shape, names):
        return buckets(SimpleNamespace(layout=Layout(shape, names)))

    assert on((8, 8), ("dp", "tp")) == on((40, 1), ("dp", "tp")) == 40_000_000
    assert on((128, 8), ("dp", "tp")) == 128_000_000
    assert on((16, 8, 1), ("dp", "ep", "tp")) == 128_000_000


def test_zero0_holds_each_gradient_once_in_its_buffer_real_dry_and_pipelined(monkeypatch):
    """ZeRO-0 (AdamW): the gradients live in the buckets' flat blocks (spmdsim.nn.autograd.grad_buffer, Megatron
    DDP's buffer), the walk writing each into its view as it gives it (the tied table's after the head's backward,
    then the embedding's added there) and each bucket summed there in place. So a rank holds its gradients once:
    at the backward's most, the buffer alone, where a flat copy beside them took 2G, with one bucket (this small
    model) and with buckets of 2,000 elements alike; the dry run measures the same, the pipelined step too, the
    buckets are summed one Allreduce each, and the parameters are the one bucket's bit for bit."""
    import spmdsim.models.gpt.buckets as trainer
    from spmdsim.models.gpt.pipeline import train_pipelined
    from spmdsim.runtime.trace import collect_trace

    def run(dry: bool = False, pipelined: bool = False):
        def body():
            with collect_trace() as trace:
                if pipelined:
                    run_, results = train_pipelined(CFG, spmdsim.world(), 1, 2, 2, 2, TEXT, memory=True,
                                                    check=not dry)
                    params = run_.params
                else:
                    model, results = train(CFG, spmdsim.world(), 2, 2, 2, TEXT, memory=True, check=not dry)
                    params = model.params
            sums = sum(e.label.startswith("gradient bucket") for e in trace.entries if e.op == "allreduce")
            return results[-1].memory, {n: p.local.copy() for n, p in params.items()}, sums
        return spmdsim.simulate(4, body, dry_run=dry)

    one, one_dry, one_pipe = run(), run(dry=True), run(pipelined=True)
    monkeypatch.setattr(trainer, "ZERO_BUCKET", 2000)
    monkeypatch.setattr(trainer, "ZERO_BUCKET_PER_DP", 1)  # 2,000 elements at any dp
    small, small_dry, small_pipe = run(), run(dry=True), run(pipelined=True)
    m1, p1, sums1 = one[0]
    grads = m1.grads  # the summed gradients after the step: each leaf's view of its bucket's block
    assert m1.grads_peak == grads, (m1.grads_peak, grads)
    assert (one_dry[0][0].grads, one_dry[0][0].grads_peak) == (grads, m1.grads_peak)
    assert one_pipe[0][0].grads_peak == one_pipe[0][0].grads
    m2, p2, sums2 = small[0]
    assert m2.grads == grads == m2.grads_peak, (m2.grads_peak, grads)
    assert small_dry[0][0].grads_peak == m2.grads_peak
    assert small_pipe[0][0].grads_peak == small_pipe[0][0].grads
    assert sums2 > sums1 and small_pipe[0][2] > one_pipe[0][2]  # smaller buckets, more sums (2 steps each)
    assert all(p1[n].tobytes() == p2[n].tobytes() for n in p1)


def test_reduce_with_refuses_what_is_no_distributed_adamw_in_one_line():
    """backward(reduce_with=...) takes a DistributedAdamW: AdamW is refused on every rank before any collective. A
    ZeRO-1 one takes each parameter's gradient into its view of the bucket's gradient buffer (its main gradient:
    ``.grad`` a view of that buffer, the values those of a plain backward keeping the gradients pending)."""
    from spmdsim.nn.autograd import backward

    def body():
        mesh = spmdsim.Mesh(Layout((2,), ("dp",)), spmdsim.world())
        (p,) = _params(mesh, [(4, 3)])
        loss = spmdsim.nn.ops.sum(p * p)
        with pytest.raises(OperatorError) as e:
            backward(loss, keep_pending=[p], reduce_with=AdamW([p]))
        zero = DistributedAdamW([p], mesh)
        backward(spmdsim.nn.ops.sum(p * p), keep_pending=[p], reduce_with=zero)
        main = p.grad.local.copy()
        held = np.shares_memory(p.grad.local, zero.gradient_buffers()[0])
        p._ag.grad, p._ag.main = None, None
        backward(spmdsim.nn.ops.sum(p * p), keep_pending=[p])
        return str(e.value), held, main.tobytes() == p.grad.local.tobytes()

    for refused, held, same in spmdsim.simulate(2, body):
        assert "expected a DistributedAdamW (ZeRO-1 or ZeRO-2), got an object of type AdamW" in refused, refused
        assert held and same


def test_the_loss_method_takes_reduce_with_as_the_function_does():
    """``loss.backward(keep_pending=..., reduce_with=zero)`` was Python's "got multiple values for argument
    'reduce_with'": the method passes the function's other arguments, and now this one too."""
    def body():
        mesh = spmdsim.Mesh(Layout((2,), ("dp",)), spmdsim.world())
        (p,) = _params(mesh, [(4, 3)])
        zero = DistributedAdamW([p], mesh)
        spmdsim.nn.ops.sum(p * p).backward(keep_pending=[p], reduce_with=zero)
        return np.shares_memory(p.grad.local, zero.gradient_buffers()[0]), p.grad.local.tobytes(), \
            (2 * p.local).tobytes()

    for held, grad, twice in spmdsim.simulate(2, body):
        assert held and grad == twice


def test_zero1_holds_the_gradients_once_in_its_buffer_real_and_dry():
    """ZeRO-1 (Megatron's main_grad): each parameter's gradient accumulates in its view of the bucket's gradient
    buffer from the walk that gives it, so the most gradient bytes a rank holds in a step (MemoryReport.grads_peak)
    are that buffer alone: the tied table's gradient too, read twice, goes there after the head's backward
    (Megatron's fused weight-gradient kernels add it into main_grad), where the walk held it until the
    embedding's backward added to it (a table beside the buffer), and before that the backward's blocks beside
    the buffer (twice the gradients). Over a pipeline with 4 microbatches, whose end stages read the table once
    each, the buffer alone too. A dry run measures what the real run holds."""
    from spmdsim.models.gpt.pipeline import train_pipelined

    def plain():
        model, results = train(CFG, spmdsim.world(), 2, 2, 2, TEXT, sp=True, zero=1, memory=True, check=False)
        return results[-1].memory, model.params["wte"].local.nbytes

    def piped():
        run, results = train_pipelined(CFG, spmdsim.world(), 2, 2, 2, 2, TEXT, sp=True, microbatches=4, zero=1,
                                       memory=True, check=False)
        run.close()
        return results[-1].memory

    real, dry = spmdsim.simulate(4, plain), spmdsim.simulate(4, plain, dry_run=True)
    for (m, table), (d, _) in zip(real, dry):
        assert m.grads_peak == m.grads and table > 0, (m, table)
        assert (d.grads, d.grads_peak) == (m.grads, m.grads_peak), (d, m)
    real, dry = spmdsim.simulate(8, piped), spmdsim.simulate(8, piped, dry_run=True)
    for m, d in zip(real, dry):
        assert m.grads_peak == m.grads and (d.grads, d.grads_peak) == (m.grads, m.grads_peak), (d, m)


def _params(mesh, shapes, split_over=None):
    from spmdsim.runtime.dtensor import DTensor

    out = []
    for k, shape in enumerate(shapes):
        layout = mesh.layout(*([split_over] + [None] * (len(shape) - 1)))
        rng = np.random.default_rng(k)
        p = DTensor.from_global(mesh, rng.standard_normal(shape), layout)
        out.append(p.requires_grad_())
    return out


@pytest.mark.parametrize("shard_grads", [False, True])
def test_distributed_adamw_buckets_pads_and_steps_as_adamw(shard_grads):
    """Three parameters of 10, 7 and 5 elements on dp 4 (x tp 2), buckets of at most 17 elements: two
    buckets (17 -> padded 20, 5 -> 8), one Reduce_scatter and one Allgather each; the parameters after
    two steps equal AdamW's on the dp-summed gradients. ZeRO-2 (`shard_grads`): the two buckets through one
    shared flat buffer of the larger's 20 elements, in turn; its gradients are this rank's slices (5 + 2
    elements), every ``.grad`` None after the step."""
    from spmdsim.nn import ops
    from spmdsim.runtime.dtensor import DTensor
    from spmdsim.runtime.mesh import Mesh
    from spmdsim.runtime.trace import collect_trace

    shapes = [(10,), (7,), (5,)]

    def body():
        mesh = Mesh(Layout((4, 2), ("dp", "tp")), spmdsim.world())
        mine, ref = _params(mesh, shapes), _params(mesh, shapes)
        zero = DistributedAdamW(mine, mesh, ("dp",), lr=0.1, weight_decay=0.1, decay=[mine[0], mine[2]],
                                bucket=17 * 8, shard_grads=shard_grads)
        adamw = AdamW(ref, lr=0.1, weight_decay=0.1, decay=[ref[0], ref[2]])
        counts = None
        for step in range(2):
            for params, opt in ((mine, zero), (ref, adamw)):
                opt.zero_grad()
                loss = None
                for k, p in enumerate(params):  # sum of X p^2 over a batch split over dp: pending over dp
                    rows = np.random.default_rng(10 * step + k).standard_normal((8,) + shapes[k])
                    x = DTensor.from_global(mesh, rows, mesh.layout("dp", None))
                    term = ops.sum(ops.mul(ops.mul(x, p), p))
                    loss = term if loss is None else loss + term
                if opt is zero:
                    loss.backward(keep_pending=params)
                    with collect_trace() as trace:
                        opt.step()
                    counts = trace.counts()
                else:
                    loss.backward()
                    opt.step()
        same = max(float(np.max(np.abs(a.local - b.local))) for a, b in zip(mine, ref))
        grads = [g.nbytes for g in zero.gradient_buffers()]
        return ([(b.size, b.padded) for b in zero.buckets], same, counts, zero.memory(), grads,
                [p.grad for p in mine])

    for buckets, same, counts, held, grads, left in spmdsim.simulate(8, body):
        assert buckets == [(17, 20), (5, 8)]
        assert same <= 1e-15
        assert counts == {"reduce_scatter": 2, "allgather": 2}
        assert held["optimizer states"] == 2 * (5 + 2) * 8 and held["master copy"] == (5 + 2) * 8
        assert left == [None] * 3
        if shard_grads:
            assert grads == [5 * 8, 2 * 8] and held["buffers"] == 20 * 8 + (5 + 2) * 8  # shared + scratch
        else:
            assert grads == [20 * 8, 8 * 8] and held["buffers"] == 2 * (5 + 2) * 8  # summed slices + scratch


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_distributed_adamw_starts_from_parameters_set_after_it_was_made(dtype):
    """Parameters written after the optimizer was made (weights loaded), and, at float64, between its steps
    (a value clamped by hand), step from their new values as AdamW's do: the master slices once kept the
    values of the optimizer's making and the next Allgather wrote them back over the change (a parameter
    straddles two ranks' slices: buckets of 17 elements on dp 4). bfloat16 parameters are read at the first
    step only, as AdamW makes its float32 master copy then."""
    from spmdsim.nn import ops
    from spmdsim.nn.autograd import no_grad
    from spmdsim.runtime.dtensor import DTensor
    from spmdsim.runtime.mesh import Mesh

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    from spmdsim.base.precision import bfloat16

    low = np.dtype(np.float64) if dtype == "float64" else bfloat16()
    shapes = [(10,), (7,), (5,)]

    def body():
        mesh = Mesh(Layout((4, 2), ("dp", "tp")), spmdsim.world())
        mine, ref = _params(mesh, shapes), _params(mesh, shapes)
        if low != np.float64:  # (x.astype records the cast: a leaf of its own cast under no_grad)
            with no_grad():
                mine, ref = ([p.astype(low) for p in ps] for ps in (mine, ref))
            mine, ref = ([p.requires_grad_() for p in ps] for ps in (mine, ref))
        zero = DistributedAdamW(mine, mesh, ("dp",), lr=0.1, weight_decay=0.1, bucket=17 * low.itemsize)
        adamw = AdamW(ref, lr=0.1, weight_decay=0.1)
        for step in range(3):
            if step == 0 or low == np.float64:  # loaded, then clamped by hand between steps
                for p in mine + ref:
                    p.local[...] = (np.clip(p.local.astype(np.float64), -0.5, 0.5) + step).astype(low)
            for params, opt in ((mine, zero), (ref, adamw)):
                opt.zero_grad()
                loss = None
                for k, p in enumerate(params):
                    rows = np.random.default_rng(10 * step + k).standard_normal((8,) + shapes[k])
                    x = DTensor.from_global(mesh, rows.astype(low), mesh.layout("dp", None))
                    term = ops.sum(ops.mul(ops.mul(x, p), p))
                    loss = term if loss is None else loss + term
                if opt is zero:
                    loss.backward(keep_pending=params)
                else:
                    loss.backward()
                opt.step()
        return max(float(np.max(np.abs(a.local.astype(np.float64) - b.local.astype(np.float64))))
                   for a, b in zip(mine, ref))

    for differ in spmdsim.simulate(8, body):
        # The same update on the same values but for the order of the dp sums (measured: equal); at bfloat16
        # such a last float32 bit may move one rounding of the master: one bfloat16 ulp of a value below 1.
        assert differ <= (1e-15 if low == np.float64 else 2 ** -8), differ


def test_keep_pending_accumulates_microbatches_and_refuses_what_is_no_list_of_leaves():
    """Two half-batch microbatches (each loss halved) with keep_pending, then reduce_grads: the whole batch's
    gradients (dp 2 x tp 2). keep_pending=p (one DTensor) was iterated by rows and anything not a leaf skipped,
    so the gradient was summed at once without a word; each is now refused in one line, alike on every rank."""
    from spmdsim import OperatorError
    from spmdsim.nn import ops
    from spmdsim.nn.autograd import reduce_grads
    from spmdsim.nn.ops import ColumnParallelLinear, RowParallelLinear
    from spmdsim.runtime.dtensor import DTensor
    from spmdsim.runtime.mesh import Mesh

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 6)), rng.standard_normal((8, 4))

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        layout = mesh.layout("dp", None)
        fc1 = ColumnParallelLinear(mesh, 6, 8, axes="tp", dtype="float64", seed=1)
        fc2 = RowParallelLinear(mesh, 8, 4, input_is_parallel=True, axes="tp", dtype="float64", seed=3)
        params = [fc1.weight, fc1.bias, fc2.weight, fc2.bias]

        def loss(rows, scale=1.0):
            X, Y = (DTensor.from_global(mesh, a[rows], layout) for a in (x, y))
            return ops.mse_loss(fc2(ops.relu(fc1(X))), Y) * scale

        loss(slice(None)).backward()
        whole = [p.grad.local.copy() for p in params]
        SGD(params, lr=0.1).zero_grad()
        for half in (slice(0, 4), slice(4, 8)):
            loss(half, 0.5).backward(keep_pending=params)
        pending = [p.grad.layout.partial for p in params]
        reduce_grads(params)
        accumulated = [p.grad.local for p in params]
        refusals = []
        for bad in (fc1.weight, [fc1.weight * 1.0], [np.zeros(3)]):
            try:
                loss(slice(None)).backward(keep_pending=bad)
            except OperatorError as exc:
                refusals.append(str(exc))
        return whole, pending, accumulated, refusals

    for whole, pending, accumulated, refusals in spmdsim.simulate(4, body):
        assert pending == [("dp",)] * 4
        for a, w in zip(accumulated, whole):  # two sums of 4 rows against one of 8: a few roundings apart
            assert np.max(np.abs(a - w)) <= 1e-14 * np.max(np.abs(w))
        assert refusals == [
            "backward(keep_pending=...): expected an iterable of parameters (a list, optimizer.params), got a "
            "DTensor of global shape (6, 8) (a leaf); one parameter goes in a list: keep_pending=[p]",
            "backward(keep_pending=...): entry 0 is a DTensor of global shape (6, 8) (computed by an op); "
            "expected a leaf DTensor with requires_grad_() (a parameter)",
            "backward(keep_pending=...): entry 0 is an object of type ndarray; expected a leaf DTensor with "
            "requires_grad_() (a parameter)"]


def test_zero1_in_a_dry_run_counts_states_divided_by_dp(monkeypatch):
    """The meter is given, for DistributedAdamW, the moments, master copy and scratch of this rank's slices
    (4 x 1/dp of the parameters' bytes), where AdamW's dry step counts 4 x the parameters' bytes."""
    from spmdsim.runtime.sim.dry_meter import Meter

    counted: dict = {}
    real = Meter.count

    def count(meter, owner, nbytes):
        counted[type(owner).__name__] = nbytes
        real(meter, owner, nbytes)

    monkeypatch.setattr(Meter, "count", count)
    params = {}
    for zero in (0, 1):
        params[zero] = spmdsim.simulate(8, lambda: sum(
            p.local.nbytes for p in train(CFG, spmdsim.world(), 4, 2, 1, TEXT, sp=True, zero=zero)[0].params.values()),
            dry_run=True)[0]
    assert params[0] == params[1]
    adamw, zero1 = counted["AdamW"], counted["DistributedAdamW"]
    assert adamw == 4 * params[0]
    elements = params[0] // 8
    assert zero1 == 4 * 8 * (-(-elements // 4))  # 4 slices of the padded flat buffer / dp 4
    assert adamw / zero1 == pytest.approx(4, rel=1e-3)


def test_replayed_steps_with_recomputation_and_zero1_are_checked_alike():
    steps = spmdsim.simulate(4, lambda: train(CFG, spmdsim.world(), 2, 2, 3, TEXT, sp=True, replay=True,
                                              recompute="full", zero=1)[1])[0]
    assert all(r.passed for r in steps), steps


def test_a_replayed_steps_memory_report_is_the_eager_steps():
    """A replayed step runs none of the step's Python, so its memory report was the captured step 0's under the
    later step's number: step 0's peak held no optimizer states yet (eager step 1: 3,435,720 bytes after the
    forward; replayed: 2,528,456 under 'step 1'). Now the captured looks with the states every later step holds."""
    def run(replay):
        return [r.memory for r in train(CFG, spmdsim.world(), 2, 2, 3, TEXT, sp=True, replay=replay, memory=True,
                                        zero=1)[1]]

    for eager, replayed in spmdsim.simulate(4, lambda: (run(False), run(True))):
        assert replayed == eager and eager[1] != eager[0] and eager[2].step == 2


def test_clipping_with_zero1_clips_the_joint_norm_of_the_slices():
    import dataclasses

    clipped = dataclasses.replace(CFG, clip=0.05)
    steps = spmdsim.simulate(8, lambda: train(clipped, spmdsim.world(), 2, 4, 2, TEXT, sp=True, zero=1)[1])[0]
    assert all(r.passed for r in steps), steps


def test_bad_choices_are_refused_in_one_line_before_any_collective():
    with pytest.raises(SpmdsimError, match=r"^recompute 'foo' is not one of 'none', 'selective', 'full'"):
        spmdsim.simulate(2, lambda: train(CFG, spmdsim.world(), 2, 1, 1, TEXT, recompute="foo"))
    with pytest.raises(SpmdsimError, match=r"^zero 4 is not 0, 1, 2 or 3 \(ZeRO-1: "):
        spmdsim.simulate(2, lambda: train(CFG, spmdsim.world(), 2, 1, 1, TEXT, zero=4))
    from spmdsim.models.gpt.parallel import GPT
    from spmdsim.runtime.mesh import Mesh

    with pytest.raises(SpmdsimError, match=r"recompute True is not one of"):
        spmdsim.simulate(2, lambda: GPT(CFG, Mesh(Layout((2, 1), ("dp", "tp")), spmdsim.world()), recompute=True))


def test_distributed_adamw_refusals():
    from spmdsim.nn import ops
    from spmdsim.runtime.mesh import Mesh

    def body(case):
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        if case == "axes":
            DistributedAdamW(_params(mesh, [(4,)]), mesh, dp_axes=("data",))
        params = _params(mesh, [(4,)])
        opt = DistributedAdamW(params, mesh)
        x = spmdsim.DTensor.from_global(mesh, np.ones(2), mesh.layout("dp"))
        (ops.sum(ops.mul(params[0], params[0])) * ops.sum(x)).backward()  # summed over dp already
        opt.step()

    for case, message in (("axes", r"dp_axes \('data',\) must name distinct axes of the mesh \('dp', 'tp'\)"),
                          ("summed", r"parameter 0's gradient .* is not pending over \('dp',\): run "
                                     r"loss.backward\(keep_pending=optimizer.params\)")):
        with pytest.raises(OperatorError, match=message):
            spmdsim.simulate(4, lambda: body(case))


def test_checkpoint_refuses_a_region_reading_a_parameter_it_was_not_given():
    from spmdsim.nn import ops
    from spmdsim.nn.autograd import checkpoint
    from spmdsim.runtime.mesh import Mesh

    def body():
        mesh = Mesh(Layout((2,), ("dp",)), spmdsim.world())
        w, x = _params(mesh, [(4,), (4,)])
        y = checkpoint(lambda t: ops.mul(t, w), ops.mul(x, x))
        ops.sum(y).backward()

    with pytest.raises(OperatorError, match=r"a recomputed region read a tensor requiring grad that it was "
                                            r"not given \(global shape \(4,\)"):
        spmdsim.simulate(2, body)


def test_checkpoint_gradients_equal_the_plain_region():
    from spmdsim.nn import ops
    from spmdsim.nn.autograd import checkpoint
    from spmdsim.runtime.mesh import Mesh

    def body(recomputed):
        mesh = Mesh(Layout((2,), ("dp",)), spmdsim.world())
        w, x = _params(mesh, [(4,), (4,)])
        region = (lambda t, *_: ops.tanh(ops.mul(t, w)))
        h = ops.mul(x, x)
        y = checkpoint(region, h, w) if recomputed else region(h)
        ops.sum(ops.mul(y, y)).backward()
        return w.grad.local.copy(), x.grad.local.copy()

    plain, again = spmdsim.simulate(2, lambda: body(False)), spmdsim.simulate(2, lambda: body(True))
    for (a, b), (c, d) in zip(plain, again):
        assert np.array_equal(a, c) and np.array_equal(b, d)


def test_korthikanti_formula_is_the_papers():
    """Table 2 of Korthikanti et al. (2-byte values, 1-byte masks): 34 sbh + 5 as^2b with no parallelism;
    tensor parallel sbh(10 + 24/t) + 5as^2b/t; with sp sbh 34/t; selective drops the as^2b term; full
    keeps 2 sbh."""
    assert korthikanti_bytes(1, 1, 1, 1, 1, False, "none") == (34, 5)
    assert korthikanti_bytes(1, 1, 1, 1, 4, False, "none") == (10 + 24 / 4, 5 / 4)
    assert korthikanti_bytes(1, 1, 1, 1, 4, True, "none") == (34 / 4, 5 / 4)
    assert korthikanti_bytes(1, 1, 1, 1, 4, True, "selective") == (34 / 4, 0)
    assert korthikanti_bytes(1, 1, 1, 1, 1, False, "full") == (2, 0)
    assert korthikanti_bytes(2, 3, 5, 7, 1, False, "none", 8, 8) == (18 * 8 * 30, 3 * 8 * 7 * 4 * 3)


def _example(*args: str):
    """`python examples/train_gpt.py ARGS`; on `--ranks N` in this process (docs_commands.run_example)."""
    from docs_commands import run_example

    return run_example("examples/train_gpt.py", *args)


def test_train_gpt_with_both_features_passes_and_prints_its_memory():
    out = _example("--ranks", "8", "--dp", "2", "--tp", "4", "--sp", "--layers", "1", "--d-model", "32", "--seq",
                   "16", "--batch", "4", "--steps", "2", "--sample", "0", "--recompute", "full", "--zero", "1",
                   "--memory")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "memory: recompute full; ZeRO-1 (states and master copy sharded over dp)" in lines
    assert "check: 2 steps vs one numpy process (loss, 19 gradients and parameters each): PASS" in lines
    at = next(i for i, line in enumerate(lines) if line.startswith("memory (rank 0, step 1, bytes): kept for"))
    assert lines[at + 1].startswith("  embedding ") and "block input 2,048" in lines[at + 1]
    assert lines[at + 2].startswith("  parameters ") and lines[at + 4].startswith("  peak ")
    assert max(len(line) for line in lines) <= 100


def test_train_gpt_says_zero_at_dp_1_shards_nothing():
    """`--zero 1 --dp 1` ran as if it sharded the states (as `--sp` at tp 1 says it splits nothing)."""
    out = _example("--ranks", "2", "--dp", "1", "--tp", "2", "--layers", "1", "--d-model", "32", "--seq", "16",
                   "--batch", "4", "--steps", "1", "--sample", "0", "--zero", "1")
    assert out.returncode == 0, out.stderr
    assert ("memory: recompute none; ZeRO-1 (states and master copy sharded over dp: a no-op, dp 1 shards "
            "nothing)") in out.stdout.splitlines(), out.stdout


def test_train_gpt_says_selective_recomputation_is_none_under_flash_attention():
    """`--attention flash --recompute selective` said `memory: recompute selective`, though flash attention keeps
    no scores for selective recomputation to drop (docs/howto/memory.md): the run is `none`'s."""
    out = _example("--ranks", "2", "--tp", "2", "--layers", "1", "--d-model", "32", "--seq", "16", "--batch", "4",
                   "--steps", "1", "--sample", "0", "--attention", "flash", "--recompute", "selective")
    assert out.returncode == 0, out.stderr
    assert "memory: recompute selective (as none: flash keeps no scores)" in out.stdout.splitlines(), out.stdout


@pytest.mark.parametrize("flag, value, message", [
    # the flag typed, not the field it sets ("zero 4")
    ("--recompute", "foo", "--recompute 'foo' is not one of 'none', 'selective', 'full'"),
    ("--kept", "fused", "--kept 'fused' is not one of 'graph', 'megatron'"),
    ("--zero", "one", "--zero 'one' is not 0, 1, 2 or 3 (ZeRO-1: optimizer states and master copy sharded over "
                      "dp; ZeRO-2: gradients too; ZeRO-3: parameters too)"),
    ("--zero", "4", "--zero 4 is not 0, 1, 2 or 3 (ZeRO-1: optimizer states and master copy sharded over dp; "
                    "ZeRO-2: gradients too; ZeRO-3: parameters too)")])
def test_train_gpt_refuses_a_bad_choice_in_one_line(flag, value, message):
    from testkit import unfold

    out = _example("--ranks", "2", "--tp", "1", "--steps", "1", flag, value)
    assert out.returncode == 2, out.stderr
    assert unfold(out.stderr).strip().splitlines()[-1] == f"spmdsim: error: {message}"


def test_memory_in_a_dry_run_prints_the_ledger_below_the_report():
    """`train_gpt.py --dry-run --memory` printed the dry run's table and nothing of --memory (a dry run hides the
    program's own output): the ledger's lines go below the report (spmdsim.runtime.sim.dry.note), as a real run's."""
    from testkit import run_train_gpt

    argv = ["--ranks", "4", "--steps", "1", "--layers", "2", "--d-model", "16", "--seq", "8", "--memory"]
    dry = run_train_gpt(argv + ["--dry-run"])
    real = run_train_gpt(argv + ["--no-check"])
    assert dry.returncode == 0 and real.returncode == 0, dry.stderr + real.stderr
    assert "--memory: the step's ledger by role" in dry.stdout, dry.stdout
    for out in (dry.stdout, real.stdout):
        assert "memory (rank 0, step 0, bytes): kept for backward" in out and "optimizer states" in out, out


def test_step_need_counts_what_a_rank_surely_holds_from_the_shapes():
    """The pre-check's shape-only count (spmdsim.models.gpt.memory.step_need), by hand: one layer's scores (local
    batch, local heads, seq, seq); each layer's kept set at least Megatron's (Korthikanti's s·b·h terms; the
    graph keeps dropout's factors as values, Megatron a byte) and its attention core's probabilities, dropped-out
    values and mask; at the last layer's softmax two blocks of scores instead of its kept set; the rank's weight
    matrices and (one stage) embedding; or, at the step's end, the weights, their gradients and AdamW's moments."""
    from dataclasses import replace

    from spmdsim.models.gpt.memory import step_need

    cfg = GPTConfig(layers=4, d_model=128, heads=4, seq=1000, batch=8, dropout=0.1)
    need = step_need(cfg, 2, 4)  # dp 2, tp 4, no sp, the graph's kept set, fp64
    sbh, elements = 1000 * 4 * 128, 4 * 1 * 1000 * 1000
    assert need.shape == (4, 1, 1000, 1000) and need.block == elements * 8 and need.width == 8
    assert need.words() == "4 sequences x 1 head x 1,000 x 1,000 at 8 bytes"
    weights = 8 * (4 * 12 * 128 * 128 + 128 * 128) // 4  # the layers' matrices and the embedding, over tp
    other = sbh * (4 * 8 + 2 * 8) + sbh * 12 * 8 // 4  # whole: 4 values, 2 factors; over tp: 12 values
    logits = 4 * 1000 * 128 // 4 * 8  # the head's (local batch, seq, vocab / tp) at the forward's end
    assert need == replace(need, nbytes=weights + 4 * other + logits + 4 * elements * 24, moment="in the forward",
                           attention=4 * elements * 24, activations=4 * other + logits, states=weights)
    megatron = step_need(cfg, 2, 4, sp=True, kept="megatron")  # masks a byte, the whole terms over tp with sp
    assert megatron.activations == 4 * (sbh * (4 * 8 + 2) // 4 + sbh * 12 * 8 // 4) + logits
    assert megatron.attention == 4 * elements * 17
    selective = step_need(cfg, 2, 4, recompute="selective")  # the last softmax's 2 blocks beside 3 kept sets
    assert (selective.attention, selective.activations) == (2 * need.block, 3 * other)
    # 2 layers a stage, batch 8 / 4; full recomputation keeps each layer's input (over tp with sp): the first
    # layer's beside the last softmax's 2 blocks
    stage = step_need(cfg, 1, 2, pp=2, microbatches=4, recompute="full", sp=True)
    assert (stage.shape, stage.activations, stage.attention) == ((2, 2, 1000, 1000), 1000 * 2 * 128 * 8 // 2,
                                                                 2 * 2 * 2 * 1000 * 1000 * 8)
    wide = GPTConfig(layers=2, d_model=256, heads=4, seq=8, batch=2)  # states outweigh the activations
    end = step_need(wide, 2, 1, zero=1, precision="bf16-mixed")
    w = 2 * 12 * 256 * 256 + 128 * 256
    assert (end.moment, end.nbytes) == ("at the step's end", w * 2 + (w * 4 + 2 * w * 4 + w * 4) // 2)


def test_step_need_takes_its_widths_from_the_precision():
    """Every width is the policy's own dtype's itemsize (Precision.dtype): a policy whose activations are
    numpy's "half" (float16 by another name) counts 2 bytes an element. The count kept its own table of
    activation dtypes by name, which lacked "half" and counted 8."""
    from dataclasses import replace

    from spmdsim.models.gpt.memory import step_need
    from spmdsim.base.precision import PRESETS

    cfg = GPTConfig(layers=2, d_model=32, heads=4, seq=100, batch=2)
    half = replace(PRESETS["fp32"], activation="half")
    need = step_need(cfg, 1, 1, precision=half)
    assert need.width == half.dtype("activation").itemsize == 2 and need.block == 2 * 4 * 100 * 100 * 2
    assert step_need(cfg, 1, 1, precision="bf16-mixed").width == 2
    assert step_need(cfg, 1, 1, precision="fp32").width == 4


@pytest.mark.parametrize("case", [
    dict(pp=1, dp=2, tp=2, sp=True),
    dict(pp=2, dp=1, tp=2, sp=True, recompute="selective", kept="megatron", precision="bf16-mixed"),
    dict(pp=1, dp=2, tp=1, recompute="full", zero=1, dropout=0.0),
    dict(pp=1, dp=1, tp=2, ep=2, experts=4, kept="megatron"),
])
def test_step_need_lies_below_the_dry_runs_peak(case):
    """A lower bound of `spmdsim estimate`'s peak (spmdsim.tools.estimate.ledger.stage_memory: a real step's bytes,
    tests/test_estimate_ledger.py), so the pre-check never refuses a step that fits; within a factor of 4 (a
    small model's buffers, positions and logits, which it leaves out, weigh more than a large one's)."""
    from spmdsim.tools.estimate.ledger import gpt_ledger, stage_memory
    from spmdsim.models.gpt.memory import step_need
    from spmdsim.models.moe import MoEConfig

    case = dict(case)
    precision, dropout, experts = case.pop("precision", "fp64"), case.pop("dropout", 0.1), case.pop("experts", 0)
    pp, dp, tp = case.pop("pp"), case.pop("dp"), case.pop("tp")
    cfg = GPTConfig(layers=4, d_model=64, heads=4, seq=128, batch=4, dropout=dropout,
                    moe=MoEConfig(experts=experts, top_k=1) if experts else None)
    m = 2 if pp > 1 else 1
    stages = gpt_ledger(cfg, pp, dp, tp, microbatches=m, **case)
    peak = max(stage_memory(s, precision, case.get("zero", 0)).peak for s in stages)
    need = step_need(cfg, dp, tp, pp=pp, microbatches=m, precision=precision, **case)
    assert peak / 4 < need.nbytes <= peak


@pytest.mark.parametrize("cfg, kw, moment", [
    (GPTConfig(layers=2, d_model=32, heads=4, seq=64, batch=4, dropout=0.1), dict(dp=1, tp=2, sp=True),
     "in the forward"),
    (GPTConfig(layers=2, d_model=128, heads=4, seq=8, batch=2, dropout=0.1), dict(dp=2, tp=1, zero=1,
                                                                                 kept="megatron"),
     "at the step's end"),
])
def test_step_need_lies_below_a_real_steps_measured_peak(cfg, kw, moment):
    """Two steps that run, measured (train(memory=True): the largest of the totals after the forward, the backward
    and the step): the need, at the moment it names, is below what the step held."""
    from spmdsim.models.gpt.memory import step_need

    kw = dict(kw)
    dp, tp = kw.pop("dp"), kw.pop("tp")
    need = step_need(cfg, dp, tp, **kw)
    peaks = spmdsim.simulate(2, lambda: train(cfg, spmdsim.world(), dp, tp, 2, TEXT, memory=True, check=False,
                                              **kw)[1][-1].memory.peak)
    assert need.moment == moment and need.nbytes <= min(peaks)


def test_a_step_that_cannot_fit_is_refused_before_any_block_is_made(monkeypatch):
    """`train_gpt.py --ranks 8 --seq 100000` ran 91 s until the simulator's memory stop (20.5 GiB): one layer's
    scores alone are terabytes a rank. train() and train_pipelined() now compare the attention's shape-only
    need with what a rank may use and refuse in one line, every rank alike, before any block is made."""
    from spmdsim.models.gpt.pipeline import train_pipelined

    big = GPTConfig(layers=2, d_model=32, heads=4, seq=100_000, batch=8)
    text = encode(load_text(200_000))
    monkeypatch.setenv("SPMDSIM_MEMORY", "1GiB")
    with pytest.raises(SpmdsimError) as got:
        spmdsim.simulate(2, lambda: train(big, spmdsim.world(), 1, 2, 1, text))
    assert str(got.value).splitlines()[0] == (  # the graph's kept set: each layer's 3 blocks of (8, 2, s, s)
        "the GPT's training step needs at least 6.99 TiB per rank in the forward at seq 100,000 (the attention's "
        "scores 6.98 TiB, one layer's 1.16 TiB: 8 sequences x 2 heads x 100,000 x 100,000 at 8 bytes; other "
        "activations kept for backward 4.96 GiB; parameters 112 KiB) but a rank may use 1 GiB "
        "(SPMDSIM_MEMORY=1GiB); use a smaller seq or batch (--seq, --batch), more ranks, or a dry run "
        "(--dry-run, or `spmdsim estimate gpt`: the step's peak per rank); SPMDSIM_MEMORY=SIZE|off changes the "
        "limit")
    with pytest.raises(SpmdsimError, match=r"^the GPT's training step needs at least 1.75 TiB per rank .* one "
                                           r"layer's 596 GiB: 2 sequences x 4 heads x 100,000 x 100,000 at 8 bytes;"):
        spmdsim.simulate(2, lambda: train_pipelined(big, spmdsim.world(), 2, 1, 1, 1, text, microbatches=4))
    wide = GPTConfig(layers=2, d_model=1024, heads=4, seq=8, batch=2)  # 25.3 M weights: 4 x 8 bytes each at the end
    with pytest.raises(SpmdsimError, match=r"^the GPT's training step needs at least 772 MiB per rank at the step's "
                                           r"end at seq 8 \(parameters, gradients and optimizer states 772 MiB\) "
                                           r"but a rank may use 512 MiB"):
        monkeypatch.setenv("SPMDSIM_MEMORY", "512MiB")
        spmdsim.simulate(2, lambda: train(wide, spmdsim.world(), 2, 1, 1, text))
    monkeypatch.delenv("SPMDSIM_MEMORY")  # the machine's room, less what the memory stop keeps free
    with pytest.raises(SpmdsimError, match=r"^the GPT's training step needs at least 6.99 TiB per rank .* kept "
                                           r"free for the memory stop\); use a smaller seq"):
        spmdsim.simulate(2, lambda: train(big, spmdsim.world(), 1, 2, 1, text))
    monkeypatch.setenv("SPMDSIM_MEMORY", "64K")  # a dry run writes no block: never refused
    assert len(spmdsim.simulate(2, lambda: train(CFG, spmdsim.world(), 1, 2, 1, TEXT)[1], dry_run=True)) == 2


def test_a_step_whose_check_cannot_fit_is_refused_naming_the_check(monkeypatch):
    """A step whose ranks' shares fitted passed the memory check and could be killed by the kernel without a line
    (`train_gpt.py --ranks 4 --vocab 20000000`, before the logits were counted and --vocab bounded): the check's
    one numpy process holds the whole model's parameters, gradients and moments beside the ranks' (19.1 GiB). The
    check's bytes now count too, shared by the node's ranks, and the refusal names --no-check."""
    from spmdsim.models.gpt.memory import check_need
    from spmdsim.models.gpt.step_looks import step_memory_problem

    wide = GPTConfig(layers=2, d_model=1024, heads=4, seq=8, batch=2)  # 25.3 M weights: 4 x 8 bytes each
    assert check_need(wide) == 4 * 8 * (2 * 12 * 1024 ** 2 + 128 * 1024)
    monkeypatch.setenv("SPMDSIM_MEMORY", "1GiB")
    said = spmdsim.simulate(2, lambda: [step_memory_problem(wide, spmdsim.world(), 2, 1, check=check)
                                        for check in (False, True)])
    assert said[0] == said[1]
    assert said[0][0] is None
    assert said[0][1] == (
        "the GPT's training step and its check need at least 1.13 GiB per rank: the step 772 MiB at the step's end, "
        "and the check's one numpy process 772 MiB (the whole model's parameters, gradients and optimizer states) "
        "over the 2 ranks on this node, 386 MiB each; but a rank may use 1 GiB (SPMDSIM_MEMORY=1GiB); leave out the "
        "check (--no-check), or use a smaller model or more ranks; SPMDSIM_MEMORY=SIZE|off changes the limit")


def test_the_train_page_quotes_the_checks_refusal_as_printed():
    """docs/howto/train.md's command whose check cannot fit beside its ranks prints the figures the page says."""
    command = ("SPMDSIM_MEMORY=6GiB python examples/train_gpt.py --ranks 4 --vocab 16000000 --layers 1 --d-model 32 "
               "--seq 16 --steps 2 --sample 0")
    page = " ".join((ROOT / "docs/howto/train.md").read_text().split())
    assert f"`{command}`, whose ranks need 4.77 GiB each" in page and "the check's 15.3 GiB" in page
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPMDSIM_")} | {"SPMDSIM_MEMORY": "6GiB"}
    out = subprocess.run([sys.executable, *command.split()[2:]], cwd=ROOT, env=env, text=True, capture_output=True,
                         timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert " ".join(out.stderr.split()) == (
        "spmdsim: error: the GPT's training step and its check need at least 8.58 GiB per rank: the step 4.77 GiB "
        "in the forward, and the check's one numpy process 15.3 GiB (the whole model's parameters, gradients and "
        "optimizer states) over the 4 ranks on this node, 3.81 GiB each; but a rank may use 6 GiB "
        "(SPMDSIM_MEMORY=6GiB); leave out the check (--no-check), or use a smaller model or more ranks; "
        "SPMDSIM_MEMORY=SIZE|off changes the limit")


def test_step_need_counts_a_context_parallel_ranks_share_of_the_sequence():
    """`train_gpt.py --ranks 8 --cp 8 --seq 8192 --d-model 32 --heads 1 --layers 1 --batch 1` was refused under
    SPMDSIM_MEMORY=1GiB ("needs at least 1.54 GiB per rank"): the count took each rank's attention over the whole
    sequence, where the ring's rank 0 held 18.7 MB at its peak. With cp a rank counts its seq / cp tokens and no
    kept scores (the ring keeps none; allgather's and alltoall's are no fewer), still below a real step's peak."""
    from dataclasses import replace

    from spmdsim.models.gpt.memory import step_need

    cfg = GPTConfig(layers=1, d_model=32, heads=1, seq=2048, batch=1)
    need = step_need(cfg, 1, 1, cp=4)
    assert need == step_need(replace(cfg, seq=512, attention="flash"), 1, 1)
    assert step_need(cfg, 1, 1).nbytes > 16 * need.nbytes
    peaks = spmdsim.simulate(4, lambda: train(cfg, spmdsim.world(), 1, 1, 1, TEXT, memory=True, check=False,
                                              cp=4)[1][-1].memory.peak)
    assert need.nbytes <= min(peaks)
