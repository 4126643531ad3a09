"""The GPT's training check updates on the run's own inputs: a gradient's rounding cannot fail it, a wrong
update does (spmdsim.models.gpt.buckets.anchored_updates; docs/reference/operators.md).

AdamW's first step is lr x g / (|g| + eps): where a gradient has cancelled to near its rounding, a reference
updating with its own gradients moves that parameter by up to 2 lr from the run's. Checked against AdamW
of the run's own block, moments and gradient, the update is compared on its very inputs.
"""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.train import TOLERANCE, train
from spmdsim.nn.optim import AdamW, DistributedAdamW

CFG = GPTConfig(layers=2, d_model=64, heads=4, seq=32, batch=8, dropout=0.1)


def _errors(monkeypatch, moved: float = 0.0, lr_error: float = 0.0, steps: int = 2, zero: int = 0) -> list:
    """Each step's (loss, gradients, parameters) differences on 8 simulated ranks (dp 2 x tp 4, sp; `zero` 1:
    ZeRO-1), the run's gradients moved by `moved` x each block's largest entry before its update (alike on
    every replica: another machine's rounding), or its optimizer's learning rate off by `lr_error` (relative)."""
    optimizer = DistributedAdamW if zero else AdamW
    step = optimizer.step

    def moved_step(self):
        rng = np.random.default_rng(self.steps)
        for p in self.params:
            if p.grad is not None:
                p.grad._local += moved * np.abs(p.grad._local).max() * rng.standard_normal(p.global_shape)[p.slices]
        self.lr *= 1 + lr_error
        try:
            step(self)
        finally:
            self.lr /= 1 + lr_error

    monkeypatch.setattr(optimizer, "step", moved_step)
    ids = encode(load_text())
    runs = spmdsim.simulate(8, lambda: [r.errors for r in train(CFG, spmdsim.world(), 2, 4, steps, ids, sp=True,
                                                                 zero=zero)[1]])
    return runs[0]


@pytest.mark.parametrize("zero", [0, 1], ids=["adamw", "zero1"])
def test_a_gradients_rounding_moves_no_checked_update(monkeypatch, zero):
    # 1e-15 of each block's largest gradient (the gradients' own check measures ~1e-15 between orders of
    # summation): with the reference's own gradients step 0's parameters differed by 4.7e-11 of their
    # largest entry (tolerance 1e-10); on the run's own inputs they are its update, bit for bit.
    for loss, grads, params in _errors(monkeypatch, moved=1e-15, zero=zero):
        assert loss <= TOLERANCE and grads <= TOLERANCE, (loss, grads)
        assert params == 0.0, params


@pytest.mark.parametrize("zero", [0, 1], ids=["adamw", "zero1"])
def test_a_wrong_update_fails_the_parameters(monkeypatch, zero):
    # A learning rate off by 1e-5 moves each parameter by 1e-5 of its step: a bias that starts at zero is its
    # step, so 1e-5 of its largest entry (measured 1e-5, then 5e-6), far above 1e-10; the loss and gradients of
    # step 0 are the reference's.
    errors = _errors(monkeypatch, lr_error=1e-5, zero=zero)
    assert errors[0][0] <= TOLERANCE and errors[0][1] <= TOLERANCE, errors
    assert all(params > TOLERANCE for _, _, params in errors), errors
