"""Vocabulary padding (GPTConfig.vocab_pad_to): an odd vocabulary on tp ranks, the loss the unpadded model's.

GPT-2's vocabulary of 50,257 over tp 8 (the case of Megatron-LM issue 1754, where TP=2 diverged from one
GPU): the embedding padded to a multiple, the padded logits masked out of the softmax. Each step's loss,
gradients and updated parameters equal the unpadded single-process reference's; the padded rows'
gradients are zero and the rows stay zero; without the mask the check fails.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import spmdsim
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, batch, encode, load_text, param_specs
from spmdsim.models.gpt.layouts import mesh_problem
from spmdsim.models.gpt.train import TOLERANCE, gathered, train

TEXT = encode(load_text(20_000))
# GPT-2's vocabulary on a tiny model, padded as Megatron pads for tp 8 (128 x tp): 51,200 rows, 6,400 a rank.
GPT2 = GPTConfig(vocab=50257, vocab_pad_to=1024, layers=1, d_model=16, heads=8, seq=8, batch=4, dropout=0.2)


def test_padded_vocab_is_the_next_multiple_and_the_reference_model_is_unpadded():
    assert GPT2.padded_vocab == 51200 and GPTConfig(vocab=50257, vocab_pad_to=128).padded_vocab == 50304
    assert GPTConfig(vocab=128, vocab_pad_to=64).padded_vocab == 128 and GPTConfig(vocab=5).padded_vocab == 5
    assert GPT2.unpadded() == dataclasses.replace(GPT2, vocab_pad_to=1) and GPT2.unpadded().padded_vocab == 50257
    assert [s.shape for s in param_specs(GPT2) if s.name == "wte"] == [(51200, 16)]
    with pytest.raises(SpmdsimError, match=r"^GPTConfig vocab_pad_to 0 must be an integer >= 1$"):
        GPTConfig(vocab_pad_to=0)


def test_a_vocabulary_tp_does_not_divide_is_refused_in_one_line_naming_the_padding():
    unpadded = GPT2.unpadded()
    assert mesh_problem(unpadded, 1, 8, False) == (
        "vocab 50257 is not divisible by tp 8 (vocab-parallel embedding); pad it to a multiple of tp "
        "(GPTConfig vocab_pad_to, --pad-vocab-to; Megatron pads to 128 x tp = 1024)")
    assert mesh_problem(dataclasses.replace(GPT2, vocab_pad_to=100), 1, 8, False) == (
        "vocab 50257 padded to a multiple of 100 is 50300, not divisible by tp 8 (vocab-parallel embedding); "
        "pad to a multiple of tp (Megatron pads to 128 x tp = 1024)")
    assert mesh_problem(GPT2, 1, 8, False) is None
    with pytest.raises(SpmdsimError, match=r"the GPT cannot run on dp 1 x tp 8: vocab 50257 is not divisible"):
        spmdsim.simulate(8, lambda: train(unpadded, spmdsim.world(), 1, 8, 1, TEXT))


def _step_and_padding(cfg, dp, tp, mask=True, **options):
    """One checked step on dp x tp simulated ranks: (its StepResult, whether every rank's padded wte rows
    had a zero gradient and are zero after the update)."""
    from spmdsim.models.gpt import parallel

    def body():
        model, results = train(cfg, spmdsim.world(), dp, tp, 1, TEXT, **options)
        wte = model.params["wte"]
        first = wte.slices[0].start
        padded = np.arange(first, first + wte.local.shape[0]) >= cfg.vocab
        # Under ZeRO-1 `.grad` is None after the step (its buffer took the gathered parameters, as Megatron's):
        # the padded rows' parameters then say it, as AdamW moves a zero row only by a nonzero gradient.
        zero = (wte.grad is None or not wte.grad.local[padded].any()) and not wte.local[padded].any()
        whole = gathered(model)["wte"]  # collective: every rank's blocks
        return results[0], zero and not whole[cfg.vocab:].any()

    original = parallel.GPT._masked
    if not mask:  # the padded logits left in the softmax
        parallel.GPT._masked = lambda self, z: z
    try:
        out = spmdsim.simulate(tp * dp, body)
    finally:
        parallel.GPT._masked = original
    assert all(o == out[0] for o in out)
    return out[0]


def test_gpt2_vocabulary_over_tp_8_has_the_unpadded_one_process_loss():
    """The Megatron-LM 1754 case: vocab 50,257 on tp 8, padded to 51,200; the loss is the unpadded model's
    in one numpy process, and so is every gradient and updated parameter (the step's check)."""
    from spmdsim.models.gpt.reference import init_params, loss_and_grads

    result, zero = _step_and_padding(GPT2, 1, 8)
    assert result.passed and max(result.errors) <= TOLERANCE, result
    assert zero  # the padded rows: no gradient, and the optimizer left them at zero
    unpadded = GPT2.unpadded()
    x, y = batch(TEXT, unpadded, 0)
    loss = loss_and_grads(init_params(unpadded), x, y, unpadded, 0)[0]  # no padding anywhere
    assert abs(result.loss - loss) <= 1e-12 * loss and abs(loss - np.log(50257)) < 0.2


def test_without_the_mask_the_padded_logits_change_the_loss_and_the_check_fails():
    result, _ = _step_and_padding(GPT2, 1, 8, mask=False)
    # 943 zero logits join the softmax's sum: the loss grows by about log(51200 / 50257) = 0.019.
    assert not result.passed and result.errors[0] > 1e-3, result


@pytest.mark.parametrize("options", [{"sp": True}, {"zero": 1}, {"replay": True}, {"precision": "bf16-mixed"},
                                     {"recompute": "full"},
                                     {"kept": "megatron", "recompute": "selective"}])
def test_padding_composes_with_the_training_options(options):
    """An odd vocabulary of 131 padded to 192 on tp 4: the last tp rank's 48 rows are all padding (its
    logits all -inf), and the step still equals one numpy process's."""
    cfg = GPTConfig(vocab=131, vocab_pad_to=64, layers=1, d_model=16, heads=4, seq=8, batch=4, dropout=0.2)
    result, zero = _step_and_padding(cfg, 2, 4, **options)
    assert result.passed and zero, result


def test_padding_composes_with_moe_layers():
    from spmdsim.models.moe import MoEConfig

    cfg = GPTConfig(vocab=131, vocab_pad_to=64, layers=2, d_model=16, heads=4, seq=8, batch=4, dropout=0.2,
                    moe=MoEConfig(experts=4))
    steps = spmdsim.simulate(8, lambda: train(cfg, spmdsim.world(), 1, 4, 2, TEXT, ep=2)[1])[0]
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in steps), steps


