"""FP8 training as TransformerEngine does it (spmdsim.base.fp8, spmdsim.nn.ops.fp8_linear, precision "fp8"):
the casts' formats and scales, the GPT's steps checked against one numpy process under the same policy, a
wrong scale caught by that check, and the bytes the FP8 copies take."""
from __future__ import annotations

import dataclasses
import numpy as np
import pytest

import spmdsim
from spmdsim import Layout
from spmdsim.base import fp8
from spmdsim.base.precision import precision, precision_problem
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.train import StepResult, train
from spmdsim.models.gpt.step_check import flip_ratio
from spmdsim.models.gpt.tolerances import failed_steps
from spmdsim.models.gpt.options import check_lines
from spmdsim.models.gpt.pipeline import train_pipelined
from spmdsim.models.gpt import stage_check
from spmdsim.nn.autograd import kept_bytes
from spmdsim.nn.autograd.engine import backward
from spmdsim.nn.ops import fp8_linear
from spmdsim.nn import ops

ml_dtypes = pytest.importorskip("ml_dtypes")

CFG = GPTConfig(layers=2, d_model=32, heads=4, seq=16, batch=8, dropout=0.1)
TEXT = encode(load_text(20_000))


def test_the_forward_casts_to_e4m3_and_the_backward_to_e5m2():
    """e4m3: 3 significand bits (1.0625 -> 1, 1.1875 -> 1.25), saturated at 448 (ml_dtypes' own cast gives NaN
    there); e5m2: 2 bits, saturated at 57344; the scale multiplies first."""
    e4m3 = fp8.quantize(np.array([1.0625, 1.1875, 500.0, -1e6], np.float32), 1.0, fp8.FORWARD)
    assert e4m3.dtype == np.dtype(ml_dtypes.float8_e4m3fn)
    assert e4m3.astype(np.float32).tolist() == [1.0, 1.25, 448.0, -448.0]
    e5m2 = fp8.quantize(np.array([1.125, 1.375, 1e6], np.float32), 1.0, fp8.BACKWARD)
    assert e5m2.dtype == np.dtype(ml_dtypes.float8_e5m2)
    assert e5m2.astype(np.float32).tolist() == [1.0, 1.5, 57344.0]
    assert fp8.quantize(np.array([3.0], np.float32), 0.5, fp8.FORWARD).astype(np.float32).tolist() == [1.5]


def test_delayed_scaling_starts_at_one_and_follows_the_history_maximum():
    """DelayedScaling(margin=0, amax_compute_algo="max"): scale 1 before any amax; then 448 / (the largest amax of
    the history window); an amax of 0 keeps the scale; the window forgets after `history` steps."""
    s = fp8.Scales(fp8.Recipe("delayed", history=2))
    assert s.scale("w", "e4m3") == 1.0 and s.scale("dy", "e5m2") == 1.0
    s.observe("w", "e4m3", 4.0)
    s.observe("dy", "e5m2", 0.0)
    s.settle(np.array(s.seen))
    assert s.scale("w", "e4m3") == np.float32(112.0) and s.scale("dy", "e5m2") == 1.0
    s.settle(np.array([2.0, 8.0], np.float32))  # the window (2 steps) still holds 4
    assert s.scale("w", "e4m3") == np.float32(112.0) and s.scale("dy", "e5m2") == np.float32(7168.0)
    s.settle(np.array([1.0, 8.0], np.float32))  # 4 left the window: max(2, 1)
    assert s.scale("w", "e4m3") == np.float32(224.0)


def _column(sp: bool):
    """Per rank of dp 1 x tp 2: (kept bytes of one fp8_column node, the bytes of its e4m3 pieces, the formats of
    the keys the forward and backward cast)."""

    def body():
        mesh = spmdsim.Mesh(Layout((2,), ("tp",)), spmdsim.world())
        rng = np.random.default_rng(0)
        bf16 = np.dtype(ml_dtypes.bfloat16)
        x = spmdsim.DTensor.from_global(mesh, rng.standard_normal((8, 2, 16)).astype(bf16),
                                        mesh.layout("tp" if sp else None, None, None)).requires_grad_()
        w = spmdsim.DTensor.from_global(mesh, rng.standard_normal((16, 6)).astype(bf16),
                                        mesh.layout(None, "tp")).requires_grad_()
        scales = fp8.Scales(fp8.DELAYED)
        y = fp8_linear.fp8_column(x, [(w, None)], mesh.layout(None, None, None), scales, "l", ["l.w"])
        kept = sum(kept_bytes([y], exclude=[w]).values())
        backward(ops.sum(y * y))
        return kept, x.local.size + w.local.size, {k: f for k, (_, f) in scales.keys.items()}

    return spmdsim.simulate(2, body)


