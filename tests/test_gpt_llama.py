"""Llama's options of the GPT (GPTConfig ffn, norm, mlp, kv_heads, tied, positions, bias): the reference against
central differences, a training step on simulated ranks against the reference, the dry run's parameter count
against the closed count of a Llama-2-7B-shaped config, and `spmdsim estimate`'s flags (docs/howto/train-gpt.md,
"Llama's options"; docs/howto/estimate.md, "A Llama")."""
from __future__ import annotations

import math

import numpy as np
import pytest

import spmdsim
from docs_commands import run_here
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.params import param_specs
from spmdsim.models.gpt.reference import init_params, loss_and_grads
from spmdsim.models.gpt.train import TOLERANCE, train
from testkit import unfold

TEXT = encode(load_text(20_000))
LLAMA = dict(ffn=40, norm="rms", mlp="swiglu", kv_heads=2, tied=False, positions="rope", bias=False)
OPTIONS = [dict(ffn=24), dict(norm="rms"), dict(mlp="swiglu"), dict(kv_heads=2), dict(kv_heads=1), dict(tied=False),
           dict(positions="rope"), dict(bias=False), LLAMA]
# Llama-2 7B as Meta published it (Touvron et al. 2023, "Llama 2", and the config.json of meta-llama/Llama-2-7b-hf:
# hidden 4096, intermediate 11008, 32 layers, 32 heads, vocab 32000, RMSNorm, SwiGLU, RoPE, untied, no biases):
# 6,738,415,616 parameters; Llama-2 70B (8 key/value heads, hidden 8192, intermediate 28672, 80 layers, 64 heads)
# 68,976,648,192.
LLAMA2_7B = dict(vocab=32000, d_model=4096, heads=32, layers=32, ffn=11008, norm="rms", mlp="swiglu", tied=False,
                 positions="rope", bias=False)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_the_references_gradients_are_its_losss_central_differences(options):
    cfg = GPTConfig(layers=1, d_model=16, heads=4, seq=6, batch=2, vocab=20, vocab_pad_to=8, dropout=0.0, **options)
    rng = np.random.default_rng(0)
    params = {k: v + 0.05 * rng.standard_normal(v.shape) for k, v in init_params(cfg).items()}
    x, y = rng.integers(0, 20, (2, 6)), rng.integers(0, 20, (2, 6))
    _, grads = loss_and_grads(params, x, y, cfg, 0, train=False)
    for name, value in params.items():
        rows = 20 if name in ("wte", "head.w") else value.shape[0]  # the padded rows have no gradient
        for _ in range(2):
            at = (int(rng.integers(0, rows)),) + tuple(int(rng.integers(0, n)) for n in value.shape[1:])
            keep = value[at]
            value[at] = keep + 1e-6
            up = loss_and_grads(params, x, y, cfg, 0, train=False)[0]
            value[at] = keep - 1e-6
            down = loss_and_grads(params, x, y, cfg, 0, train=False)[0]
            value[at] = keep
            assert abs((up - down) / 2e-6 - grads[name][at]) < 1e-8, (name, at)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_a_training_step_with_each_option_matches_one_numpy_process(options):
    cfg = GPTConfig(layers=1, d_model=16, heads=4, seq=8, batch=4, dropout=0.2, **options)
    dp, tp = (2, 2) if cfg.kv % 2 == 0 else (4, 1)  # tp divides the key/value heads (Megatron's rule)
    steps = spmdsim.simulate(4, lambda: train(cfg, spmdsim.world(), dp, tp, 1, TEXT, sp=True)[1])[0]
    assert steps[0].passed and max(steps[0].errors) <= TOLERANCE, steps


def test_llamas_block_from_megatrons_fused_pieces_and_over_a_pipeline_matches_one_numpy_process():
    from spmdsim.models.gpt.pipeline import train_pipelined

    cfg = GPTConfig(layers=2, d_model=16, heads=4, seq=8, batch=4, dropout=0.2, **LLAMA)
    steps = spmdsim.simulate(2, lambda: train(cfg, spmdsim.world(), 1, 2, 1, TEXT, kept="megatron")[1])[0]
    assert steps[0].passed and max(steps[0].errors) <= TOLERANCE, steps

    def pipelined():  # the untied head on the last stage alone: no embedding group
        run, results = train_pipelined(cfg, spmdsim.world(), 2, 1, 2, 1, TEXT, sp=True, microbatches=2)
        run.close()
        return results

    steps = spmdsim.simulate(4, pipelined)[0]
    assert steps[0].passed and max(steps[0].errors) <= TOLERANCE, steps


def test_the_closed_count_is_the_parameter_lists_and_llama_2s_published_sizes():
    import itertools

    for ffn, norm, mlp, kv, tied, pos, bias in itertools.product((None, 40), ("layer", "rms"), ("gelu", "swiglu"),
                                                                 (None, 2), (True, False), ("learned", "rope"),
                                                                 (True, False)):
        cfg = GPTConfig(layers=2, d_model=16, heads=4, vocab=30, vocab_pad_to=8, ffn=ffn, norm=norm, mlp=mlp,
                        kv_heads=kv, tied=tied, positions=pos, bias=bias)
        assert cfg.parameters == sum(math.prod(s.shape) for s in param_specs(cfg)), cfg
    assert GPTConfig(**LLAMA2_7B).parameters == 6_738_415_616
    assert GPTConfig(**{**LLAMA2_7B, "d_model": 8192, "heads": 64, "kv_heads": 8, "layers": 80,
                        "ffn": 28672}).parameters == 68_976_648_192


