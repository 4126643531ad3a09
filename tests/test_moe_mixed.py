"""The MoE layer under the low-precision policies (spmdsim.models.moe.layer, spmdsim.models.moe.mixed;
docs/howto/experts-memory.md, "bf16"): the layer on simulated ranks against its one-process reference, element by
element, and the MoE GPT's bf16-mixed and fp32 steps checked as the dense GPT's (spmdsim.models.gpt.mixed's
tolerances)."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.moe import MoEConfig

pytest.importorskip("ml_dtypes")

TEXT = encode(load_text(20_000))
D, T, B = 16, 8, 4


def _inputs(moe, act, mixtral=False):
    """The layer's parameters and inputs; `mixtral`: SwiGLU experts (w3 beside w1) without biases."""
    rng = np.random.default_rng(3)
    E, F = moe.experts, 2 * D
    p = {"h1.moe.router": rng.standard_normal((D, E)), "h1.moe.w1": rng.standard_normal((E, D, F)) * 0.3,
         "h1.moe.b1": rng.standard_normal((E, F)) * 0.1, "h1.moe.w2": rng.standard_normal((E, F, D)) * 0.3,
         "h1.moe.b2": rng.standard_normal((E, D)) * 0.1}
    if mixtral:
        p = {n: v for n, v in p.items() if ".moe.b" not in n}
        p["h1.moe.w3"] = rng.standard_normal((E, D, F)) * 0.3
    p = {n: v.astype(act) for n, v in p.items()}
    return p, rng.standard_normal((B * T, D)).astype(act), rng.standard_normal((B * T, D)).astype(act)


def _layer_on_ranks(moe, mesh_shape, act, mixtral=False):
    """Each rank: (output, d x, the parameters' gradients), whole, of sum(y * g) + router losses (testkit's)."""
    from testkit import moe_layer_on_ranks

    p, x, g = _inputs(moe, act, mixtral)
    return p, x, g, [(out, dx, grads) for out, _, grads, dx, _, _ in moe_layer_on_ranks(moe, mesh_shape, p, x, g, B)]


def _reference(moe, p, x, g, act):
    from spmdsim.models.gpt.mixed import _Rounder
    from spmdsim.models.moe.mixed import moe_backward_mixed, moe_forward_mixed
    from spmdsim.base.precision import wide

    r = _Rounder(act, GPTConfig(layers=2, d_model=D, heads=2, seq=T, batch=B, dropout=0.0), None)
    out, cache = moe_forward_mixed(p, "h1.", x, B, moe, r)
    grads: dict = {}
    dx = moe_backward_mixed(p, "h1.", wide(g), cache, moe, r, grads)
    return out, dx, grads


def _differing(a, b, act):
    """The share of entries that differ once both are rounded to `act` (the ranks sum some float32 sums in
    another order, so a rounding may fall to the other neighbour: a few in a thousand; a rounding point
    moved, or a wrong factor, changes most)."""
    a, b = np.asarray(a).astype(act).astype(np.float64), np.asarray(b).astype(act).astype(np.float64)
    return float(np.mean(a != b))


@pytest.mark.parametrize("mesh_shape", [(1, 2, 2), (2, 2, 1)])
@pytest.mark.parametrize("dropless", [False, True])
@pytest.mark.parametrize("mixtral", [False, True], ids=["gelu", "swiglu-no-bias"])
def test_the_layer_under_bf16_rounds_where_its_reference_rounds(mesh_shape, dropless, mixtral):
    """Mixtral's experts (SwiGLU, no biases) too: silu rounded once, times fc3's output rounded once; the gate's
    gradients each rounded once (its silu left unrounded in the reference, 35% to 72% of entries differ)."""
    from spmdsim.base.precision import bfloat16

    act = bfloat16()
    moe = MoEConfig(experts=4, top_k=2, capacity_factor=0.75, dropless=dropless, aux_loss_coeff=0.5,
                    z_loss_coeff=0.25)
    p, x, g, results = _layer_on_ranks(moe, mesh_shape, act, mixtral)
    out, dx, grads = _reference(moe, p, x, g, act)
    assert ("h1.moe.w3" in grads) == mixtral and ("h1.moe.b1" in grads) != mixtral
    for got_out, got_dx, got_grads in results:
        assert got_out.dtype == act and got_dx.dtype in (act, np.float32)
        assert _differing(got_out, out, act) <= 0.01
        assert _differing(got_dx, dx, act) <= 0.01
        for name, ref in grads.items():  # float32 (main_grad): compared rounded to bfloat16 too
            assert got_grads[name].dtype == np.float32, name
            assert _differing(got_grads[name], ref, act) <= 0.01, name


