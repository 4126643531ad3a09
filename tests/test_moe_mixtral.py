"""Mixtral's experts (docs/howto/experts.md, "Mixtral's experts"): the MoE layer's experts follow GPTConfig's mlp and
bias, SwiGLU experts (w1 and w3 column-parallel over tp, w2 row-parallel) without biases, checked against the numpy
reference on simulated ranks (ep 1 and 2, tp 1 and 2, a capacity and dropless); the reference itself against the
dense SwiGLU MLP and central differences; the parameter list, the closed count and the dry run's count of a
Mixtral-8x7B-shaped model against the published total (Jiang et al. 2024, "Mixtral of Experts"; the config.json
of mistralai/Mixtral-8x7B-v0.1)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import spmdsim
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.params import param_specs
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.models.moe import MoEConfig
from spmdsim.models.moe.reference import moe_backward, moe_forward

TEXT = encode(load_text(20_000))
D, T, B, E, F = 8, 6, 4, 4, 16
#: Mixtral's options of the GPT: SwiGLU (its experts' too), no biases, RMSNorm, grouped-query attention, RoPE, untied.
MIXTRAL = dict(mlp="swiglu", bias=False, norm="rms", kv_heads=2, positions="rope", tied=False)
#: Mixtral 8x7B (the config.json of mistralai/Mixtral-8x7B-v0.1): every one of 32 layers an MoE layer of 8 experts,
#: top-2, expert width 14336 (intermediate_size), hidden 4096, 32 heads, 8 key/value heads, vocabulary 32000.
MIXTRAL_8X7B = dict(vocab=32000, d_model=4096, heads=32, kv_heads=8, layers=32, ffn=14336, norm="rms", mlp="swiglu",
                    tied=False, positions="rope", bias=False)


def _params(swiglu=True, bias=False, seed=0):
    rng = np.random.default_rng(seed)
    p = {"h1.moe.router": rng.standard_normal((D, E)), "h1.moe.w1": rng.standard_normal((E, D, F)) * 0.3,
         "h1.moe.w3": rng.standard_normal((E, D, F)) * 0.3, "h1.moe.w2": rng.standard_normal((E, F, D)) * 0.3,
         "h1.moe.b1": rng.standard_normal((E, F)) * 0.1, "h1.moe.b3": rng.standard_normal((E, F)) * 0.1,
         "h1.moe.b2": rng.standard_normal((E, D)) * 0.1}
    p = {n: v for n, v in p.items() if (swiglu or not n.endswith("3")) and (bias or ".moe.b" not in n)}
    return p, rng.standard_normal((B * T, D)), rng.standard_normal((B * T, D))


def _reference(moe, p, x, g):
    out, cache = moe_forward(p, "h1.", x, B, moe)
    loss = float((out * g).sum()) + moe.aux_loss_coeff * cache["aux"] + moe.z_loss_coeff * cache["z"]
    grads: dict = {}
    dx = moe_backward(p, "h1.", g, cache, moe, grads)
    return out, loss, grads, dx


def _close(a, b):
    return float(np.max(np.abs(a - b))) <= 1e-12 * max(1.0, float(np.max(np.abs(b))))


def test_one_swiglu_expert_is_the_dense_swiglu_mlp_and_its_gradients_are_central_differences():
    """One expert, top-1: every gate is 1, so the layer's output is silu(x w1) * (x w3) @ w2 (no biases), the
    dense SwiGLU MLP (spmdsim.models.gpt._blocks); its gradients are the loss's central differences. Before, the
    reference ran a GELU expert whatever the parameters held (w3 unread, and b1, b2 required)."""
    moe = MoEConfig(experts=1, top_k=1, dropless=True, aux_loss_coeff=0.0, z_loss_coeff=0.0)
    rng = np.random.default_rng(1)
    p = {"h1.moe.router": rng.standard_normal((D, 1)), "h1.moe.w1": rng.standard_normal((1, D, F)) * 0.3,
         "h1.moe.w3": rng.standard_normal((1, D, F)) * 0.3, "h1.moe.w2": rng.standard_normal((1, F, D)) * 0.3}
    x, g = rng.standard_normal((B * T, D)), rng.standard_normal((B * T, D))
    z = x @ p["h1.moe.w1"][0]
    dense = (z / (1.0 + np.exp(-z)) * (x @ p["h1.moe.w3"][0])) @ p["h1.moe.w2"][0]
    out, loss, grads, dx = _reference(moe, p, x, g)
    assert _close(out, dense)
    assert sorted(grads) == sorted(p)
    for name in ("h1.moe.w1", "h1.moe.w3", "h1.moe.w2"):
        for at in ((0, 1, 2), (0, 5, 3)):
            keep = p[name][at]
            p[name][at] = keep + 1e-6
            up = _reference(moe, p, x, g)[1]
            p[name][at] = keep - 1e-6
            down = _reference(moe, p, x, g)[1]
            p[name][at] = keep
            assert abs((up - down) / 2e-6 - grads[name][at]) < 1e-7, (name, at)


@pytest.mark.parametrize("mesh_shape", [(1, 1, 2), (1, 2, 1), (1, 2, 2)])
@pytest.mark.parametrize("dropless", [False, True])
def test_swiglu_experts_without_biases_and_their_gradients_match_the_reference(mesh_shape, dropless):
    """Before, the layer read moe.b1 and moe.b2 (a KeyError without them) and ran GELU whatever the parameters."""
    from testkit import moe_layer_on_ranks

    moe = MoEConfig(experts=E, top_k=2, capacity_factor=0.75, dropless=dropless, aux_loss_coeff=0.5,
                    z_loss_coeff=0.25)
    p, x, g = _params()
    out, loss, grads, dx = _reference(moe, p, x, g)
    assert sorted(grads) == ["h1.moe.router", "h1.moe.w1", "h1.moe.w2", "h1.moe.w3"]
    for got_out, got_loss, got_grads, got_dx, _, _ in moe_layer_on_ranks(moe, mesh_shape, p, x, g, B):
        assert _close(got_out, out) and abs(got_loss - loss) <= 1e-12 * abs(loss)
        assert _close(got_dx, dx)
        assert sorted(got_grads) == sorted(grads)
        for name in grads:
            assert _close(got_grads[name], grads[name]), name


def test_swiglu_experts_with_biases_match_the_reference():
    from testkit import moe_layer_on_ranks

    moe = MoEConfig(experts=E, top_k=2, capacity_factor=0.75, aux_loss_coeff=0.5, z_loss_coeff=0.25)
    p, x, g = _params(bias=True)
    out, loss, grads, dx = _reference(moe, p, x, g)
    assert "h1.moe.b3" in grads
    for got_out, _, got_grads, got_dx, _, _ in moe_layer_on_ranks(moe, (1, 2, 2), p, x, g, B):
        assert _close(got_out, out) and _close(got_dx, dx)
        assert all(_close(got_grads[name], grads[name]) for name in grads)


@pytest.mark.parametrize("dp, ep, tp, dropless", [(1, 2, 2, False), (2, 2, 1, True)])
def test_a_mixtral_shaped_moe_gpt_step_matches_one_numpy_process(dp, ep, tp, dropless):
    cfg = GPTConfig(layers=2, d_model=16, heads=4, seq=8, batch=4, ffn=24, dropout=0.1,
                    moe=MoEConfig(experts=4, top_k=2, every=1, dropless=dropless), **MIXTRAL)
    names = {s.name for s in param_specs(cfg)}
    assert {"h0.moe.w3", "h1.moe.w3"} <= names and not any(".b" in n for n in names)
    steps = spmdsim.simulate(dp * ep * tp, lambda: train(cfg, spmdsim.world(), dp, tp, 1, TEXT, ep=ep)[1])[0]
    assert steps[0].passed and max(steps[0].errors) <= TOLERANCE, steps


def test_the_experts_parameters_follow_mlp_and_bias_and_their_layouts_are_megatrons():
    from spmdsim.models.gpt.layouts import megatron_layouts

    moe = MoEConfig(experts=4, top_k=2, every=1)
    shapes = {s.name: s.shape for s in param_specs(GPTConfig(layers=1, d_model=8, heads=2, ffn=12, moe=moe,
                                                             **MIXTRAL)) if ".moe." in s.name}
    assert shapes == {"h0.moe.router": (8, 4), "h0.moe.w1": (4, 8, 12), "h0.moe.w3": (4, 8, 12),
                      "h0.moe.w2": (4, 12, 8)}
    cfg = GPTConfig(layers=1, d_model=8, heads=2, ffn=12, moe=moe, mlp="swiglu")
    names = [s.name for s in param_specs(cfg) if ".moe." in s.name]
    assert names == ["h0.moe.router", "h0.moe.w1", "h0.moe.b1", "h0.moe.w3", "h0.moe.b3", "h0.moe.w2", "h0.moe.b2"]
    layouts = megatron_layouts(cfg, spmdsim.Layout((1, 2, 2), ("dp", "ep", "tp")))
    assert layouts["h0.moe.w3"].tensor_map == layouts["h0.moe.w1"].tensor_map == (("ep",), (), ("tp",))
    assert layouts["h0.moe.b3"].tensor_map == layouts["h0.moe.b1"].tensor_map == (("ep",), ("tp",))


def test_the_closed_count_is_the_parameter_lists_and_mixtral_8x7bs_published_total():
    import itertools

    for mlp, bias, every, norm, kv in itertools.product(("gelu", "swiglu"), (True, False), (1, 2), ("layer", "rms"),
                                                         (None, 2)):
        cfg = GPTConfig(layers=3, d_model=16, heads=4, vocab=30, ffn=24, mlp=mlp, bias=bias, norm=norm, kv_heads=kv,
                        moe=MoEConfig(experts=4, top_k=2, every=every, hidden=20 if every == 2 else 0))
        assert cfg.parameters == sum(math.prod(s.shape) for s in param_specs(cfg)), cfg
    mixtral = GPTConfig(moe=MoEConfig(experts=8, top_k=2, every=1), **MIXTRAL_8X7B)
    assert mixtral.parameters == 46_702_792_704  # "46.7B" (Mistral AI); "47B" (Jiang et al. 2024)
    idle = 32 * 6 * 3 * 4096 * 14336  # each token's 6 experts of 8 it is not routed to, in each layer
    assert mixtral.parameters - idle == 12_879_925_248  # active: "12.9B" (Mistral AI); "13B" (the paper)


def test_the_dry_run_of_a_mixtral_8x7b_shaped_model_holds_its_closed_count():
    """One stage of 8 ep ranks: each holds the dense part whole and one expert of each layer."""
    from spmdsim.tools.estimate.ledger import gpt_ledger

    cfg = GPTConfig(seq=16, batch=8, moe=MoEConfig(experts=8, top_k=2, every=1), **MIXTRAL_8X7B)
    stage, = gpt_ledger(cfg, 1, 1, 1, ep=8)  # the sequence changes no parameter (RoPE)
    assert stage.expert_params == 32 * 3 * 4096 * 14336  # one SwiGLU expert a layer, no biases
    assert stage.params - stage.expert_params + 8 * stage.expert_params == cfg.parameters == 46_702_792_704


def test_the_memory_pre_check_counts_swiglu_experts_and_grouped_query_attention_in_an_moe_layer():
    """spmdsim.models.gpt.memory.step_need, a lower bound of a rank's peak: an MoE layer's weights are its attention's
    (Q and the projection d^2 each, K and V d x kv_heads x head_dim) and its local experts' 3 SwiGLU matrices.
    Before, it counted 4 d^2 of attention (more than a grouped-query layer holds: no longer a lower bound) and 2
    matrices an expert."""
    from spmdsim.models.gpt.memory import step_need

    d, kvd, f, v = 256, 2 * 64, 64, 128
    cfg = GPTConfig(layers=2, d_model=d, heads=4, seq=8, batch=2, vocab=v, ffn=f, dropout=0.0,
                    moe=MoEConfig(experts=4, top_k=2, every=1), **MIXTRAL)
    end = step_need(cfg, 1, 1, ep=2)  # fp64: parameters, gradients and AdamW's two moments, 8 bytes each
    weights = 2 * (2 * d * d + 2 * d * kvd + 2 * 3 * d * f) + 2 * v * d  # 2 local experts a layer; head untied
    assert (end.moment, end.nbytes) == ("at the step's end", weights * 8 * 4)


@pytest.mark.parametrize("dropless", [False, True])
def test_a_replayed_step_with_swiglu_experts_equals_the_eager_one_bit_for_bit(dropless):
    """The experts' kernels (spmdsim.runtime.replay) hand a SwiGLU expert's fc3 output and gradients back through
    their `out` arrays: steps 1-2 replayed equal the eager ones (parameters, gradients, losses, bytes)."""
    cfg = GPTConfig(layers=2, d_model=16, heads=4, seq=8, batch=4, ffn=24, dropout=0.1,
                    moe=MoEConfig(experts=4, top_k=2, every=1, dropless=dropless), **MIXTRAL)

    def both():
        runs = [train(cfg, spmdsim.world(), 1, 2, 3, TEXT, ep=2, replay=replay) for replay in (False, True)]
        (eager_model, eager), (model, replayed) = runs
        same = all(a.local.tobytes() == b.local.tobytes() and a.grad.local.tobytes() == b.grad.local.tobytes()
                   for a, b in zip(model.params.values(), eager_model.params.values()))
        return eager, replayed, same

    for eager, replayed, same in spmdsim.simulate(4, both):
        assert same
        assert [(r.loss, r.bytes_sent) for r in replayed] == [(r.loss, r.bytes_sent) for r in eager]
        assert all(r.passed for r in replayed), replayed