@pytest.mark.parametrize("sp", [True, False])
def test_a_column_product_keeps_its_e4m3_copies_a_byte_an_element(sp):
    for kept, elements, formats in _column(sp):
        assert kept == elements  # x's piece (a sequence shard with sp) and the weight's, 1 byte each
        assert formats == {"l:x": "e4m3", "l.w:w": "e4m3", "l.w:dy": "e5m2"}


def _steps(policy: str, steps: int = 3, **options) -> list:
    results = spmdsim.simulate(4, lambda: train(CFG, spmdsim.world(), 2, 2, steps, TEXT, sp=True, precision=policy,
                                                **options)[1])
    assert all(r == results[0] for r in results)
    return results[0]


@pytest.mark.parametrize("policy, kept", [("fp8", "graph"), ("fp8-current", "graph"), ("fp8", "megatron")])
def test_fp8_training_matches_one_numpy_process_under_the_same_policy(policy, kept):
    """Each step within the policy's tolerances, the update exact; the losses are not bf16-mixed's (the products
    really are FP8's). Under Megatron's kept set the fused pieces' block with the FP8 linear layers."""
    steps = _steps(policy, kept=kept)
    if kept == "megatron":  # the same values as the graph's block (the pieces round where its operators do)
        assert [r.loss for r in steps] == [r.loss for r in _steps(policy)]
    for r in steps:
        assert r.passed and r.errors[2] == 0.0, r
        assert all(e <= t for e, t in zip(r.errors, r.tolerances)), r
        assert 0.0 < r.flip < 1.0, r  # (the gradients' flip ratio: FP8's alone)
    mixed = _steps("bf16-mixed")
    assert [r.loss for r in steps] != [r.loss for r in mixed] and all(r.flip is None for r in mixed)


def test_a_wrong_scale_is_caught(monkeypatch):
    """The weights' products multiplied back by an inverse scale one e4m3 step off (2**-3) in the run alone: the
    loss leaves the reference's beyond its tolerance."""
    real = fp8_linear._inverse
    monkeypatch.setattr(fp8_linear, "_inverse", lambda *s: np.float32(real(*s) * np.float32(1.125)))
    steps = _steps("fp8", steps=2)
    assert any(r.errors[0] > r.tolerances[0] for r in steps) and not all(r.passed for r in steps), steps


def _result(step: int, grads: float, flip, loss: float = 0.0) -> StepResult:
    return StepResult(step, 1.0, (loss, grads, 0.0), 0, 0, tolerances=(1e-4, 4.7e-2, 1e-6), flip=flip)


def test_the_verdict_passes_one_fp8_flip_in_a_hundred_steps():
    """A step past the gradients' tolerance, each element within one e5m2 step more (flip ratio <= 1), passes
    as a flip when at most one step in FLIP_STEPS (one in a shorter run of 2 or more) is one; a second such
    step in 100 fails both; a step past the flip's allowance, or past the loss's tolerance, or without FP8
    (flip None) always fails."""
    calm = [_result(i, 1e-3, 0.05) for i in range(99)]
    assert failed_steps(calm + [_result(99, 7.5e-2, 0.6)]) == (0, 1)
    lines = check_lines(calm + [_result(99, 7.5e-2, 0.6)], CFG, "fp8")
    assert lines[0].endswith("each): PASS") and lines[1:3] == [
        "  1 step passed as an FP8 flip: over the gradients' tolerance, each value within one",
        '  e5m2 step more (docs/explanation/tolerances.md, "FP8")'], lines
    assert failed_steps(calm[:98] + [_result(98, 7.5e-2, 0.6), _result(99, 6e-2, 0.5)]) == (2, 0)
    assert failed_steps(calm + [_result(99, 7.5e-2, 1.2)]) == (1, 0)
    assert failed_steps(calm + [_result(99, 7.5e-2, 0.6, loss=1.0)]) == (1, 0)
    assert failed_steps(calm + [_result(99, 7.5e-2, None)]) == (1, 0)
    assert failed_steps(calm[:7] + [_result(7, 7.5e-2, 0.6)]) == (0, 1)  # a short run: one may flip,
    assert failed_steps(calm[:6] + [_result(6, 7.5e-2, 0.6), _result(7, 6e-2, 0.5)]) == (2, 0)  # not two
    assert failed_steps([_result(0, 7.5e-2, 0.6)]) == (1, 0)  # nor the one step of a run of one
    beyond = dataclasses.replace(_result(99, 7.5e-2, 0.6), rounding=1.5)  # past its own rounding: no flip
    assert not beyond.flipped and failed_steps(calm + [beyond]) == (1, 0)
    assert flip_ratio([(np.array([0.3]), np.array([1.0]), 2.0, "w")], 0.05) == pytest.approx(0.3 / (0.1 + 0.25))


