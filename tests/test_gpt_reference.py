"""The GPT's pure side: config, parameters, dropout masks, text batches and the numpy reference."""
from __future__ import annotations

import math
import subprocess
import sysconfig
import sys
import zlib

import numpy as np
import pytest

from spmdsim import SeededTensor, SpmdsimError
from spmdsim.models.gpt import (GPTConfig, batch, decays, decode, dropout_seed, dropout_tensor, encode, load_text,
                         param_specs, seeded)
from spmdsim.models.gpt import reference as ref


@pytest.fixture(autouse=True, scope="module")
def _one_blas_thread():
    # Small matrices; a BLAS pool on cores other agents keep busy spins (25x slower when measured).
    from spmdsim.base.threads import blas_threads

    with blas_threads(1):
        yield


TINY = GPTConfig(vocab=16, d_model=8, heads=2, layers=2, seq=6, batch=3, dropout=0.2, init_std=0.3)


@pytest.fixture(scope="module")
def text_ids():
    return encode(load_text())


def _tiny_problem(seed: int = 0):
    """TINY's parameters moved off their init (so norms' weights and biases matter), and a batch."""
    rng = np.random.default_rng(seed)
    params = ref.init_params(TINY)
    for value in params.values():
        value += 0.1 * rng.standard_normal(value.shape)
    x, y = rng.integers(0, TINY.vocab, (2, TINY.batch, TINY.seq))
    return params, x, y


def test_gradients_of_every_parameter_match_central_differences():
    params, x, y = _tiny_problem()
    step = 3
    loss, grads = ref.loss_and_grads(params, x, y, TINY, step)
    assert list(grads) == [s.name for s in param_specs(TINY)]
    # Dropout is on and fixed by the step: the same loss twice, another without it.
    assert ref.loss_and_grads(params, x, y, TINY, step)[0] == loss
    assert abs(ref.loss_and_grads(params, x, y, TINY, step, train=False)[0] - loss) > 1e-3
    rng, h = np.random.default_rng(1), 1e-5
    for name, value in params.items():
        flat, g = value.reshape(-1), grads[name].reshape(-1)
        for i in rng.choice(flat.size, min(3, flat.size), replace=False):
            old = flat[i]
            flat[i] = old + h
            up = ref.loss_and_grads(params, x, y, TINY, step)[0]
            flat[i] = old - h
            down = ref.loss_and_grads(params, x, y, TINY, step)[0]
            flat[i] = old
            numeric = (up - down) / (2 * h)
            # Relative error 1e-6.
            assert abs(numeric - g[i]) <= 1e-6 * max(abs(numeric), abs(g[i])) + 1e-9, (name, i, numeric, g[i])


def _spec_forward_loss(params, x, y, cfg, step):
    """The spec's forward, written literally (einsum, where(-inf), explicit masks): a second opinion."""
    B, T = x.shape
    H, Dh, p = cfg.heads, cfg.head_dim, cfg.dropout

    def drop(a, site):
        keep = SeededTensor(a.shape, "float64", seed=zlib.crc32(f"{cfg.seed}:dropout:{step}:{site}".encode()),
                            low=0.0, high=1.0).full() >= p
        return a * keep / (1 - p)

    def ln(a, w, b):
        mu = a.mean(-1, keepdims=True)
        return (a - mu) / np.sqrt(((a - mu) ** 2).mean(-1, keepdims=True) + cfg.ln_eps) * w + b

    h = drop(params["wte"][x] + params["wpe"], "emb")
    for layer in range(cfg.layers):
        P = {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith(f"h{layer}.")}
        a = ln(h, P["ln1.w"], P["ln1.b"])
        q, k, v = ((a @ P[f"attn.w{c}"] + P.get(f"attn.b{c}", 0.0)).reshape(B, T, H, Dh) for c in "qkv")
        s = np.einsum("bqhd,bkhd->bhqk", q, k) * (1 / math.sqrt(Dh))
        s = np.where(np.arange(T)[None, :] > np.arange(T)[:, None], -np.inf, s)
        e = np.exp(s - s.max(-1, keepdims=True))
        att = drop(e / e.sum(-1, keepdims=True), f"h{layer}.attn")
        o = np.einsum("bhqk,bkhd->bqhd", att, v).reshape(B, T, cfg.d_model)
        h = h + drop(o @ P["attn.wo"] + P["attn.bo"], f"h{layer}.resid1")
        z = ln(h, P["ln2.w"], P["ln2.b"]) @ P["mlp.w1"] + P["mlp.b1"]
        m = 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z**3)))
        h = h + drop(m @ P["mlp.w2"] + P["mlp.b2"], f"h{layer}.resid2")
    logits = ln(h, params["lnf.w"], params["lnf.b"]) @ params["wte"].T
    top = logits.max(-1, keepdims=True)
    lse = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[..., 0]
    return float(np.mean(lse - np.take_along_axis(logits, y[..., None], -1)[..., 0])), logits


