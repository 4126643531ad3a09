"""Flash attention (spmdsim.nn.ops.attention's ``flash=True``; GPTConfig attention "flash"): the unfused core's values
and gradients within the rounding of the sums that make them, on simulated ranks with the query rows and heads
split, over tile counts with a ragged last tile; no (Tq, Tk) block kept; its FLOPs those of selective
recomputation; the GPT's training steps checked against one numpy process, dense and pipelined."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import spmdsim
from spmdsim import Layout, OperatorError, SeededTensor
from spmdsim.nn import ops
from spmdsim.nn.autograd import kept_bytes
from spmdsim.base.flops import counting
from spmdsim.runtime import DTensor, Mesh

B, T, H, D = 2, 12, 4, 3  # 6 query rows a rank (the rows split over dp 2): tiles of 1, 4 (+2), 5 (+1), 6, 128
BF16 = np.dtype(ml_dtypes.bfloat16)


def _inputs(hk: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, T, H, D)), rng.standard_normal((B, T, hk, D)),
            rng.standard_normal((B, T, hk, D)), rng.standard_normal((B, T, H, D))]


def _run(arrays: list, dtype, batch_first: bool = True, mask: bool = False, **options) -> list:
    """y, dq, dk, dv (global, batch-first, float64) of ops.attention on 4 ranks: rows over dp, heads over tp."""
    order = (0, 1, 2, 3) if batch_first else (1, 0, 2, 3)
    pad = np.ones((B, T), bool)
    pad[1, 9:] = False

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        L = mesh.layout
        spec = (None, "dp", "tp", None) if batch_first else ("dp", None, "tp", None)
        xs = [DTensor.from_global(mesh, a.transpose(order).astype(dtype), L(*spec)).requires_grad_()
              for a in arrays[:3]]
        keys = DTensor.from_global(mesh, pad, L(None, None)) if mask else None
        y = ops.attention(*xs, mask=keys, batch_first=batch_first, **options)
        g = DTensor.from_global(mesh, arrays[3].transpose(order).astype(dtype), y.layout)
        ops.sum(y * g).backward()
        return [np.asarray(t.gather(), np.float64).transpose(order) for t in [y] + [x.grad for x in xs]]

    return spmdsim.simulate(4, body)[0]


def _bounds(arrays: list, causal: bool, dropout: float, seed: int, mask: bool = False) -> list:
    """The sums of the magnitudes entering each result's entries (numpy, float64): |O| <= Pd |V|, and for the
    gradients the same products over |dS| <= P (F A + rowsum(Pd A)) / sqrt(D), A = |dO| |V|^T, F the dropout's
    factors: what bounds two orders of rounding the same sums apart."""
    q, k, v, g = (a.transpose(0, 2, 1, 3) for a in arrays)  # (b, h, t, d)
    groups = H // k.shape[1]
    k, v = np.repeat(k, groups, 1), np.repeat(v, groups, 1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    hide = np.zeros(s.shape, bool)
    if causal:
        hide |= np.triu(np.ones((T, T), bool), 1)
    if mask:
        hide[1, :, :, 9:] = True
    s = np.where(hide, -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    keep = SeededTensor((B, H, T, T), "float64", seed=seed, low=0.0, high=1.0).full() >= dropout if dropout else 1
    f = keep / (1.0 - dropout)
    pd = p * f
    a = np.abs(g) @ np.abs(v).transpose(0, 1, 3, 2)
    ds = p * (f * a + (pd * a).sum(-1, keepdims=True)) / np.sqrt(D)
    summed = lambda x: x.reshape(B, H // groups, groups, T, x.shape[-1]).sum(2)  # noqa: E731 (dK, dV over a group)
    out = [pd @ np.abs(v), ds @ np.abs(k), summed(ds.transpose(0, 1, 3, 2) @ np.abs(q)),
           summed(pd.transpose(0, 1, 3, 2) @ np.abs(g))]
    return [x.transpose(0, 2, 1, 3) for x in out]


CASES = [  # (causal, dropout, key/value heads, dtype, batch_first, a padding mask)
    (True, 0.0, H, np.float64, True, False),
    (False, 0.3, H, np.float64, True, False),
    (True, 0.25, 2, np.float64, False, True),
    (True, 0.2, 2, BF16, True, False),
    (False, 0.0, 2, np.float32, True, False),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"causal={c[0]},p={c[1]},hk={c[2]},{np.dtype(c[3]).name},"
                                                      f"bf={c[4]},mask={c[5]}")
def test_flash_is_the_unfused_core_within_the_rounding_of_its_sums(case):
    causal, dropout, hk, dtype, batch_first, mask = case
    arrays = _inputs(hk)
    options = dict(causal=causal, dropout=dropout, seed=7, batch_first=batch_first, mask=mask)
    want = _run(arrays, dtype, **options)
    bounds = _bounds(arrays, causal, dropout, 7, mask)
    # float64/float32: a few roundings of each sum's terms; bfloat16: the probabilities and results rounded to 8
    # bits (both cores round p, its dropped-out values and the output, each maybe to the neighbour)
    eps = 2.0 ** -6 if dtype == BF16 else 32 * np.finfo(dtype).eps
    for tile in (1, 4, 5, 128):
        got = _run(arrays, dtype, flash=True, tile=tile, **options)
        for name, a, b, bound in zip(("y", "dq", "dk", "dv"), got, want, bounds):
            assert np.all(np.abs(a - b) <= eps * bound + 1e-300), (tile, name, np.max(np.abs(a - b) / bound))
    if dtype == np.float64:  # not vacuous: a wrong row softmax or D breaks the bound
        assert np.max(bounds[1]) > 0.1


def test_flash_keeps_no_block_of_scores():
    """The node keeps q (a leaf, left out), k and v moved to the plan's layout (every key here), the output, a
    log-sum-exp a row and the dropout's factor (a number): nothing (Tq, Tk)."""
    arrays = _inputs(2)

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        L = mesh.layout
        xs = [DTensor.from_global(mesh, a, L(None, "dp", "tp", None)).requires_grad_() for a in arrays[:3]]
        kept = []
        for flash in (True, False):
            y = ops.attention(*xs, causal=True, dropout=0.2, seed=3, flash=flash, tile=4)
            kept.append(sum(kept_bytes([y], exclude=xs).values()))
        return kept

    flash, unfused = spmdsim.simulate(4, body)[0]
    rows = B * (H // 2) * (T // 2)  # this rank's query rows of its heads
    moved = 2 * B * T * (2 // 2) * D * 8  # k and v, all their rows, this rank's one key/value head
    assert flash == rows * D * 8 + rows * 8 + moved + 8  # the output, the log-sum-exp, k, v, float64; the factor
    assert unfused >= 2 * rows * T * 8  # the probabilities and their dropped-out values, at least


def test_flash_counts_the_unfused_products_and_the_scores_again():
    """Forward and backward FLOPs the unfused core's; the scores product again in phase "recompute" (HFU's)."""
    arrays = _inputs(2)

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        L = mesh.layout
        out = []
        for flash in (False, True):
            xs = [DTensor.from_global(mesh, a, L(None, "dp", "tp", None)).requires_grad_() for a in arrays[:3]]
            with counting() as c:
                ops.sum(ops.attention(*xs, causal=True, flash=flash, tile=5)).backward()
            out.append(c)
        return out

    unfused, flash = spmdsim.simulate(4, body)[0]
    scores = 2 * B * (H // 2) * (T // 2) * T * D  # this rank's q k^T
    assert flash.total("forward") == unfused.total("forward") > 0
    assert flash.total("backward") == unfused.total("backward") > 0
    assert flash.total("recompute") == scores and unfused.total("recompute") == 0
    assert any(k.op == "flash attention" for k in flash.kernels)


def test_flash_refuses_what_it_cannot_be_in_one_line():
    def body():
        mesh = Mesh(Layout((4,), ("x",)), spmdsim.world())
        q = DTensor.from_global(mesh, np.ones((2, 4, 2, 2)), mesh.layout(None, "x", None, None))
        said = []
        for options in (dict(flash=True, recompute=True), dict(flash=True, tile=0), dict(flash=1)):
            with pytest.raises(OperatorError) as e:
                ops.attention(q, q, q, **options)
            said.append(str(e.value))
        return said

    said = spmdsim.simulate(4, body)[0]
    assert said[0].startswith("attention: flash=True keeps no scores already") and "\n" not in said[0]
    assert said[1] == "attention: tile 0 must be an integer >= 1 (query rows a flash tile takes)"
    assert said[2] == "attention: flash 1 must be True or False"


@pytest.fixture
def small_tiles(monkeypatch):
    """The GPT's flash tiles of 3 query rows (its seq 8 over tp: several tiles, the last ragged)."""
    monkeypatch.setitem(ops.attention.__kwdefaults__, "tile", 3)


@pytest.mark.parametrize("precision", ["fp64", "bf16-mixed"])
def test_the_gpt_trains_with_flash_attention_checked_against_numpy(small_tiles, precision):
    from spmdsim.models.gpt import GPTConfig, encode, load_text
    from spmdsim.models.gpt.train import train

    text = encode(load_text(20_000))
    cfg = GPTConfig(layers=1, d_model=16, heads=4, kv_heads=2, seq=8, batch=4, dropout=0.2, attention="flash")
    for kept, recompute in (("graph", "selective"), ("megatron", "none")):
        steps = spmdsim.simulate(4, lambda: train(cfg, spmdsim.world(), 2, 2, 2, text, sp=True, kept=kept,
                                                  recompute=recompute, precision=precision)[1])[0]
        assert len(steps) == 2 and all(s.passed for s in steps), steps


def test_a_captured_step_with_flash_attention_replays_checked_against_numpy(small_tiles):
    """spmdsim.runtime.replay: the tiles' writes into the output, log-sum-exp and dQ are recorded and replayed."""
    from spmdsim.models.gpt import GPTConfig, encode, load_text
    from spmdsim.models.gpt.train import train

    text = encode(load_text(20_000))
    cfg = GPTConfig(layers=1, d_model=16, heads=4, seq=8, batch=4, dropout=0.2, attention="flash")
    steps = spmdsim.simulate(4, lambda: train(cfg, spmdsim.world(), 2, 2, 3, text, sp=True, replay=True)[1])[0]
    assert len(steps) == 3 and all(s.passed for s in steps), steps
    assert steps[1].loss != steps[2].loss  # replayed steps train (new batches, new masks)


def test_the_pipelined_gpt_trains_with_flash_attention_checked_against_numpy(small_tiles):
    from spmdsim.models.gpt import GPTConfig, encode, load_text
    from spmdsim.models.gpt.pipeline import train_pipelined

    text = encode(load_text(20_000))
    cfg = GPTConfig(layers=2, d_model=16, heads=4, seq=8, batch=4, dropout=0.1, attention="flash")
    steps = spmdsim.simulate(4, lambda: train_pipelined(cfg, spmdsim.world(), 2, 1, 2, 1, text, sp=True,
                                                        microbatches=2)[1])[0]
    assert steps and all(s.passed for s in steps), steps


def test_gptconfig_refuses_an_unknown_attention():
    from spmdsim.errors import SpmdsimError
    from spmdsim.models.gpt import GPTConfig

    with pytest.raises(SpmdsimError, match="^GPTConfig attention 'fused' must be one of 'unfused', 'flash'$"):
        GPTConfig(attention="fused")


def test_the_estimate_prices_flash_attentions_kept_set_and_its_tile():
    """`spmdsim estimate --attention flash`'s dry run: the attention core keeps its output and log-sum-exp (no
    probabilities), the largest transient moment is a tile's blocks (128 query rows of 1,024), not the softmax's
    whole scores, and the scores product runs again in the backward (recompute: HFU's, not MFU's)."""
    import json

    from docs_commands import run_here

    argv = ["estimate", "gpt", "--layers", "2", "--hidden", "256", "--heads", "8", "--seq", "1024", "--vocab", "1024",
            "--micro-batch", "1", "--global-batch", "2", "--tp", "2", "--dropout", "0", "--precision", "bf16-mixed",
            "--json"]
    stages = {}
    for attention in ("unfused", "flash"):
        code, out, err = run_here("main", argv + ["--attention", attention])
        assert code == 0, err
        stages[attention] = json.loads(out)["stages"][0]
    unfused, flash = stages["unfused"], stages["flash"]
    core = {name: dict(s["program_bytes"]["kept"])["attention core"] for name, s in stages.items()}
    scores = 2 * 1 * 4 * 1024 * 1024  # 2 layers' (b, h / tp, s, s) probabilities, elements
    out = 2 * 1 * 4 * 1024 * 32  # their outputs (b, h / tp, s, head_dim)
    assert core["unfused"] >= 2 * scores and core["flash"] <= 8 * 1.1 * out  # float64 bytes, the dry program's
    assert unfused["transient"]["what"] == "attention softmax (backward)"
    assert flash["transient"]["bytes"] < unfused["transient"]["bytes"] / 4
    assert flash["flops"]["forward"] == unfused["flops"]["forward"]
    assert flash["flops"]["backward"] == unfused["flops"]["backward"]
    assert flash["flops"]["recompute"] == 2 * 2 * 2 * 4 * 1024 * 1024 * 32  # 2 microbatches x 2 layers: q k^T again