def _near_tie(top_k):
    """The layer's inputs with a near-tie at every token: expert 1's router weights are expert 0's with two
    entries swapped, and every token's two features there are equal, so the two scores are equal but summed in
    two orders (the others' -w; with top-2 expert 7's 2w comes first)."""
    rng = np.random.default_rng(top_k)
    E, F, N = 8, 2 * D, 16 * T
    w = rng.standard_normal(D)
    router = np.stack([w, w.copy()] + [-w] * 6, axis=1)
    router[[1, 2], 1] = router[[2, 1], 1]
    if top_k == 2:
        router[:, 7] = 2 * w
    x = rng.standard_normal((N, D))
    x[:, 2] = x[:, 1]
    x *= np.sign(x @ w)[:, None]  # experts 0 and 1 above the others
    p = {"h1.moe.router": router, "h1.moe.w1": rng.standard_normal((E, D, F)) * 0.3,
         "h1.moe.b1": rng.standard_normal((E, F)) * 0.1, "h1.moe.w2": rng.standard_normal((E, F, D)) * 0.3,
         "h1.moe.b2": rng.standard_normal((E, D)) * 0.1}
    return {n: v.astype(np.float32) for n, v in p.items()}, x.astype(np.float32), rng.standard_normal((N, D))


@pytest.mark.parametrize("top_k", [1, 2])
def test_at_a_crafted_near_tie_the_reference_routes_as_the_ranks(top_k):
    """fp32: the ranks' float32 router logits (their blocks' sums) and the reference's (whole rows') differ by a
    unit in the last place in a few percent of entries, which decided 3 to 7 of these 128 tokens' near-ties
    otherwise (each row then off by the whole of an expert's output). Following the ranks' experts where
    rounding alone can explain them (spmdsim.models.moe.routing.followed), every row agrees to rounding."""
    from spmdsim.models.gpt.mixed import _Rounder
    from spmdsim.models.moe.mixed import moe_forward_mixed
    from testkit import moe_layer_on_ranks

    moe = MoEConfig(experts=8, top_k=top_k, dropless=True)
    p, x, g = _near_tie(top_k)
    ranks = moe_layer_on_ranks(moe, (1, 4, 1), p, x, g.astype(np.float32), 16)
    chosen = np.concatenate([stats[0].chosen for _, _, _, _, stats, _ in ranks])  # ranks hold the batch in order
    r = _Rounder(np.float32, GPTConfig(layers=2, d_model=D, heads=2, seq=T, batch=16, dropout=0.0), None)
    out, cache = moe_forward_mixed(p, "h1.", x, 16, moe, r, follow=chosen)
    assert np.array_equal(cache["routing"].experts, chosen)
    assert np.max(np.abs(ranks[0][0] - out)) <= 1e-5 * np.max(np.abs(out))


# ---- the MoE GPT's steps ----

def _gpt(dropless=False, layers=2):
    moe = MoEConfig(experts=4, top_k=2, capacity_factor=1.0, dropless=dropless, aux_loss_coeff=0.5, z_loss_coeff=0.1)
    return GPTConfig(layers=layers, d_model=32, heads=2, seq=16, batch=8, dropout=0.1, moe=moe)


