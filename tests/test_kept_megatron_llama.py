"""Llama's options under Megatron's kept set (``kept="megatron"``): each Megatron's fused piece, keeping its set.

The count of one layer on one tensor-parallel rank, s·b·h a (seq, samples of a dp rank, d_model) block, F the MLP's
hidden width, t = tp, sequence parallelism on (the norms' outputs are sequence shards, s·b·h/t), w the activations'
width (8 bytes at float64, 2 at bf16-mixed), masks 1 byte:

- SwiGLU (spmdsim.nn.ops.megatron.swiglu, Megatron's bias_swiglu): the MLP kind keeps fc1's input (the sequence shard,
  s·b·h/t), fc1's stacked output, gate and up (2 s·b·F/t), fc2's input (s·b·F/t) and the residual dropout's mask
  (s·b·h/t bytes): (s·b·h + 3 s·b·F)/t values, where silu(gate) as a node of its own kept one s·b·F/t more.
- grouped-query attention (kv key/value heads of head_dim d each, in the core's products: spmdsim.nn.ops.attention):
  the attention kind keeps the QKV products' input (s·b·h/t), Q (s·b·h/t), K and V at kv heads (one buffer,
  2 s·b·kv·d/t), the projection's input (s·b·h/t) and the residual dropout's mask: (3 s·b·h + 2 s·b·kv·d)/t
  values, where K and V repeated for their query heads (times ones, as Megatron's repeat_interleave) kept
  2 s·b·h/t more (and the 2 x 1 ones).
- rotary embeddings (spmdsim.nn.ops.megatron.rotary, Megatron's fused apply_rotary_pos_emb): a node that keeps no
  block, so with heads a attention's kinds keep the QKV products' input, Q, K and V (one buffer, 3 s·b·h/t: V a
  view of it) and the projection's input (attention: 5 s·b·h/t values), and the rotated Q and K that the core
  reads (attention core: 2 s·b·h/t, beside its probabilities and dropped-out ones, 2 a·s²·b/t, and the mask);
  the cos and sin tables once (2 s·d at float32 beside bf16, else the values' width). The graph's rotation kept
  x cos, the turned halves and their product with sin, for Q and for K: 6 s·b·h/t more a layer.
- RMSNorm (spmdsim.nn.ops.rms_norm(..., kept="megatron"), TransformerEngine's fused RMSNorm, which saves its input
  and rsigma): the layer norm kind keeps each norm's input (s·b·h/t) and its rows' root (s·b/t statistics, float32
  beside bf16, else the values' width): 2 (s·b·h/t values + s·b/t statistics) a layer, where the graph's
  normalization kept its normalized values too (s·b·h/t a norm). Under bf16-mixed the fused kernel's x / root
  times the weight in float32 rounds once (spmdsim.models.gpt.mixed follows).
- residual adds without biases (GPTConfig.bias False): Megatron's bias_dropout_add with no bias
  (spmdsim.nn.ops.megatron.bias_dropout_add(y, None, ...)), the boolean mask kept alone: an add's backward reads no
  operand, where the graph's sum kept the dropped-out y and the sum (s·b·h/t each, two adds a layer). A bias-less
  model keeps what the biased one keeps, kind by kind (the biases are parameters).

With all of Llama's options together (RMSNorm, SwiGLU, grouped-query attention, rotary embeddings, no biases) a
layer keeps the sum of the kinds' counts above and nothing more.

Each measured on every rank by kept_bytes, real and dry alike (the dry run that `spmdsim estimate` reads).
"""
from __future__ import annotations

import pytest

import spmdsim
from spmdsim import Layout
from spmdsim.nn.autograd import kept_bytes
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.data import batch
from spmdsim.models.gpt.parallel import GPT
from spmdsim.models.gpt.train import TOLERANCE, train

TEXT = encode(load_text(20_000))
DP, TP = 2, 2
S, B, H = 16, 4, 32  # seq, samples of one dp rank (batch 8 over dp 2), d_model


def _cfg(**options) -> GPTConfig:
    return GPTConfig(layers=2, d_model=H, heads=4, seq=S, batch=B * DP, dropout=0.2, **options)


def _kept(cfg: GPTConfig, dry: bool, precision: str = "fp64") -> list:
    """Per rank: kept_bytes(..., masks=True) of one training forward under kept="megatron", dp 2 x tp 2 with sp."""

    def body():
        from spmdsim.base.precision import precision as policy

        mesh = spmdsim.Mesh(Layout((DP, TP), ("dp", "tp")), spmdsim.world())
        model = GPT(cfg, mesh, sp=True, kept="megatron", precision=policy(precision))
        x, y = batch(TEXT, cfg, 0)
        ids = spmdsim.DTensor.from_global(mesh, x, mesh.layout("dp", None))
        targets = spmdsim.DTensor.from_global(mesh, y, mesh.layout("dp", None))
        return kept_bytes([model.loss(ids, targets, 0)], exclude=list(model.params.values()), masks=True)

    return spmdsim.simulate(DP * TP, body, dry_run=dry)


