"""Seed networks trained on MPI and simulated ranks, every step checked against the single-process trainer."""
from __future__ import annotations

import engines
import numpy as np
import pytest

from spmdsim.models.nets import mindspore_layout, mindspore_tutorial, needs_eight
from spmdsim.models.nets.digits import load_digits
from spmdsim.models.nets.reference import ReferenceTrainer

pytestmark = pytest.mark.mpi(min_size=2)


def _comm():
    return engines.world()  # MPI.COMM_WORLD, or the simulated rank's (tests/engines.py)


def _train(net, steps, optimizer="sgd", lr=1e-2, data=None, explain=None):
    from spmdsim.models.nets.train import NetworkTrainer

    trainer = NetworkTrainer(net, _comm(), optimizer=optimizer, lr=lr)
    reference = ReferenceTrainer(net, optimizer=optimizer, lr=lr)
    results = []
    try:
        for step in range(steps):
            x, labels = data.batch(step, net.source.shape[0])
            result = trainer.step(x, labels, explain if step == 0 else None, anchor=True)
            for verdict in trainer.check(result, reference.step(x, labels, anchor=result.anchor), 1e-12):
                assert verdict.passed, verdict
            results.append(result)
    finally:
        trainer.close()
    return results


@pytest.mark.parametrize("build, optimizer", [(mindspore_tutorial, "sgd"), (mindspore_layout, "adam")],
                         ids=["tutorial-sgd", "layout-adam"])
def test_mindspore_networks_train_like_one_process(build, optimizer):
    if needs_eight(_comm().size):
        pytest.skip(needs_eight(_comm().size))
    net = build(8, dtype="float64")
    explain = []
    steps = 1 if optimizer == "sgd" else 2  # Adam's second step uses its moments
    results = _train(net, steps, optimizer, 1e-2 if optimizer == "sgd" else 1e-3, load_digits(synthetic=True),
                     explain)
    counts = {phase: trace.counts() for phase, trace in results[-1].traces.items()}
    assert counts["optimizer"] == {}  # each rank updates its own shards
    if build is mindspore_tutorial:
        # The forward's Allreduce(k)s are answered by nothing, its Alltoallv by the inverse
        # Alltoallv, its two local slices by Allgathers (the images need no gradient, so the
        # Alltoall into MatMul1 has no answer), plus the data-parallel Allreduces of MatMul1's
        # and MatMul3's weight gradients.
        assert counts["backward"] == {"allreduce": 2, "allgather": 2, "alltoallv": 1}, counts
        answered = [step for step, entries in explain for e in entries if e.group_size > 1]
        assert [a.split()[:2] for a in answered] == [["->", "ReLU2"], ["->", "MatMul2"], ["->", "ReLU1"],
                                                     ["leaf", "(512,"], ["leaf", "(784,"]], answered


class _Fixed:
    """The network's own seeded input and seeded labels, the same batch every step."""

    def __init__(self, net, seed=0):
        self.x = net.source.full()
        rows = int(np.prod(net.stages[-1].out_shape[:-1]))
        self.labels = np.random.default_rng(seed).integers(0, net.stages[-1].out_shape[-1], rows)

    def batch(self, step, size):
        return self.x, self.labels


@pytest.mark.parametrize("name", ["paddle_tp", "oneflow_2d_sbp", "oneflow_2d_signature"])
def test_seed_networks_train_like_one_process(name):
    from spmdsim.models.nets import seeds

    size = _comm().size
    reason = seeds.paddle_needs(size) if name == "paddle_tp" else seeds.oneflow_needs(size)
    if reason:
        pytest.skip(reason)
    net = getattr(seeds, name)(size, dtype="float64")
    results = _train(net, 2, "sgd", 0.1, _Fixed(net))
    assert results[-1].value < results[0].value