def test_forward_follows_the_spec_written_literally():
    params, x, y = _tiny_problem(2)
    for step in (0, 5):
        want, want_logits = _spec_forward_loss(params, x, y, TINY, step)
        assert ref.loss_and_grads(params, x, y, TINY, step)[0] == pytest.approx(want, rel=1e-13)
        np.testing.assert_allclose(ref.logits(params, x, TINY, step, train=True), want_logits, rtol=1e-12)


def test_adamw_steps_and_training_lower_the_loss(text_ids):
    cfg = GPTConfig(layers=2, d_model=32, heads=2, seq=32, batch=8)
    seen = []

    def on_step(step, loss, grads, params):
        seen.append((step, loss, float(params["wte"][0, 0])))

    params, losses = ref.train(cfg, 30, text_ids, on_step=on_step)
    assert [s for s, _, _ in seen] == list(range(30)) and [loss for _, loss, _ in seen] == losses
    assert seen[-1][2] == params["wte"][0, 0]  # on_step sees the parameters after the update
    assert losses[0] == pytest.approx(math.log(128), abs=0.3)  # near uniform at the start
    assert np.mean(losses[-5:]) < losses[0] - 1.0, losses
    # One step at a time (beside a distributed run): the same numbers.
    trainer = ref.Trainer(cfg, text_ids)
    assert [trainer.step()[0] for _ in range(3)] == losses[:3] and trainer.steps == 3


def test_adamw_matches_the_formula_and_decays_only_matrices():
    rng = np.random.default_rng(3)
    params = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    want = {k: v.copy() for k, v in params.items()}
    lr, (b1, b2), eps, wd = 0.01, (0.8, 0.9), 1e-8, 0.5
    opt = ref.AdamW(lr, (b1, b2), eps, wd)
    m = {k: 0.0 for k in params}
    v = {k: 0.0 for k in params}
    for t in (1, 2, 3):
        grads = {k: rng.standard_normal(p.shape) for k, p in params.items()}
        opt.step(params, grads)
        for k, g in grads.items():
            if k == "w":
                want[k] = want[k] * (1 - lr * wd)
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g**2
            want[k] = want[k] - lr * (m[k] / (1 - b1**t)) / (np.sqrt(v[k] / (1 - b2**t)) + eps)
        for k in params:
            np.testing.assert_allclose(params[k], want[k], rtol=1e-14, atol=1e-15)
    # A parameter without a gradient is left alone and its step count does not advance.
    before = params["b"].copy()
    opt.step(params, {"w": np.ones((3, 2))})
    assert np.array_equal(params["b"], before) and opt.state["b"][0] == 3 and opt.state["w"][0] == 4
    with pytest.raises(SpmdsimError, match=r"gradient of 'w' has shape \(2,\); expected \(3, 2\)"):
        opt.step(params, {"w": np.ones(2)})
    with pytest.raises(SpmdsimError, match=r"^AdamW lr -1 must be a finite number >= 0$"):
        ref.AdamW(lr=-1)
    names = ref.AdamW.from_config(TINY)._decay
    assert names("wte") and names("h0.mlp.w1") and not names("h0.ln1.w") and not names("lnf.b")