@pytest.mark.parametrize("precision, width", [("fp64", 8), ("bf16-mixed", 2)])
def test_swiglu_keeps_fc1s_output_alone(precision, width):
    """The MLP kind: (s·b·h + 3 s·b·F)/t values and s·b·h/t mask bytes a layer (the module's count)."""
    if precision != "fp64":
        pytest.importorskip("ml_dtypes")
    F = 48
    cfg = _cfg(mlp="swiglu", ffn=F)
    real, dry = _kept(cfg, False, precision), _kept(cfg, True, precision)
    for rank in range(DP * TP):
        values, masks = real[rank]
        assert values["mlp"] == cfg.layers * (S * B * H + 3 * S * B * F) // TP * width, (rank, values)
        assert masks["mlp"] == cfg.layers * S * B * H // TP, (rank, masks)
        assert dry[rank] == real[rank], rank


@pytest.mark.parametrize("precision, width", [("fp64", 8), ("bf16-mixed", 2)])
def test_grouped_query_attention_keeps_k_and_v_at_kv_heads(precision, width):
    """The attention kind: (3 s·b·h + 2 s·b·kv·d)/t values and s·b·h/t mask bytes a layer (the module's count)."""
    if precision != "fp64":
        pytest.importorskip("ml_dtypes")
    cfg = _cfg(kv_heads=2)
    kv = cfg.kv * cfg.head_dim
    real, dry = _kept(cfg, False, precision), _kept(cfg, True, precision)
    for rank in range(DP * TP):
        values, masks = real[rank]
        assert values["attention"] == cfg.layers * (3 * S * B * H + 2 * S * B * kv) // TP * width, (rank, values)
        assert masks["attention"] == cfg.layers * S * B * H // TP, (rank, masks)
        assert dry[rank] == real[rank], rank


@pytest.mark.parametrize("precision, width, table", [("fp64", 8, 8), ("bf16-mixed", 2, 4)])
def test_the_rotary_embeddings_keep_no_block_of_their_own(precision, width, table):
    """The attention kinds: 5 s·b·h/t values, and 2 s·b·h/t + 2 a·s²·b/t in the core, a layer, and the two tables
    once (the module's count)."""
    if precision != "fp64":
        pytest.importorskip("ml_dtypes")
    cfg = _cfg(positions="rope")
    sbh, scores = S * B * H // TP, B * cfg.heads // TP * S * S
    real, dry = _kept(cfg, False, precision), _kept(cfg, True, precision)
    for rank in range(DP * TP):
        values, masks = real[rank]
        assert values["attention"] == cfg.layers * 5 * sbh * width + 2 * S * cfg.head_dim * table, (rank, values)
        assert values["attention core"] == cfg.layers * (2 * sbh + 2 * scores) * width, (rank, values)
        assert masks["attention core"] == cfg.layers * scores, (rank, masks)
        assert dry[rank] == real[rank], rank


@pytest.mark.parametrize("precision, width, stat", [("fp64", 8, 8), ("bf16-mixed", 2, 4)])
def test_rms_norm_keeps_its_input_and_each_rows_root(precision, width, stat):
    """The layer norm kind: 2 (s·b·h/t values + s·b/t statistics) a layer (the module's count)."""
    if precision != "fp64":
        pytest.importorskip("ml_dtypes")
    cfg = _cfg(norm="rms")
    real, dry = _kept(cfg, False, precision), _kept(cfg, True, precision)
    for rank in range(DP * TP):
        values, masks = real[rank]
        assert values["layer norm"] == cfg.layers * 2 * (S * B * H * width + S * B * stat) // TP, (rank, values)
        assert "layer norm" not in masks, (rank, masks)
        assert dry[rank] == real[rank], rank


@pytest.mark.parametrize("precision", ["fp64", "bf16-mixed"])
def test_residual_adds_without_biases_keep_the_mask_alone(precision):
    """A bias-less model keeps what the biased one keeps, kind by kind, values and masks (the module's count)."""
    if precision != "fp64":
        pytest.importorskip("ml_dtypes")
    biased = _kept(_cfg(), False, precision)
    real, dry = _kept(_cfg(bias=False), False, precision), _kept(_cfg(bias=False), True, precision)
    for rank in range(DP * TP):
        assert real[rank] == biased[rank], (rank, real[rank], biased[rank])
        assert dry[rank] == real[rank], rank