def test_padding_composes_with_a_pipeline():
    from spmdsim.models.gpt.pipeline import train_pipelined

    cfg = GPTConfig(vocab=131, vocab_pad_to=64, layers=2, d_model=16, heads=4, seq=8, batch=4, dropout=0.2)
    unpadded = cfg.unpadded()
    refused = spmdsim.simulate(8, lambda: str(pytest.raises(SpmdsimError, train_pipelined, unpadded,
                                                            spmdsim.world(), 2, 1, 4, 1, TEXT).value))
    assert "vocab 131 is not divisible by tp 4" in refused[0]
    steps = spmdsim.simulate(8, lambda: train_pipelined(cfg, spmdsim.world(), 2, 1, 4, 2, TEXT, sp=True,
                                                        microbatches=2)[1])[0]
    assert all(r.passed and max(r.errors) <= TOLERANCE for r in steps), steps


def test_the_padded_model_samples_what_one_numpy_process_samples():
    """Generation never draws a padded id: greedy over the masked logits, sampling over the real ones."""
    from spmdsim.models.gpt.parallel import GPT
    from spmdsim.models.gpt.reference import generate, init_params
    from spmdsim.runtime import Mesh

    cfg = GPTConfig(vocab=131, vocab_pad_to=64, layers=1, d_model=16, heads=4, seq=8, batch=4)

    def body():
        model = GPT(cfg, Mesh(spmdsim.Layout((1, 4), ("dp", "tp"))))
        return [model.generate(b"def ", 6, t) for t in (0.0, 0.8)]

    drawn = spmdsim.simulate(4, body)[0]
    params = init_params(cfg)
    assert not params["wte"][131:].any()
    for ids, t in zip(drawn, (0.0, 0.8)):
        assert (ids == generate(params, cfg, b"def ", 6, t)).all() and ids.max() < 131


def test_generation_runs_its_first_forward_and_replays_it_for_the_other_characters():
    """GPT.generate captures the first character's forward (spmdsim.runtime.replay) and replays it: the
    model's Python runs once for six characters, and they are the characters six forwards run one by one
    draw (greedy: the prompt grows by each one), also over sequence-parallel layers and padded vocabulary."""
    from spmdsim.models.gpt.parallel import GPT
    from spmdsim.runtime import Mesh

    cfg = GPTConfig(vocab=131, vocab_pad_to=64, layers=2, d_model=16, heads=4, seq=8, batch=4)

    def body():
        model = GPT(cfg, Mesh(spmdsim.Layout((2, 4), ("dp", "tp"))), sp=True)
        calls, logits = [], model.logits
        model.logits = lambda *a, **k: calls.append(1) or logits(*a, **k)
        replayed = model.generate(b"def ", 6, 0.0)
        captured = len(calls)
        prompt = b"def "
        for _ in range(6):  # one forward each, nothing to replay
            prompt += bytes([int(model.generate(prompt, 1, 0.0)[0])])
        return replayed, captured, len(calls) - captured, prompt[4:]

    replayed, captured, one_by_one, drawn = spmdsim.simulate(8, body)[0]
    assert (captured, one_by_one) == (1, 6)
    assert bytes(int(i) for i in replayed) == drawn