def test_the_text_is_the_shipped_one_on_every_python(tmp_path, monkeypatch):
    """load_text() reads the text shipped with spmdsim (CPython 3.11.7's sources of MODULES), not the running
    interpreter's: every Python version trains on the same bytes, so the docs' losses hold on all of them."""
    from spmdsim.models.gpt import data

    whole = load_text(10**9)
    assert len(whole) == data.SHIPPED_CHARS == 308_276 and zlib.crc32(whole) == data.SHIPPED_CRC32
    assert max(whole) < 128 and whole.startswith(b'"""Bisection algorithms."""')
    assert zlib.crc32(load_text()) == 3_321_946_636  # the first 200,000 bytes every GPT run trains on
    # 3.11.7's own folder gives the same bytes (checked where that is the interpreter running the test).
    if sys.version_info[:3] == (3, 11, 7):
        assert load_text(10**9, stdlib=sysconfig.get_paths()["stdlib"]) == whole
    # A damaged or missing file is refused in one line that names it.
    monkeypatch.setattr(data, "_SHIPPED", [])
    bad = tmp_path / "text.zlib"
    bad.write_bytes(zlib.compress(whole[:-1] + b"?"))
    monkeypatch.setattr(data, "SHIPPED_TEXT", str(bad))
    with pytest.raises(SpmdsimError, match=r"is not the one spmdsim shipped \(308,276 bytes, CRC-32 \d+; "
                                           r"expected 308,276 and 1283960579\); reinstall spmdsim$"):
        load_text()
    monkeypatch.setattr(data, "SHIPPED_TEXT", str(tmp_path / "gone.zlib"))
    with pytest.raises(SpmdsimError, match=r"gone.zlib' cannot be read .*load_text\(stdlib=folder\)"):
        load_text()


def test_load_text_is_ascii_and_batches_are_deterministic_windows(text_ids, tmp_path):
    text = load_text()
    assert len(text) == 200_000 and max(text) < 128 and b"def " in text
    assert load_text(1000) == text[:1000]
    (tmp_path / "bisect.py").write_bytes("# caf\u00e9\n".encode())
    assert load_text(stdlib=str(tmp_path)) == b"# caf??\n"  # two UTF-8 bytes, two "?"
    with pytest.raises(SpmdsimError, match="no standard library sources found"):
        load_text(stdlib=str(tmp_path / "nowhere"))
    cfg = GPTConfig(seq=16, batch=4)
    x, y = batch(text_ids, cfg, 7)
    assert x.dtype == y.dtype == np.int64 and x.shape == y.shape == (4, 16)
    starts = np.random.default_rng(zlib.crc32(b"0:batch:7")).integers(0, len(text_ids) - 17, 4)
    for row, start in zip(range(4), starts):
        assert np.array_equal(x[row], text_ids[start:start + 16])
        assert np.array_equal(y[row], text_ids[start + 1:start + 17])
    again = batch(text_ids, cfg, 7)
    assert np.array_equal(again[0], x) and np.array_equal(again[1], y)
    assert not np.array_equal(batch(text_ids, cfg, 8)[0], x)
    assert decode(encode("a\tb\n\x01")) == "a\tb\n?"


@pytest.mark.parametrize("ids, step, fragment", [
    ("abc", 0, r"text_ids of shape \(\) and dtype <U3 must be a 1-d integer array"),
    (np.arange(17), 0, "text of 17 tokens is too short for seq 16; expected at least 18"),
    (np.arange(100), -1, "step -1 must be an integer >= 0"),
    (np.arange(100) + 100, 0, r"token id \d+ in the text is outside the vocabulary \[0, 128\)"),
])
def test_batch_refuses_bad_input(ids, step, fragment):
    with pytest.raises(SpmdsimError, match=fragment):
        batch(np.asarray(ids), GPTConfig(seq=16, batch=4), step)