def _pipelined(policy: str, steps: int, **options) -> list:
    """`steps` of a 4-layer GPT over 2 stages x tp 2 with sp, 2 microbatches (8 ranks), under `policy`."""
    cfg = GPTConfig(layers=4, d_model=32, heads=4, seq=16, batch=4, dropout=0.1, **options)
    results = spmdsim.simulate(8, lambda: train_pipelined(cfg, spmdsim.world(), 2, 2, 2, steps, TEXT, sp=True,
                                                          microbatches=2, precision=policy)[1])
    assert all([(r.loss, r.errors) for r in mine] == [(r.loss, r.errors) for r in results[0]] for mine in results)
    return results[0]


@pytest.mark.parametrize("policy", ["fp8", "fp8-current"])
def test_fp8_over_a_pipeline_matches_one_numpy_process(policy, monkeypatch):
    """Each stage's chunks keep their own scales; a step's microbatches cast with the step's scales, and after the
    last backward each stage agrees its amaxes (delayed scaling): the reference, microbatch by microbatch, casts
    with every stage's scales, gathered. Without them (scale 1) the delayed recipe's check fails from the second
    step on (loss 1.4e-4 apart in 6 of 8 steps of the 8-rank command of docs/howto/bf16.md)."""
    steps = _pipelined(policy, 4)
    assert all(r.passed and all(e <= t for e, t in zip(r.errors, r.tolerances)) for r in steps), steps
    if policy == "fp8":
        monkeypatch.setattr(stage_check, "_scales", lambda run: None)
        assert not all(r.passed for r in _pipelined(policy, 4))


def test_the_pipelines_reference_scales_each_microbatchs_loss_before_its_backward():
    """The ranks scale each microbatch's loss by 1 / microbatches before its backward, so under delayed scaling the
    backward's e5m2 casts see the scaled gradients against scales made from their history; the reference scales
    alike (spmdsim.models.gpt.mixed, `seed`). A reference that averaged its microbatches' gradients after their
    backward cast twice the values with the same scales: 5 of 200 steps of `python examples/train_gpt.py --ranks
    8 --layers 4 --pp 2 --tp 2 --dp 2 --microbatches 2 --precision fp8` failed (gradients 0.78 apart), none
    since (largest 2.1e-2). Here, in the first two steps (the histories' first amaxes), that reference's gradients
    were 1.0e-2 and 1.8e-2 from the run's, the seeded one's 1.2e-3 and 1.1e-3: under the bfloat16 flips' 2u."""
    steps = _pipelined("fp8", 2)
    assert all(r.passed and r.errors[1] < 2 * 2.0 ** -8 for r in steps), steps


def test_fp8_without_ml_dtypes_is_one_line(monkeypatch):
    assert precision("fp8").fp8 == fp8.DELAYED and precision("fp8-current").fp8 == fp8.CURRENT
    monkeypatch.setattr(fp8, "_DTYPES", {})
    monkeypatch.setitem(__import__("sys").modules, "ml_dtypes", None)
    from spmdsim.base import precision as module
    monkeypatch.setattr(module, "_BF16", [])
    assert precision_problem("fp8") == "precision 'fp8' needs ml_dtypes: pip install -e '.[bf16]'"


@pytest.mark.parametrize("name", ["fp8", "fp8-current"])
def test_fp8_refuses_what_it_does_not_run(name):
    """A replay of step 0 would keep its scales (each step's are made in Python): refused, naming the policy given."""
    with pytest.raises(SpmdsimError, match=f"precision {name} makes its FP8 scales in Python each step"):
        spmdsim.simulate(4, lambda: train(CFG, spmdsim.world(), 2, 2, 1, TEXT, precision=name, replay=True))


@pytest.mark.parametrize("example", ["examples/train_gpt.py", "examples/train_moe_gpt.py"])
@pytest.mark.parametrize("options, replay, said", [
    (("--replay",), True,
     "precision fp8 makes its FP8 scales in Python each step, which a replay would not: run it without --replay"),
])
def test_the_examples_refuse_fp8s_options_before_their_header(example, options, replay, said):
    """`--replay --precision fp8` printed the run's header (the model, the mesh, the step table's head) before the
    trainer refused it; the examples' other options are refused before any line of the run."""
    from docs_commands import run_example
    from testkit import unfold
    from spmdsim.models.gpt.fp8_block import policy_problem

    assert policy_problem("fp8", replay) == said
    assert policy_problem("bf16-mixed", True) is None and policy_problem("bf16") is not None
    # (--steps 2: a replay of one step replays nothing, refused on its own before the policy is asked)
    done = run_example(example, "--ranks", "2", "--steps", "2", "--layers", "2", "--d-model", "16", "--seq", "8",
                       "--batch", "4", "--precision", "fp8", *options)
    assert done.returncode == 2
    assert done.stdout == ""  # before the banner too: run_main's checks of the command line
    assert unfold(done.stderr).strip().endswith(said)
