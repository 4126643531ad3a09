"""AdamW over flat buffers (every parameter with a gradient at one step) is the per-parameter AdamW, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim import Layout
from spmdsim.nn import adamw_flat
from spmdsim.nn.optim import AdamW, adamw_update

SHAPES = [(8, 4), (4,), (4, 8), (8,)]
MAPS = [("dp", "tp"), (None,), (None, "tp"), ("tp",)]


def _run(skips: dict, bucketed: tuple = ()) -> list:
    """Four steps of AdamW on four parameters (two decaying); `skips`: step -> the parameters without a
    gradient at that step; `bucketed`: the steps whose gradients are views of one buffer, lying end to end
    in the reverse of the parameters' order (a gradient bucket's summed buffer)."""
    from spmdsim import DTensor, Mesh

    mesh = Mesh(Layout((2, 2), ("dp", "tp")), spmdsim.world())
    rng = np.random.default_rng(0)
    params = [DTensor.from_global(mesh, rng.standard_normal(s), mesh.layout(*m)).requires_grad_()
              for s, m in zip(SHAPES, MAPS)]
    opt = AdamW(params, lr=0.01, weight_decay=0.1)
    blocks = [p.local.copy() for p in params]
    moments = [(np.zeros_like(b), np.zeros_like(b), 0) for b in blocks]
    fused = []
    for step in range(4):
        opt.zero_grad()
        grads = [rng.standard_normal(p.global_shape) for p in params]
        for i, (p, g) in enumerate(zip(params, grads)):
            if i not in skips.get(step, ()):
                p._ag.grad = DTensor.from_global(mesh, g, p.layout)
        if step in bucketed:
            _into_one_buffer(params[::-1])
        fused.append(opt._together([(i, p.local, p.grad.local) for i, p in enumerate(params)
                                    if p.grad is not None]))
        opt.step()
        for i, p in enumerate(params):  # the per-parameter formula on copies
            if p.grad is None:
                continue
            m, v, t = moments[i]
            adamw_update(blocks[i], p.grad.local, m, v, t + 1, lr=0.01, betas=(0.9, 0.999), eps=1e-8,
                         weight_decay=0.1 if len(SHAPES[i]) >= 2 else 0.0)
            moments[i] = (m, v, t + 1)
    same = all(np.array_equal(p.local, b) for p, b in zip(params, blocks))
    same_moments = all(np.array_equal(opt.state[i][1], moments[i][0]) and np.array_equal(opt.state[i][2], moments[i][1])
                       and opt.state[i][0] == moments[i][2] for i in range(len(params)))
    return [same, same_moments, fused, opt._flat[1][0]]


def _into_one_buffer(params: list) -> None:
    """The parameters' gradients moved into one buffer, end to end in this order (their values kept)."""
    from spmdsim import DTensor

    blocks = [p.grad.local for p in params]
    flat = np.concatenate([b.reshape(-1) for b in blocks])
    at = 0
    for p, b in zip(params, blocks):
        p._ag.grad = DTensor._trusted(p.mesh, flat[at:at + b.size].reshape(b.shape), p.grad._layout, p.grad._shape)
        at += b.size


@pytest.mark.parametrize("group", [1 << 16, 13, 1])
def test_flat_adamw_is_the_per_parameter_one_bit_for_bit(group, monkeypatch):
    """Whatever the groups the flat update takes its parameters in (adamw_flat._GROUP_ELEMENTS; a rank's blocks
    have 8, 4, 16 and 4 elements: at 13 the first two go together, the third alone as larger than a group)."""
    monkeypatch.setattr(adamw_flat, "_GROUP_ELEMENTS", group)
    for same, same_moments, fused, _ in spmdsim.simulate(4, lambda: _run({})):
        assert same and same_moments
        assert fused == [True] * 4


def test_a_parameter_without_a_gradient_steps_the_others_one_by_one_and_its_count_stays():
    """Step 1 leaves parameter 1 out: that step and the next (parameter 1 one step behind) go one by one,
    each parameter counting its own steps, the values still the per-parameter formula's."""
    for same, same_moments, fused, _ in spmdsim.simulate(4, lambda: _run({1: (1,)})):
        assert same and same_moments
        assert fused == [True, True, False, False]


def test_parameters_that_meet_again_at_one_step_go_together_from_their_moments_now():
    """Parameter 1 alone, then the others alone, then all four at one step again: the flat buffers are made
    anew from the moments as they are (not those of the first time the four went together)."""
    for same, same_moments, fused, _ in spmdsim.simulate(4, lambda: _run({1: (0, 2, 3), 2: (1,)})):
        assert same and same_moments
        assert fused == [True, False, True, True]


@pytest.mark.parametrize("group", [1 << 16, 13])
def test_gradients_lying_end_to_end_are_read_where_they_lie(group, monkeypatch):
    """Gradients in one buffer (a bucket's, in the backward's order: the reverse of the parameters'): the flat
    update lays its buffers out in that order and reads them in place, never gathering them into its own
    buffer (left zero); a step whose gradients lie apart gathers each group's into that buffer, which is
    one group's size at most; the values bit for bit the per-parameter formula's either way."""
    monkeypatch.setattr(adamw_flat, "_GROUP_ELEMENTS", group)
    for same, same_moments, fused, gathered in spmdsim.simulate(4, lambda: _run({}, bucketed=(0, 1, 2, 3))):
        assert same and same_moments and fused == [True] * 4
        assert not gathered.any()
    for same, same_moments, fused, gathered in spmdsim.simulate(4, lambda: _run({}, bucketed=(0, 2))):
        assert same and same_moments and fused == [True] * 4
        assert gathered.any()
        assert gathered.size == min(32, group)  # one group's at most (a rank's blocks: 8 + 4 + 16 + 4 elements)
