"""Llama's options (GPTConfig ffn, kv_heads, norm, mlp, tied, positions, bias) as the examples' flags, spelled as
`spmdsim estimate` spells them (spmdsim.models.gpt.flags): examples/train_gpt.py and examples/train_moe_gpt.py train
and check them, a bad one is one line naming the flag, and --save/--resume refuse another architecture while an
older checkpoint, saved before the options existed, still resumes (docs/howto/train-gpt.md, "Llama's options")."""
from __future__ import annotations

import json
import math
import os

import pytest

from docs_commands import assert_prints_quote, run_example, run_here, section
from spmdsim.models.gpt.flags import MLPS, NORMS, architecture_flags
from spmdsim.models.gpt import GPTConfig
from spmdsim.models.gpt.checkpoint import META
from spmdsim.models.gpt.config import CHOICES
from spmdsim.models.gpt.params import param_specs
from testkit import unfold

SMALL = ("--layers", "1", "--d-model", "16", "--heads", "4", "--seq", "8", "--batch", "4", "--sample", "0")
LLAMA = ("--ffn", "24", "--kv-heads", "2", "--norm", "rms", "--mlp", "swiglu", "--untied", "--rope", "--no-bias")
LLAMA_CFG = GPTConfig(layers=1, d_model=16, heads=4, seq=8, batch=4, ffn=24, kv_heads=2, norm="rms", mlp="swiglu",
                      tied=False, positions="rope", bias=False)


def _gpt(*args):
    return run_example("examples/train_gpt.py", "--ranks", "4", "--dp", "2", "--tp", "2", *SMALL, *args)


def test_train_gpt_trains_llamas_architecture_checked_every_step():
    done = _gpt("--steps", "2", "--every", "1", *LLAMA)
    assert done.returncode == 0, done.stderr
    out = unfold(done.stdout)
    assert "\narchitecture: ffn 24, SwiGLU, RMSNorm, 2 kv heads, RoPE, untied head, no biases" in out
    assert (f"check: 2 steps vs one numpy process (loss, {len(param_specs(LLAMA_CFG))} gradients and parameters "
            "each): PASS") in out


def test_train_moe_gpt_takes_llamas_flags():
    done = run_example("examples/train_moe_gpt.py", "--ranks", "2", "--ep", "2", "--experts", "2", "--top-k", "1",
                       "--layers", "2", "--d-model", "16", "--heads", "4", "--seq", "8", "--batch", "4",
                       "--steps", "1", *LLAMA)
    assert done.returncode == 0, done.stderr
    out = unfold(done.stdout)
    assert "\narchitecture: ffn 24, SwiGLU, RMSNorm, 2 kv heads, RoPE, untied head, no biases\n" in out
    assert "PASS" in out


@pytest.mark.parametrize("flags, message", [
    (("--kv-heads", "3"), "--kv-heads 3 must divide --heads 4 (each key/value head serves heads / kv-heads query "
                          "heads)"),
    (("--ffn", "0"), "--ffn 0 must be >= 1"),
    (("--kv-heads", "2", "--tp", "4", "--dp", "1"), "kv_heads 2 is not divisible by tp 4"),
])
def test_a_bad_llama_flag_is_one_line_naming_it(flags, message):
    done = run_example("examples/train_gpt.py", "--ranks", "4", *SMALL, "--steps", "1", *flags)
    assert done.returncode == 2
    last = unfold(done.stderr).strip().splitlines()
    assert len(last) == 1 and last[0].startswith("spmdsim: error: ") and message in last[0], done.stderr


def test_the_flags_are_the_configs_choices_and_say_a_config_back():
    assert (NORMS, MLPS) == (CHOICES["norm"], CHOICES["mlp"])
    assert " ".join(architecture_flags(LLAMA_CFG)) == " ".join(LLAMA)
    assert architecture_flags(GPTConfig()) == []


def test_resume_refuses_another_architecture_and_an_older_checkpoint_resumes(tmp_path):
    where = str(tmp_path / "ck")
    assert _gpt("--steps", "1", "--save", where, "--norm", "rms", "--rope").returncode == 0
    done = _gpt("--steps", "2", "--resume", where, "--rope")
    assert done.returncode == 2
    assert unfold(done.stderr).strip().endswith(
        f"--resume {where}: the checkpoint's config has norm 'rms', this run's 'layer' (resume with the settings it "
        "was saved with)"), done.stderr
    assert _gpt("--steps", "2", "--resume", where, "--norm", "rms", "--rope").returncode == 0
    # A checkpoint of the GPT saved before Llama's options were GPTConfig's fields: resumed, as their defaults.
    old = str(tmp_path / "old")
    assert _gpt("--steps", "1", "--save", old).returncode == 0
    path = os.path.join(old, META)
    with open(path, encoding="utf-8") as f:
        meta = json.load(f)
    for name in ("ffn", "kv_heads", "norm", "mlp", "tied", "positions", "bias"):
        del meta["config"][name]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(meta, f)
    done = _gpt("--steps", "2", "--resume", old)
    assert done.returncode == 0, done.stderr
    done = _gpt("--steps", "2", "--resume", old, "--untied")
    assert done.returncode == 2 and "the checkpoint's config has tied True, this run's False" in unfold(done.stderr)