@pytest.mark.parametrize("field, value, fragment", [
    ("vocab", 0, "GPTConfig vocab 0 must be an integer >= 1"),
    ("layers", 2.5, "GPTConfig layers 2.5 must be an integer >= 1"),
    ("batch", True, "GPTConfig batch True must be an integer >= 1"),
    ("heads", 3, r"GPTConfig d_model 128 must be divisible by heads 3"),
    ("dropout", 1.0, r"GPTConfig dropout 1.0 must be a finite number in \[0, 1\)"),
    ("dropout", -0.1, r"GPTConfig dropout -0.1 must be a finite number in \[0, 1\)"),
    ("lr", -0.5, "GPTConfig lr -0.5 must be a finite number >= 0"),
    ("eps", float("nan"), "GPTConfig eps nan must be a finite number > 0"),
    ("weight_decay", -1, "GPTConfig weight_decay -1 must be a finite number >= 0"),
    ("betas", (0.9,), r"GPTConfig betas \(0.9,\) must be a pair \(beta1, beta2\) in \[0, 1\)"),
    ("betas", (0.9, 1.0), r"GPTConfig betas \(0.9, 1.0\) must be a pair"),
    ("seed", -1, "GPTConfig seed -1 must be an integer >= 0"),
    ("init_std", "0.02", "GPTConfig init_std '0.02' must be a finite number > 0"),
])
def test_config_refuses_each_bad_field_in_one_line(field, value, fragment):
    with pytest.raises(SpmdsimError, match=fragment) as info:
        GPTConfig(**{field: value})
    assert "\n" not in str(info.value)


def test_config_defaults_and_specs():
    cfg = GPTConfig()
    assert (cfg.vocab, cfg.d_model, cfg.heads, cfg.layers, cfg.seq, cfg.batch, cfg.head_dim) == \
        (128, 128, 4, 4, 64, 8, 32)
    assert cfg.betas == (0.9, 0.99) and GPTConfig(betas=[0.5, 0.6]).betas == (0.5, 0.6)
    specs = param_specs(cfg)
    names = [s.name for s in specs]
    assert names[:4] == ["wte", "wpe", "h0.ln1.w", "h0.ln1.b"] and names[-2:] == ["lnf.w", "lnf.b"]
    assert len(names) == 2 + 15 * 4 + 2 and len(set(names)) == len(names)
    assert names[2:17] == ["h0." + n for n in ("ln1.w", "ln1.b", "attn.wq", "attn.bq", "attn.wk",
                                                "attn.wv", "attn.bv", "attn.wo", "attn.bo", "ln2.w", "ln2.b",
                                                "mlp.w1", "mlp.b1", "mlp.w2", "mlp.b2")]
    by_name = {s.name: s for s in specs}
    assert by_name["h1.mlp.w1"].shape == (128, 512) and by_name["wpe"].shape == (64, 128)
    assert [s.name for s in specs if decays(s)] == [s.name for s in specs if s.init == "seeded"]
    wte, wo = seeded(cfg, by_name["wte"]), seeded(cfg, by_name["h2.attn.wo"])
    assert wte.seed == zlib.crc32(b"0:wte") and wte.high == pytest.approx(math.sqrt(3) * 0.02)
    assert wo.high == pytest.approx(math.sqrt(3) * 0.02 / math.sqrt(8))
    assert float(wte.full().std()) == pytest.approx(0.02, rel=0.05)
    assert seeded(cfg, by_name["h0.ln1.w"]) is None
    params = ref.init_params(cfg)
    assert list(params) == names and np.array_equal(params["h3.ln2.w"], np.ones(128))
    # A rank's shard of a weight is a region of the same seeded tensor: the reference's numbers.
    assert np.array_equal(wte.region((slice(32, 64), slice(None))), params["wte"][32:64])
    assert dropout_seed(cfg, 4, "h1.attn") == zlib.crc32(b"0:dropout:4:h1.attn")
    assert dropout_tensor(cfg, 0, "h3.attn").shape == (8, 4, 64, 64)
    assert dropout_tensor(cfg, 0, "emb", batch=2).shape == (2, 64, 128)
    with pytest.raises(SpmdsimError, match="dropout site 'h4.attn' is not one of this model's"):
        dropout_seed(cfg, 0, "h4.attn")