@pytest.mark.parametrize("precision, width, stat", [("fp64", 8, 8), ("bf16-mixed", 2, 4)])
def test_llama_keeps_the_sum_of_its_pieces(precision, width, stat):
    """Every option of Llama's at once: each kind keeps the module's count of its piece, nothing more."""
    if precision != "fp64":
        pytest.importorskip("ml_dtypes")
    F = 48
    cfg = _cfg(ffn=F, norm="rms", mlp="swiglu", kv_heads=2, tied=False, positions="rope", bias=False)
    sbh, kv, scores = S * B * H // TP, S * B * cfg.kv * cfg.head_dim // TP, B * cfg.heads // TP * S * S
    L = cfg.layers
    real, dry = _kept(cfg, False, precision), _kept(cfg, True, precision)
    for rank in range(DP * TP):
        values, masks = real[rank]
        assert values["layer norm"] == L * 2 * (sbh * width + S * B // TP * stat), (rank, values)
        assert values["attention"] == L * (3 * sbh + 2 * kv) * width + 2 * S * cfg.head_dim * stat, (rank, values)
        assert values["attention core"] == L * (sbh + kv + 2 * scores) * width, (rank, values)
        assert values["mlp"] == L * (sbh + 3 * S * B * F // TP) * width, (rank, values)
        blocks = {kind: masks.get(kind) for kind in ("layer norm", "attention", "attention core", "mlp")}
        assert blocks == {"layer norm": None, "attention": L * sbh, "attention core": L * scores,
                          "mlp": L * sbh}, (rank, masks)
        assert dry[rank] == real[rank], rank


OPTIONS = {"swiglu": dict(mlp="swiglu", ffn=48), "gqa": dict(kv_heads=2), "rope": dict(positions="rope"),
           "rms": dict(norm="rms"), "nobias": dict(bias=False),
           "llama": dict(ffn=48, norm="rms", mlp="swiglu", kv_heads=2, tied=False, positions="rope", bias=False)}


@pytest.mark.parametrize("precision", ["fp64", "bf16-mixed"])
@pytest.mark.parametrize("option", list(OPTIONS))
def test_a_step_under_megatrons_kept_set_passes_its_check(precision, option):
    """fp64 against spmdsim.models.gpt.reference; bf16-mixed against spmdsim.models.gpt.mixed, which rounds as the fused
    pieces under kept "megatron" (tests/test_train_bf16_llama.py tells a reference rounding as the graph apart)."""
    if precision != "fp64":
        pytest.importorskip("ml_dtypes")
    cfg = _cfg(**OPTIONS[option])
    steps = spmdsim.simulate(DP * TP, lambda: train(cfg, spmdsim.world(), DP, TP, 2, TEXT, sp=True, kept="megatron",
                                                      precision=precision)[1])[0]
    for r in steps:
        assert r.passed and all(e <= t for e, t in zip(r.errors, r.tolerances)), steps
        assert precision != "fp64" or max(r.errors) <= TOLERANCE, steps


def test_an_moe_layers_residual_keeps_the_mask_alone():
    """An MoE layer's residual under kept "megatron" (Mixtral's: no biases) is Megatron's bias_dropout_add: its node
    keeps the boolean mask and no block of the layer's output or the residual (the graph's sum kept both)."""
    from spmdsim.base import buffers
    from spmdsim.nn.autograd.kept import _NOTHING, _arrays
    from spmdsim.models.moe.config import MoEConfig

    cfg = _cfg(bias=False, moe=MoEConfig(experts=2, top_k=1, every=1))

    def body():
        mesh = spmdsim.Mesh(Layout((DP, 1, TP), ("dp", "ep", "tp")), spmdsim.world())
        model = GPT(cfg, mesh, sp=True, kept="megatron")
        x, _ = batch(TEXT, cfg, 0)
        h = model.blocks(model.embed(spmdsim.DTensor.from_global(mesh, x, mesh.layout(("dp", "ep"), None)), 0, True),
                         0, True)
        zeros = {id(z) for z in _NOTHING.values()}
        kept = [a for a in _arrays(h._ag) if id(buffers.owner(a)) not in zeros]
        return h._ag.name, [(a.dtype.name, a.shape) for a in kept]

    for name, kept in spmdsim.simulate(DP * TP, body):
        assert name == "bias_dropout_add" and kept == [("bool", (S // TP, B, H))], (name, kept)