def _train(cfg, precision, steps=2, dry_run=False, **kwargs):
    from spmdsim.models.gpt.train import train

    def main():
        model, results = train(cfg, spmdsim.world(), 2, 2, steps, TEXT, ep=2, sp=True, precision=precision, **kwargs)
        model.mesh.close()
        return results

    return spmdsim.simulate(8, main, dry_run=dry_run)


@pytest.mark.parametrize("dropless", [False, True])
def test_moe_gpt_steps_under_bf16_and_fp32_pass_their_checks(dropless):
    cfg = _gpt(dropless)
    runs = {p: _train(cfg, p) for p in ("bf16-mixed", "fp32")}
    for precision, out in runs.items():
        for results in out:
            assert all(r.passed and all(e <= t for e, t in zip(r.errors, r.tolerances)) for r in results), \
                (precision, [r.errors for r in results])
            assert all(r.errors[2] == 0.0 for r in results)  # the update, on the run's own inputs: exact
    # the dispatch and combine carry the activations' dtype: bfloat16 rows are half float32's bytes
    for bf, f32 in zip(runs["bf16-mixed"][0][0].dispatch, runs["fp32"][0][0].dispatch):
        assert 2 * bf.send_bytes == f32.send_bytes and 2 * bf.received_bytes == f32.received_bytes


def test_a_replayed_moe_step_under_bf16_is_the_eager_one_and_zero1_is_adamw():
    cfg = _gpt()
    eager, replayed, zero = (_train(cfg, "bf16-mixed", steps=3, **kw)[0]
                             for kw in ({}, {"replay": True}, {"zero": 1}))
    assert [r.loss for r in replayed] == [r.loss for r in eager]
    assert [list(r.errors) for r in replayed] == [list(r.errors) for r in eager]
    assert all(r.passed and r.errors[2] == 0.0 for r in zero) and [r.loss for r in zero] == [r.loss for r in eager]


def test_a_dry_moe_step_under_bf16_sends_what_a_real_one_does():
    cfg = _gpt()
    real, dry = _train(cfg, "bf16-mixed", steps=1, check=False)[0][0], _train(cfg, "bf16-mixed", 1, dry_run=True)[0][0]
    assert dry.bytes_sent == real.bytes_sent and dry.calls == real.calls
    assert dry.experts.send == real.experts.send and dry.experts.sent == real.experts.sent


def test_a_pipelined_moe_step_under_bf16_with_zero1_passes():
    from spmdsim.models.gpt.pipeline import train_pipelined

    cfg = _gpt(dropless=True, layers=4)

    def main():
        run, results = train_pipelined(cfg, spmdsim.world(), 2, 2, 1, 2, TEXT, ep=2, microbatches=2,
                                       precision="bf16-mixed", zero=1)
        run.close()
        return results

    for results in spmdsim.simulate(8, main):
        assert all(r.passed and r.errors[2] == 0.0 for r in results), [r.errors for r in results]


def test_full_recomputation_of_a_pipelined_moe_step_under_bf16_is_the_plain_step():
    """Each block recomputed in the backward (its MoE layer routing and exchanging its tokens again, its router
    losses' gradient scaled by the microbatch's 1/m as the forward's) gives the plain step's losses and errors, bit
    for bit, over 2 stages of 2 microbatches, dropless, under bf16-mixed."""
    from spmdsim.models.gpt.pipeline import train_pipelined

    cfg = _gpt(dropless=True, layers=4)

    def main(recompute):
        run, results = train_pipelined(cfg, spmdsim.world(), 2, 1, 2, 2, TEXT, ep=2, microbatches=2, sp=True,
                                       precision="bf16-mixed", recompute=recompute)
        run.close()
        return [(r.loss, r.passed, tuple(r.errors)) for r in results]

    plain, full = (spmdsim.simulate(8, lambda: main(recompute)) for recompute in ("none", "full"))
    assert plain == full and all(passed for rank in full for _, passed, _ in rank)