def test_generate_is_deterministic_and_in_range():
    cfg = GPTConfig(vocab=40, d_model=8, heads=2, layers=1, seq=6, batch=1)
    params = ref.init_params(cfg)
    out = ref.generate(params, cfg, [1, 2, 3], 10)
    assert out.shape == (10,) and out.dtype == np.int64 and 0 <= out.min() and out.max() < 40
    assert np.array_equal(ref.generate(params, cfg, [1, 2, 3], 10), out)
    # Greedy: each token is the argmax of the logits of the space-padded last T tokens.
    window = np.array([[32, 32, 32, 1, 2, 3]])
    assert out[0] == np.argmax(ref.logits(params, window, cfg)[0, -1])
    hot = ref.generate(params, cfg, list(range(9)), 25, temperature=1.0, seed=5)
    assert np.array_equal(hot, ref.generate(params, cfg, list(range(9)), 25, temperature=1.0, seed=5))
    assert len(set(hot.tolist())) > 3  # sampling from a near-uniform model spreads out
    assert ref.generate(params, cfg, [], 3).shape == (3,)
    with pytest.raises(SpmdsimError, match=r"prompt ids must be integers in \[0, 40\), got 40"):
        ref.generate(params, cfg, [40], 3)
    with pytest.raises(SpmdsimError, match="temperature -1 must be a finite number >= 0"):
        ref.generate(params, cfg, [1], 3, temperature=-1)


def test_reference_refuses_bad_input():
    params, x, y = _tiny_problem()
    with pytest.raises(SpmdsimError, match=r"x of shape \(3, 5\) and dtype int64 must be integer ids"):
        ref.loss_and_grads(params, x[:, :5], y, TINY, 0)
    with pytest.raises(SpmdsimError, match=r"y holds id 16 outside the vocabulary \[0, 16\)"):
        ref.loss_and_grads(params, x, y * 0 + 16, TINY, 0)
    with pytest.raises(SpmdsimError, match="step is None in training mode"):
        ref.loss_and_grads(params, x, y, TINY, None)
    del params["h1.mlp.b2"]
    with pytest.raises(SpmdsimError, match=r"params lack 'h1.mlp.b2' \(of shape \(8,\)\)"):
        ref.loss_and_grads(params, x, y, TINY, 0)


def test_command_line_prints_losses_and_a_sample_in_100_columns(capsys):
    code = ref.main(["--steps", "3", "--every", "2", "--layers", "1", "--d-model", "16", "--heads", "2",
                     "--seq", "16", "--batch", "2", "--sample", "150", "--prompt", "import ", "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "step     2  loss" in out and "s per step" in out and "sample" in out
    assert all(len(line) <= 100 for line in out.splitlines())
    assert ref.main(["--heads", "3", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    # --d-model left alone: "the default d_model 128", not "--d-model 128", a flag the user never typed
    assert err.strip().count("\n") == 0 and "error: the default d_model 128 must be divisible by --heads 3" in err
    assert ref.main(["--threads", "0"]) == 2 and "--threads 0 must be" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--dropout", "2"], "--dropout 2 must be a finite number in [0, 1)"),  # was "GPTConfig dropout 2.0"
    (["--clip", "-1"], "--clip -1 must be a finite number >= 0 (0: no clipping)"),
    (["--d-model", "30"], "--d-model 30 must be divisible by the default heads 4 (each head takes --d-model / "
                          "heads features)"),
    (["--d-model", "30", "--heads", "4"], "--d-model 30 must be divisible by --heads 4 (each head takes --d-model / "
                                          "--heads features)"),
    # refused after 200 steps of training, as "temperature -1.0" and "n -1"
    (["--temperature", "-1"], "--temperature -1 must be a finite number >= 0 (0: greedy)"),
    (["--sample", "-1"], "--sample -1 must be an integer from 0 to 2,000 (characters to generate, each a "
                         "forward pass of the model; 0: none)"),
    # drawn after the training, a character a forward pass, for hours with nothing printed
    (["--sample", "100000000"], "--sample 100,000,000 must be an integer from 0 to 2,000 (characters to "
                                "generate, each a forward pass of the model; 0: none)"),
])
def test_command_line_refuses_its_flags_as_typed_before_training(capsys, argv, message):
    assert ref.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err == f"error: {message}\n" and captured.out == ""


def test_gpt_modules_import_no_mpi4py():
    """The reference runs where no MPI library loads (`python -m spmdsim.models.gpt.reference`). The models
    sit above the runtime and may load it (AdamW's numpy step comes from spmdsim.nn.optim, whose optimizers
    run on it), but not mpi4py."""
    code = ("import sys, spmdsim.models.gpt, spmdsim.models.gpt.reference\n"
            "print(sorted(m for m in sys.modules if m.startswith('mpi4py')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr + out.stdout
