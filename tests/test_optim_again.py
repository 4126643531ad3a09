"""An optimizer's step remembers what it checked (each gradient's layout, which parameters have one, AdamW's
parameters known to be at one step) and takes a step like the last without Python per parameter: whatever
changes between steps is still seen. Each case pits an optimizer that has stepped (its memory warm) against one
made afresh from the same state, which remembers nothing: the same values, bit for bit, or the same refusal.

Four simulated ranks, dp 2 x tp 2, three small parameters: a few hundredths of a second each.
"""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import DTensor, Layout, Mesh, OperatorError
from spmdsim.nn.optim import SGD, AdamW

SHAPES = [(4, 6), (6,), (4,)]
MAPS = [("tp", None), (None,), ("tp",)]


def _made(mesh: Mesh, kind: str = "adamw") -> tuple:
    params = [DTensor.from_global(mesh, np.random.default_rng(k).standard_normal(shape), mesh.layout(*dims))
              .requires_grad_() for k, (shape, dims) in enumerate(zip(SHAPES, MAPS))]
    opt = AdamW(params, lr=0.05, weight_decay=0.1) if kind == "adamw" else SGD(params, lr=0.05, momentum=0.9)
    return params, opt


def _grads(params: list, s: int, skip: tuple = ()) -> None:
    """Step `s`'s gradients (new DTensors in the parameters' layouts), none for the parameters in `skip`."""
    for k, p in enumerate(params):
        p._ag.grad = None if k in skip else DTensor.from_global(
            p.mesh, np.random.default_rng(50 + 10 * s + k).standard_normal(p.global_shape), p.layout)


def _steps(params: list, opt, steps, skips: dict = None) -> list:
    for s in steps:
        opt.zero_grad()
        _grads(params, s, (skips or {}).get(s, ()))
        opt.step()
    return [p.local.copy() for p in params]


def _warm_and_fresh(change, kind: str = "adamw", skips: dict = None) -> list:
    """Per rank: whether the warm optimizer's parameters equal a fresh one's, and parameter 1's step count, after
    two steps, `change(params, opt, state_dict)` on the warm one (its state loaded into the fresh one), and two
    more steps each (`skips`: step -> the parameters without a gradient)."""
    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        params, opt = _made(mesh, kind)
        _steps(params, opt, range(2))
        sd = opt.state_dict()
        change(params, opt, sd)
        saved, sd = [p.local.copy() for p in params], opt.state_dict()
        warm = _steps(params, opt, range(2, 4), skips)
        params, fresh_opt = _made(mesh, kind)
        for p, block in zip(params, saved):
            p.local[...] = block
        fresh_opt.load_state_dict(sd)
        fresh = _steps(params, fresh_opt, range(2, 4), skips)
        return all(np.array_equal(a, b) for a, b in zip(warm, fresh)), opt.state_dict()["state"][1].get("step")

    return spmdsim.simulate(4, body)


def test_a_state_loaded_with_parameters_at_other_steps_is_stepped_one_by_one():
    """AdamW knew its three parameters at one step (they stepped together twice); a state loaded with parameter
    0 at step 5 and parameter 2 at step 1: the next steps take each one's own bias correction, as an optimizer
    made afresh from that state does (was the flat update at one step for all had it trusted what it knew)."""
    def change(params, opt, sd):
        sd["state"][0]["step"], sd["state"][2]["step"] = 5, 1
        opt.load_state_dict(sd)

    assert _warm_and_fresh(change) == [(True, 4)] * 4


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
@pytest.mark.parametrize("skip", [(1,), (1, 2)])
def test_a_parameter_that_loses_and_regains_its_gradient(kind, skip):
    """Step 2 leaves parameters `skip` without a gradient (they keep their values and step counts; with (1, 2)
    parameter 0 steps alone), step 3 gives them one back, one step behind the others: the warm optimizer's
    values are the fresh one's (AdamW: not the flat update at one step, had it trusted what it knew)."""
    result = _warm_and_fresh(lambda params, opt, sd: None, kind, {2: skip})
    assert [same for same, _ in result] == [True] * 4
    if kind == "adamw":
        assert [t for _, t in result] == [3] * 4


