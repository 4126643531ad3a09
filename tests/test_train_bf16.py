"""Mixed precision (docs/howto/bf16.md) on simulated ranks.

A bf16-mixed run is checked each step against one numpy process under the same policy
(spmdsim.models.gpt.mixed): the loss and the gradients within the policy's tolerances, the optimizer
exactly (AdamW in float32 on the run's own gradients and moments). The check must fail for a
reference that ignores the policy, for a run that skips a rounding point and for a wrong update;
bfloat16 moves and is kept in 2 bytes an element.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

import spmdsim
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.tolerances import longest_sum, tolerances
from spmdsim.models.gpt.train import train
from spmdsim.base.precision import PRESETS, precision, precision_problem

pytest.importorskip("ml_dtypes")

CFG = GPTConfig(layers=2, d_model=32, heads=4, seq=16, batch=8, dropout=0.2)
TEXT = encode(load_text(20_000))


def _steps(ranks: int, dp: int, tp: int, sp: bool, steps: int = 3, policy: str = "bf16-mixed", **kw) -> list:
    results = spmdsim.simulate(ranks, lambda: train(CFG, spmdsim.world(), dp, tp, steps, TEXT, sp=sp,
                                                    precision=policy, **kw)[1])
    assert all(r == results[0] for r in results)  # every rank reports the same
    return results[0]


def test_policies_and_refusals_are_one_line():
    assert list(PRESETS) == ["fp64", "fp32", "bf16-mixed", "fp8", "fp8-current"]
    mixed = precision("bf16-mixed")
    assert (mixed.param, mixed.grad, mixed.master, mixed.optimizer, mixed.activation) == (
        "bfloat16", "float32", "float32", "float32", "bfloat16")
    assert precision_problem("bf16") == "precision 'bf16' must be one of fp64, fp32, bf16-mixed, fp8, fp8-current"
    assert precision_problem("fp16-mixed") == (  # the estimate's, where a user meets it first (the README)
        "precision 'fp16-mixed' must be one of fp64, fp32, bf16-mixed, fp8, fp8-current (fp16-mixed, with its loss "
        "scaling, is priced by `spmdsim estimate --precision fp16-mixed` but not trained here; bf16-mixed trains "
        "in the same 2-byte values)")
    for bad, message in (({"precision": "bf16"}, "must be one of"), ({"precision": "fp32", "kept": "fused"},
                                                                     "kept 'fused' is not one of")):
        with pytest.raises(SpmdsimError, match=message) as caught:  # before any collective: on every rank alike
            spmdsim.simulate(4, lambda: train(CFG, spmdsim.world(), 2, 2, 1, TEXT, **bad))
        assert "\n" not in str(caught.value)


def test_without_ml_dtypes_bf16_is_refused_in_one_line(monkeypatch):
    from spmdsim.base import precision as module

    monkeypatch.setattr(module, "_BF16", [])
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # import ml_dtypes now raises ImportError
    assert precision_problem("bf16-mixed") == "precision 'bf16-mixed' needs ml_dtypes: pip install -e '.[bf16]'"
    assert precision_problem("fp32") is None


def test_tolerances_follow_the_policy_and_the_model():
    assert tolerances(precision("fp64"), CFG) == (1e-10,) * 3
    K = longest_sum(CFG)
    assert K == max(CFG.batch * CFG.seq, 4 * CFG.d_model, CFG.vocab)
    eps32 = float(np.finfo(np.float32).eps)
    loss, grads, params = tolerances(precision("bf16-mixed"), CFG)
    assert loss == K * eps32 and grads == 2 * 2.0 ** -8 * (CFG.layers + 2) and params == 8 * eps32
    assert tolerances(precision("fp32"), CFG) == (K * eps32, K * eps32, 8 * eps32)


@pytest.mark.parametrize("ranks, dp, tp, sp", [(4, 2, 2, True), (4, 1, 4, False), (2, 2, 1, False)])
def test_bf16_steps_match_one_numpy_process_under_the_same_policy(ranks, dp, tp, sp):
    steps = _steps(ranks, dp, tp, sp)
    for r in steps:
        assert r.passed, r
        assert r.tolerances == tolerances(precision("bf16-mixed"), CFG)
        assert r.errors[2] == 0.0  # the optimizer's float32 update on the run's own gradients: exact
        assert 0.0 <= r.errors[0] < r.tolerances[0] and 0.0 < r.errors[1] < r.tolerances[1]
    assert steps[-1].loss < steps[0].loss


def test_fp32_steps_match_one_numpy_process_under_the_same_policy():
    for r in _steps(4, 2, 2, True, policy="fp32"):
        assert r.passed and r.errors[2] == 0.0, r
        assert r.errors[1] < 1e-5  # float32's own rounding, far inside the K eps32 allowed


@pytest.mark.parametrize("policy", ["bf16-mixed", "fp32"])
def test_a_replayed_low_precision_step_is_the_eager_one_bit_for_bit(policy):
    # Step 0 captured, steps 1-3 replayed (spmdsim.runtime.replay): the same losses, the same differences from
    # the reference (each step checked), the same parameters and float32 master copies at the end.
    def run(replay: bool) -> tuple:
        model, steps = train(CFG, spmdsim.world(), 2, 2, 4, TEXT, sp=True, precision=policy, replay=replay)
        return steps, {name: t.local.tobytes() for name, t in model.params.items()}

    eager, replayed = (spmdsim.simulate(4, lambda: run(replay))[0] for replay in (False, True))
    assert [(r.loss, r.errors) for r in replayed[0]] == [(r.loss, r.errors) for r in eager[0]]
    assert all(r.passed for r in replayed[0]) and replayed[1] == eager[1]


def _caught(steps: list, kind: int) -> bool:
    return any(r.errors[kind] > r.tolerances[kind] for r in steps) and not all(r.passed for r in steps)


@pytest.mark.parametrize("name, factor", [("h1.attn.wq", 0.0), ("h0.mlp.b2", 1.125)])
def test_a_wrong_small_gradient_fails_against_its_own_rounding(monkeypatch, name, factor):
    """Docs/explanation/tolerances.md, "Low precision": one layer's query-weight gradient zeroed before every
    update (under 1e-3 of the model's largest gradient entry, so within the gradients' tolerance of it), or a
    bias gradient 1/8 too large, fails every step under bf16-mixed by its rounding ratio (the difference over
    4x the reference's distance from the fp32 step, or 2u (L + 2) of its own largest entry), as at fp64; the
    correct run's ratio stays under 0.5."""
    import spmdsim.models.gpt.train as T
    from spmdsim.nn import optimizer

    real_step, real_init = optimizer._Optimizer.step, T._Checker.__init__

    def wrong_step(self):
        target = getattr(self, "wrong", None)
        if target is not None:
            target.grad.local[...] *= factor
        return real_step(self)

    def marking_init(self, model, opt, *rest, **kw):
        opt.wrong = model.params[name]
        return real_init(self, model, opt, *rest, **kw)

    correct = _steps(4, 2, 2, True)
    assert all(r.passed and 0.0 < r.rounding < 0.5 for r in correct), correct
    monkeypatch.setattr(optimizer._Optimizer, "step", wrong_step)
    monkeypatch.setattr(T._Checker, "__init__", marking_init)
    low = _steps(4, 2, 2, True)
    assert all(not r.passed and r.rounding > 1.0 for r in low), low
    if factor == 0.0:  # within the gradients' tolerance of the model's largest entry: caught by its own alone
        assert all(r.errors[1] <= r.tolerances[1] for r in low), low
    assert not any(r.passed for r in _steps(4, 2, 2, True, policy="fp64"))


def test_a_reference_that_ignores_the_policy_is_caught_by_the_loss(monkeypatch):
    """The reference at float64 throughout (spmdsim.models.gpt.reference) in place of the policy's: the loss tells it
    apart (the gradients' tolerance, 2u per layer, does not: docs/howto/train.md gives the figures)."""
    from spmdsim.models.gpt import reference
    from spmdsim.models.gpt import reference_step as module

    real = module._mixed_step

    def float64_reference(start, x, y, cfg, step, policy, grads, microbatches=1, routes=None, kept="graph",
                          laid=None, fp8=None, ring=False, watch=None):
        _, ref_grads, updated = real(start, x, y, cfg, step, policy, grads, microbatches, routes, kept, laid, fp8,
                                     ring, watch)
        loss, grads64 = reference.loss_and_grads(start["params"], x, y, cfg, step)
        return loss, grads64, updated

    monkeypatch.setattr(module, "_mixed_step", float64_reference)
    steps = _steps(4, 2, 2, True)
    assert _caught(steps, 0), steps


def test_a_run_that_skips_a_rounding_point_is_caught(monkeypatch):
    """The row-parallel products' sums left in float32 after their Reduce_scatter (GPT._row_out not rounding
    them to bfloat16): the loss differs from the policy's reference beyond its tolerance."""
    from spmdsim.models.gpt import parallel
    from spmdsim.runtime.executor import redistribute

    monkeypatch.setattr(parallel.GPT, "_row_out", lambda self, y: redistribute(y, self.act))
    steps = _steps(4, 2, 2, True)
    assert _caught(steps, 0), steps


def test_a_wrong_update_is_caught_by_the_optimizers_check(monkeypatch):
    """A bfloat16 parameter left at its old value (its master copy updated, not rounded into it): the
    parameters' check (the master rounded must equal the parameter, exactly) fails at once."""
    from spmdsim.nn import optim

    real = optim.AdamW._update

    def forgetful(self, index, param, grad):
        before = param.copy()
        real(self, index, param, grad)
        if index == 0:
            param[...] = before

    monkeypatch.setattr(optim.AdamW, "_update", forgetful)
    steps = _steps(4, 2, 2, True, steps=1)
    assert steps[0].errors[2] > steps[0].tolerances[2] and not steps[0].passed


@pytest.mark.parametrize("policy", ["bf16-mixed", "fp32"])
def test_zero1_under_a_low_precision_policy_is_adamw_and_passes_the_check(policy):
    # ZeRO-1 (spmdsim.nn.distrib_optim) beside AdamW, 4 steps on dp 2 x tp 2 with sp: every step checked against
    # one process under the policy, the optimizer exactly (its master slices and moments gathered over dp for
    # the check), and the losses AdamW's within the policy's loss tolerance (the dp sums' order differs: a
    # Reduce_scatter against an Allreduce, so the float32 gradients' last bits may too).
    adam, zero = (_steps(4, 2, 2, True, steps=4, policy=policy, zero=z) for z in (0, 1))
    assert all(r.passed and r.errors[2] == 0.0 for r in zero), zero
    for a, z in zip(adam, zero):
        assert abs(a.loss - z.loss) <= a.tolerances[0] * abs(a.loss), (a, z)


def test_zero1_at_bf16_keeps_float32_slices_and_gathers_bfloat16():
    """The memory tracker: ZeRO-1's master copy and moments are 1/dp of AdamW's (float32 both); the updated
    parameters come back in bfloat16, half the bytes of fp32's gather; a dry run (shapes only) moves and holds
    what the real run does."""
    def traffic(policy: str, dry: bool = False) -> tuple:
        from spmdsim.runtime.trace import collect_trace

        def body():
            with collect_trace() as trace:
                results = train(CFG, spmdsim.world(), 2, 2, 1, TEXT, sp=True, check=False, memory=True,
                                precision=policy, zero=1)[1]
            return [(e.label, e.bytes_sent) for e in trace.entries], results[0].memory

        rows, memory = spmdsim.simulate(4, body, dry_run=dry)[0]
        return rows, sum(n for label, n in rows if label == "zero-1 parameter bucket"), memory

    (_, fp32_gather, fp32), (rows, bf16_gather, bf16) = traffic("fp32"), traffic("bf16-mixed")
    assert traffic("bf16-mixed", dry=True) == (rows, bf16_gather, bf16)
    adam = _traffic("bf16-mixed")[1]
    assert 2 * bf16.master == adam.master and 2 * bf16.states == adam.states  # sharded over dp 2, float32
    assert bf16.master == fp32.master and bf16.states == fp32.states
    assert 2 * bf16_gather == fp32_gather > 0


def test_a_wrong_zero1_update_is_caught(monkeypatch):
    """A ZeRO-1 bucket's master slice updated with twice the step: the optimizer's check (AdamW in float32 on
    the run's own gradients and moments, gathered) fails at once."""
    from spmdsim.nn import distrib_optim

    real = distrib_optim.DistributedAdamW._update_slice

    def doubled(self, k, master, grad):
        before = master.copy()
        real(self, k, master, grad)
        master += master - before

    monkeypatch.setattr(distrib_optim.DistributedAdamW, "_update_slice", doubled)
    steps = _steps(4, 2, 2, True, steps=1, zero=1)
    assert steps[0].errors[2] > steps[0].tolerances[2] and not steps[0].passed


PIPE_CFG = GPTConfig(layers=4, d_model=32, heads=4, seq=16, batch=8, dropout=0.2)


def _pipelined(policy: str, dry: bool = False, **kw) -> tuple:
    """(each step's StepResult, the step's point-to-point rows (label, bytes sent), rank 0's memory report) of a
    pipelined run on 8 simulated ranks."""
    from spmdsim.models.gpt.pipeline import train_pipelined
    from spmdsim.runtime.trace import collect_trace

    kw = dict(kw)
    shape = (kw.pop("pp", 2), kw.pop("dp", 2), kw.pop("tp", 2), kw.pop("steps", 2))

    def body():
        with collect_trace() as trace:
            steps = train_pipelined(PIPE_CFG, spmdsim.world(), *shape, TEXT, precision=policy, check=not dry,
                                    **kw)[1]
        return steps, [(e.label, e.bytes_sent) for e in trace.entries if e.op in ("send", "recv", "sendrecv")]

    return spmdsim.simulate(8, body, dry_run=dry)[0]


@pytest.mark.parametrize("kw", [dict(sp=True, microbatches=4), dict(pp=4, dp=1, tp=2, microbatches=8),
                                dict(schedule="interleaved", virtual=2, microbatches=4, sp=True),
                                dict(schedule="gpipe", dp=1, tp=4, microbatches=2),
                                dict(sp=True, microbatches=2, zero=1, replay=True)],
                         ids=["1f1b-sp", "1f1b-pp4", "interleaved", "gpipe-tp4", "zero1-replay"])
def test_a_bf16_pipeline_matches_one_numpy_process_under_the_same_policy(kw):
    # The stages compute under the policy and send bfloat16 both ways; the reference runs the policy microbatch
    # by microbatch (each its own dropout masks), the optimizer checked exactly on the run's own gradients.
    steps, _ = _pipelined("bf16-mixed", steps=3, **kw)
    for r in steps:
        assert r.passed and r.errors[2] == 0.0, r
        assert r.tolerances == tolerances(precision("bf16-mixed"), PIPE_CFG)
    assert steps[-1].loss < steps[0].loss


def test_a_bf16_pipeline_sends_half_fp32s_bytes_and_its_dry_run_sends_the_same():
    # The stages' messages (label "pipeline"): bfloat16 activations and gradients, half fp32's bytes; the tied
    # table's gradients (float32, a parameter's) the same.
    fp32, bf16, dry = (_pipelined(policy, dry=d, sp=True, microbatches=4)[1]
                       for policy, d in (("fp32", False), ("bf16-mixed", False), ("bf16-mixed", True)))
    stages = [(label, n) for label, n in bf16 if label.startswith("pipeline")]
    assert stages and len(bf16) == len(fp32)
    for (label, n), (other, m) in zip(bf16, fp32):
        assert label == other and n * (2 if label.startswith("pipeline") else 1) == m, (label, n, m)
    assert sum(n for _, n in dry) == sum(n for _, n in bf16)  # a dry run's rows come in its own order


def test_a_pipeline_reference_that_ignores_the_microbatches_is_caught(monkeypatch):
    """The reference drawing the whole batch's dropout masks at once (not each microbatch's): the loss check
    fails, so the reference the pipeline is checked against is the microbatched one."""
    from spmdsim.models.gpt import reference_step as module

    real = module._mixed_step
    monkeypatch.setattr(module, "_mixed_step", lambda *a, **kw: real(*a[:7], 1, **kw))
    steps, _ = _pipelined("bf16-mixed", steps=1, sp=True, microbatches=4)
    assert steps[0].errors[0] > steps[0].tolerances[0] and not steps[0].passed


def _traffic(policy: str, dry: bool = False) -> tuple:
    from spmdsim.runtime.trace import collect_trace

    def body():
        with collect_trace() as trace:
            model, results = train(CFG, spmdsim.world(), 2, 2, 1, TEXT, sp=True, check=False, memory=True,
                                   precision=policy)
        return [(e.op, e.label, e.bytes_sent) for e in trace.entries], results[0].memory

    return spmdsim.simulate(4, body, dry_run=dry)[0]


def test_bf16_activations_move_half_the_bytes_of_fp32s():
    """With sp the forward's Allgathers move bfloat16 activations: half fp32's bytes. The Reduce_scatters sum
    float32 partial products and the backward moves float32 gradients (the policy's): the same bytes."""
    fp32, bf16 = _traffic("fp32")[0], _traffic("bf16-mixed")[0]
    assert [(op, label) for op, label, _ in fp32] == [(op, label) for op, label, _ in bf16]
    forward = next(i for i, (op, label, _) in enumerate(fp32) if label.startswith("cross_entropy"))
    gathers = [i for i in range(forward) if fp32[i][0] == "allgather"]
    assert len(gathers) == 2 * CFG.layers + 1  # each block's two column-parallel inputs and the head's
    for i, (a, b) in enumerate(zip(fp32, bf16)):
        assert b[2] * (2 if i in gathers else 1) == a[2], (a, b)


def test_the_dry_run_counts_bf16_as_two_bytes():
    """A dry run (shapes only) moves the bytes a real bf16 run moves, collective by collective, and its memory
    tracker sees what the real run's does (float32 dropout factors, layer norm statistics and GELU's tanh
    beside the bfloat16 activations)."""
    (real, real_memory), (dry, dry_memory) = _traffic("bf16-mixed"), _traffic("bf16-mixed", dry=True)
    assert real == dry
    assert real_memory == dry_memory
    assert any(b < a for (_, _, a), (_, _, b) in zip(_traffic("fp32", dry=True)[0], dry))


def test_kept_bytes_parameters_and_master_copy_at_bf16():
    """The memory tracker at bf16-mixed: parameters half fp32's, a float32 master copy as large as fp32's
    parameters, float32 gradients and states; what the graph keeps for backward smaller in every kind."""
    fp32, bf16 = _traffic("fp32")[1], _traffic("bf16-mixed")[1]
    assert 2 * bf16.params == fp32.params == bf16.master and fp32.master == 0
    assert bf16.grads == fp32.grads and bf16.states == fp32.states
    assert dict(fp32.kept).keys() == dict(bf16.kept).keys()
    for kind, n in fp32.kept:
        assert bf16.kept_of(kind) < n, kind


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recomputation_at_bf16_gives_the_gradients_of_the_run_without_it(recompute):
    """Recomputed activations are rounded as the first forward rounded them, and their gradients where the walk
    rounds them (the nodes reading a recomputed block's input round as any: spmdsim.nn.autograd.graph.Detached):
    the same float32 gradients, bit for bit, at the second step too (after the first update the layer norms'
    weights are no longer ones, whose products round exactly)."""

    def grads(how: str) -> dict:
        def body():
            model, results = train(CFG, spmdsim.world(), 2, 2, 2, TEXT, sp=True, check=False, recompute=how,
                                   precision="bf16-mixed")
            return {n: p.grad.local.copy() for n, p in model.params.items()}
        return spmdsim.simulate(4, body)

    plain, again = grads("none"), grads(recompute)
    for mine, theirs in zip(again, plain):
        assert all(np.array_equal(mine[n], theirs[n]) for n in theirs)


def test_a_pending_gradient_is_summed_before_it_is_rounded(monkeypatch):
    """Without sp an activation's gradient is a pending sum over tp (each rank's column-parallel products
    gave their part): a bfloat16 node rounds it only whole, summed first (one Allreduce, Megatron's), as the
    reference rounds the whole value; moves (their backward sums it) and a parameter's views (its gradient
    stays float32) pass it on."""
    from spmdsim.nn.autograd import engine
    from spmdsim.nn.autograd.graph import _passed

    real, seen = engine._prepared, []

    def prepared(node, dy, run=None, inputs=()):
        out = real(node, dy, run, inputs)
        if node.low is not None and run is not _passed and not engine._of_parameters(inputs):
            seen.append((bool(dy.layout.partial), bool(out.layout.partial)))
        return out

    monkeypatch.setattr(engine, "_prepared", prepared)
    steps = _steps(4, 1, 4, False, steps=1)
    assert steps[0].passed
    assert any(came for came, _ in seen)  # pending sums reached bfloat16 nodes
    assert not any(left for _, left in seen)  # and none was handed on unsummed (unrounded)


def test_a_bf16_step_passes_under_the_divergence_guard():
    """SPMDSIM_CHECK's first look at a collective is whether MPI can move its dtype: bfloat16 blocks move as
    their 16-bit words (their sums are float32's), so the guard lets them through (it refused them)."""
    from spmdsim.runtime import debug

    def main():
        debug.configure(check=True)  # this simulated rank's own settings
        return train(CFG, spmdsim.world(), 2, 2, 1, TEXT, sp=True, precision="bf16-mixed")[1]

    results = spmdsim.simulate(4, main)
    assert all(r == results[0] for r in results) and results[0][0].passed


def _differing_share(monkeypatch, cfg, **kw) -> list:
    """Each step's share of all gradient entries (this rank's blocks, every parameter) that differ from the
    check's reference once both are rounded to bfloat16: read where the check compares them (step_errors)."""
    import spmdsim.models.gpt.checker as C
    from spmdsim.base.precision import bfloat16

    act, shares, compare = bfloat16(), [], C.step_errors

    def spy(value, ref_loss, grads, updated, tensors, zero=None, masters=None, top=None, slices=None,
            anchored=None, flip=None, rounding=None):
        regions = slices or {n: t.slices for n, t in tensors.items()}
        pairs = [(np.asarray(t.grad.local, np.float32).astype(act), np.asarray(grads[n][regions[n]], np.float32)
                  .astype(act)) for n, t in tensors.items()]
        shares.append(sum(int(np.count_nonzero(a != b)) for a, b in pairs) / sum(a.size for a, _ in pairs))
        return compare(value, ref_loss, grads, updated, tensors, zero, masters, top, slices, anchored, flip, rounding)

    monkeypatch.setattr(C, "step_errors", spy)
    spmdsim.simulate(4, lambda: train(cfg, spmdsim.world(), 2, 2, 2, TEXT, sp=True, precision="bf16-mixed", **kw))
    return shares


def test_a_bf16_steps_gradients_round_where_the_reference_rounds(monkeypatch):
    """The check's gradient tolerance (2u (L + 2) of a tensor's largest entry) bounds a correct run's rounding
    flips and lets a moved rounding point through; entry by entry the run and its reference differ in a few
    hundredths of the gradients' entries once rounded to bfloat16 (sums in another order: 0.9-1.7% measured
    at 2 and 8 layers), where a 2^-9 error in every product changes most of them (60-70%)."""
    import importlib

    cfg = GPTConfig(layers=2, d_model=32, heads=2, seq=16, batch=8, dropout=0.1)
    assert max(_differing_share(monkeypatch, cfg)) <= 0.05
    assert max(_differing_share(monkeypatch, cfg, kept="megatron")) <= 0.05  # the fused pieces alike
    einsum = importlib.import_module("spmdsim.nn.ops.einsum")
    exact = einsum.rounded
    monkeypatch.setattr(einsum, "rounded", lambda a, dtype: exact(a * np.float32(1 + 2 ** -9), dtype))
    assert min(_differing_share(monkeypatch, cfg)) >= 0.3


def test_a_bf16_model_samples_from_its_logits_widened():
    """GPT.generate at a temperature > 0 under bf16-mixed: its softmax of the bfloat16 logits stayed bfloat16
    (ml_dtypes 0.7 keeps a Python number beside bfloat16 bfloat16), whose probabilities miss 1 by more than numpy's
    draw allows ("Probabilities do not sum to 1", the example's --sample crashed after training). Now drawn from the
    logits in float32, alike on every rank, each id a character of the vocabulary."""
    from spmdsim import Layout, Mesh
    from spmdsim.models.gpt.parallel import GPT

    cfg = GPTConfig(layers=1, d_model=16, heads=2, seq=8, batch=2)

    def rank():
        model = GPT(cfg, Mesh(Layout((1, 2), ("dp", "tp")), spmdsim.world()), precision="bf16-mixed")
        return model.generate(b"def ", 20, 0.8, seed=3)

    ids = spmdsim.simulate(2, rank)
    assert np.array_equal(ids[0], ids[1]) and ids[0].shape == (20,)
    assert ids[0].min() >= 0 and ids[0].max() < cfg.vocab