def test_rope_tables_of_one_size_are_made_once_and_read_only():
    """Each model (a dry run's, a pipeline stage's) asks for its rope tables: one size's are made once and shared,
    read-only (a caller writing into them would change every later model's), the largest made anew each time."""
    from spmdsim.models.gpt import _blocks
    from spmdsim.models.gpt.config import ROPE_BASE

    cos, sin = _blocks.rope_tables(48, 8)
    assert _blocks.rope_tables(48, 8)[0] is cos and _blocks.rope_tables(48, 8)[1] is sin
    assert not cos.flags.writeable and not sin.flags.writeable
    angle = np.arange(48.0)[:, None] * ROPE_BASE ** -(np.arange(4) / 4)
    assert np.array_equal(cos, np.cos(np.concatenate([angle, angle], axis=1)))
    assert np.array_equal(sin, np.sin(np.concatenate([angle, angle], axis=1)))
    seq = _blocks._ROPE_KEPT_ELEMENTS // 8 + 1  # one row over the largest kept
    assert _blocks.rope_tables(seq, 8)[0] is not _blocks.rope_tables(seq, 8)[0]


def test_the_dry_run_of_a_llama_2_7b_shaped_model_holds_its_closed_count():
    from spmdsim.tools.estimate.ledger import gpt_ledger

    cfg = GPTConfig(seq=16, batch=1, **LLAMA2_7B)  # the sequence changes no parameter (RoPE)
    stage, = gpt_ledger(cfg, 1, 1, 8)
    norms = (2 * cfg.layers + 1) * cfg.d_model  # RMSNorm weights: whole on every tp rank; the rest split over 8
    assert stage.params == (6_738_415_616 - norms) // 8 + norms


@pytest.mark.parametrize("options, message", [
    (dict(kv_heads=3), "GPTConfig kv_heads 3 must divide heads 4 (each key/value head serves heads / kv_heads "
                       "query heads)"),
    (dict(ffn=0), "GPTConfig ffn 0 must be an integer >= 1 (or None: 4 * d_model)"),
    (dict(norm="rmsnorm"), "GPTConfig norm 'rmsnorm' must be one of 'layer', 'rms'"),
    (dict(mlp="geglu"), "GPTConfig mlp 'geglu' must be one of 'gelu', 'swiglu'"),
    (dict(positions="alibi"), "GPTConfig positions 'alibi' must be one of 'learned', 'rope'"),
    (dict(tied=1), "GPTConfig tied 1 must be True or False"),
    (dict(d_model=12, positions="rope"), "GPTConfig positions 'rope' needs an even head_dim, got d_model 12 / heads "
                                         "4 = 3 (rotary embeddings turn pairs of features)"),
])
def test_a_bad_option_is_one_line_naming_it(options, message):
    with pytest.raises(SpmdsimError) as err:
        GPTConfig(**{"heads": 4, **options})
    assert str(err.value) == message


def test_tp_must_divide_the_key_value_heads_and_a_low_precision_check_takes_llamas_options():
    from spmdsim.models.gpt.layouts import mesh_problem

    assert mesh_problem(GPTConfig(heads=4, kv_heads=2), 1, 4, False) == (
        "kv_heads 2 is not divisible by tp 4 (key/value heads are split over tp, Megatron's num_query_groups % tp "
        "== 0)")
    assert mesh_problem(GPTConfig(ffn=30), 1, 4, False) == (
        "the MLP's hidden width ffn 30 is not divisible by tp 4 (its columns are split over tp)")
    pytest.importorskip("ml_dtypes")
    # spmdsim.models.gpt.mixed mirrors every option's rounding points (it refused RMSNorm, SwiGLU and RoPE): tp 2
    # without sp (the column-parallel inputs' gradients pending over tp; tests/test_train_bf16_llama.py has
    # dp 2 x tp 2, sp)
    cfg = GPTConfig(layers=1, d_model=16, heads=4, seq=8, batch=4, norm="rms", mlp="swiglu", positions="rope",
                    kv_heads=2, tied=False, bias=False)
    steps = spmdsim.simulate(2, lambda: train(cfg, spmdsim.world(), 1, 2, 1, TEXT, precision="bf16-mixed")[1])[0]
    assert steps[0].passed and steps[0].tolerances[0] < 1e-4, steps


def test_estimate_takes_llamas_options_as_flags():
    argv = ["estimate", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "128",
            "--global-batch", "2", "--tp", "2", "--ffn", "96", "--kv-heads", "2", "--norm", "rms", "--mlp", "swiglu",
            "--untied", "--rope", "--no-bias"]
    code, out, err = run_here("main", argv)
    assert code == 0, err
    cfg = GPTConfig(layers=2, d_model=64, heads=4, seq=32, vocab=128, ffn=96, kv_heads=2, norm="rms", mlp="swiglu",
                    tied=False, positions="rope", bias=False)
    text = unfold(out)
    assert "vocab 128, ffn 96, SwiGLU, RMSNorm, 2 kv heads, RoPE, untied head, no biases; global batch 2" in text
    assert f"model {cfg.parameters:,} parameters" in text
    at = argv.index("--kv-heads") + 1
    code, out, err = run_here("main", argv[:at] + ["3"] + argv[at + 1:])
    assert code == 2 and unfold(err).strip().endswith("--kv-heads 3 must divide --heads 4 (each key/value head serves "
                                              "heads / kv-heads query heads)"), err