def test_a_gradient_laid_out_otherwise_after_steps_like_it_is_refused_in_one_line():
    """Two steps with gradients laid out as their parameters, then parameter 2's gradient (split over tp) laid out
    split over dp, a block of the same shape: refused, the one line naming both layouts, nothing stepped."""
    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        params, opt = _made(mesh)
        _steps(params, opt, range(2))
        _grads(params, 2)
        params[2]._ag.grad = DTensor.from_global(mesh, np.ones(4), mesh.layout("dp"))
        before = [p.local.copy() for p in params]
        with pytest.raises(OperatorError) as e:
            opt.step()
        return str(e.value), all(np.array_equal(a, p.local) for a, p in zip(before, params))

    for message, unchanged in spmdsim.simulate(4, body):
        assert message.startswith("parameter 2: gradient laid out ") and "does not match" in message
        assert "\n" not in message and unchanged


def test_bfloat16_moments_loaded_as_float32_are_what_the_next_flat_step_reads():
    """bfloat16 parameters with bfloat16 gradients step together over bfloat16 flat buffers; a state whose moments
    are float32 (allowed: bf16-mixed's) is not copied into those buffers but kept as loaded: the buffers are made
    again from it (were left as they were: the loaded moments, halved here, went unread)."""
    pytest.importorskip("ml_dtypes")
    from spmdsim.base.precision import bfloat16

    def grads(params, s):
        for k, p in enumerate(params):
            p._ag.grad = DTensor._trusted(p.mesh, np.random.default_rng(10 * s + k).standard_normal(p.local.shape)
                                          .astype(p.local.dtype), p.layout, p.global_shape)

    def run():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        bf16 = bfloat16()

        def made():
            params = [DTensor.from_global(mesh, np.random.default_rng(k).standard_normal(shape).astype(bf16),
                                          mesh.layout(*dims)).requires_grad_()
                      for k, (shape, dims) in enumerate(zip(SHAPES, MAPS))]
            return params, AdamW(params, lr=0.05, weight_decay=0.1)

        params, opt = made()
        for s in range(2):
            grads(params, s)
            opt.step()
        sd = opt.state_dict()
        for entry in sd["state"].values():
            entry["exp_avg"] = entry["exp_avg"].astype(np.float32) * 0.5
            entry["exp_avg_sq"] = entry["exp_avg_sq"].astype(np.float32) * 0.5
        saved = [p.local.copy() for p in params]
        opt.load_state_dict(sd)
        grads(params, 2)
        opt.step()
        fresh_params, fresh = made()
        for p, block in zip(fresh_params, saved):
            p.local[...] = block
        fresh.load_state_dict(sd)
        grads(fresh_params, 2)
        fresh.step()
        return all(np.array_equal(a.local.view(np.uint16), b.local.view(np.uint16))
                   for a, b in zip(params, fresh_params))

    assert spmdsim.simulate(4, run) == [True] * 4


def test_zero_refuses_a_gradient_after_steps_like_the_last():
    """DistributedAdamW (ZeRO-1) steps twice with gradients pending over dp; then a gradient already summed (not
    pending: it would be summed again), then one missing: each refused in its one line, as at a first step."""
    from spmdsim.nn.autograd.graph import with_partial
    from spmdsim.nn.optim import DistributedAdamW

    def body():
        mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
        params, _ = _made(mesh)
        opt = DistributedAdamW(params, mesh, lr=0.05)

        def pending(s, k):
            p = params[k]
            block = np.random.default_rng(10 * s + k).standard_normal(p.local.shape)
            return DTensor._trusted(mesh, block, with_partial(p.layout, ("dp",)), p.global_shape)

        for s in range(2):
            for k, p in enumerate(params):
                p._ag.grad = pending(s, k)
            opt.step()
        messages = []
        for change in ("summed", "missing"):
            for k, p in enumerate(params):
                p._ag.grad = pending(2, k)
            g = params[1]._ag.grad
            params[1]._ag.grad = None if change == "missing" else DTensor._trusted(mesh, g.local, params[1].layout,
                                                                                    g.global_shape)
            with pytest.raises(OperatorError) as e:
                opt.step()
            messages.append(str(e.value))
        return messages

    for summed, missing in spmdsim.simulate(4, body):
        assert summed.startswith("DistributedAdamW: parameter 1's gradient (") and "is not pending over" in summed
        assert missing.startswith("DistributedAdamW: parameter 1 has no gradient")