def test_the_docs_command_prints_what_the_doc_quotes():
    shown = section("docs/howto/train-gpt.md", "## Llama's options")
    shown = [q for q in shown if not q.inline]  # the prose names `spmdsim estimate`
    assert len(shown) == 1 and all(flag in shown[0].command for flag in LLAMA[2:])
    assert_prints_quote(shown[0])


def test_the_experts_width_follows_ffn_unless_the_moe_config_gives_its_own():
    from spmdsim.models.gpt.layouts import mesh_problem
    from spmdsim.models.moe import MoEConfig

    def w1(cfg):
        return next(s.shape for s in param_specs(cfg) if s.name == "h1.moe.w1")

    moe = MoEConfig(experts=2, top_k=1)
    assert w1(GPTConfig(layers=2, d_model=16, moe=moe)) == (2, 16, 64)  # 4 x d_model, the dense MLP's
    assert w1(GPTConfig(layers=2, d_model=16, ffn=24, moe=moe)) == (2, 16, 24)  # Megatron's default: ffn
    assert w1(GPTConfig(layers=2, d_model=16, ffn=24, moe=MoEConfig(experts=2, top_k=1, hidden=40))) == (2, 16, 40)
    assert mesh_problem(GPTConfig(layers=2, d_model=16, ffn=30, moe=moe), 1, 4, False) == (
        "the experts' hidden width 30 is not divisible by tp 4")
    cfg = GPTConfig(layers=2, d_model=16, ffn=24, moe=moe)
    assert cfg.parameters == sum(math.prod(s.shape) for s in param_specs(cfg))


AUTOSHARD = ["autoshard", "--network", "gpt", "--gpt", "layers=2,d_model=32,heads=4,seq=64,batch=4", "--devices", "2",
             "--machine", "a100-dgx", "--memory-limit", "1G", "--max-dry-runs", "1", "--fix", "tp=2", "--fix", "pp=1",
             "--fix", "mb=1", "--fix", "recompute=none", "--fix", "zero=0", "--fix", "sp=0"]
LLAMA_32 = ("--ffn", "96", "--kv-heads", "2", "--norm", "rms", "--mlp", "swiglu", "--untied", "--rope", "--no-bias")


def test_autoshard_machine_searches_llamas_architecture_and_prints_its_estimate_command():
    code, out, err = run_here("main", AUTOSHARD + list(LLAMA_32) + ["--json"])
    assert code == 0, err
    data = json.loads(out)
    assert " ".join(LLAMA_32) in data["estimate_command"]
    code, out, err = run_here("main", data["estimate_command"].split()[1:] + ["--json"])
    assert code == 0, err
    estimate = json.loads(out)
    assert estimate["step_time_s"] == pytest.approx(data["chosen"]["step_s"], rel=1e-12)  # the model searched
    assert max(s["peak_bytes"] for s in estimate["stages"]) == data["chosen"]["peak"]
    assert {k: estimate["config"][k] for k in ("ffn", "kv_heads", "norm", "mlp", "untied", "rope", "no_bias")} == {
        "ffn": 96, "kv_heads": 2, "norm": "rms", "mlp": "swiglu", "untied": True, "rope": True, "no_bias": True}


@pytest.mark.parametrize("argv, message", [
    (["autoshard", "--network", "gpt", "--rope"], "--rope sets Llama's architecture, which only the search by a "
     "machine file prices (the operators' graph is the GPT's own): add --machine (e.g. --machine a100-dgx)"),
    # "--attention flash sets Llama's architecture": the flag sets the attention core, not Llama's options
    (["autoshard", "--network", "gpt", "--attention", "flash"], "--attention flash sets the attention core "
     "(FlashAttention-2's tiles), which only the search by a machine file prices (the operators' graph is the GPT's "
     "own): add --machine (e.g. --machine a100-dgx)"),
    (AUTOSHARD + ["--kv-heads", "3"], "--kv-heads 3 must divide --gpt heads 4 (each key/value head serves heads / "
     "kv-heads query heads)"),
])
def test_autoshard_refuses_a_llama_flag_it_cannot_take_in_one_line(argv, message):
    code, out, err = run_here("main", argv)
    assert code == 2 and unfold(err).strip() == f"spmdsim: error: {message}", err


@pytest.mark.parametrize("kept", ["graph", "megatron"])
def test_a_bf16_step_of_ffn_grouped_queries_an_untied_head_and_no_biases_is_checked(kept):
    """spmdsim.models.gpt.mixed mirrors these options (it refused them; RMSNorm, SwiGLU and RoPE:
    tests/test_train_bf16_llama.py)."""
    pytest.importorskip("ml_dtypes")
    import spmdsim
    from spmdsim.models.gpt import encode, load_text
    from spmdsim.models.gpt.train import train

    text = encode(load_text(20_000))
    cfg = GPTConfig(layers=2, d_model=32, heads=4, seq=16, batch=8, dropout=0.2, ffn=48, kv_heads=2, tied=False,
                    bias=False)
    steps = spmdsim.simulate(4, lambda: train(cfg, spmdsim.world(), 2, 2, 2, text, sp=True, precision="bf16-mixed",
                                              kept=kept)[1])[0]
    assert all(s.passed for s in steps) and steps[0].tolerances[0] < 1e-4, steps  # the loss within float32's sums
