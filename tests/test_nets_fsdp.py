"""The seed networks under ZeRO-3 (spmdsim.models.nets.sharded): OneFlow's 2D SBP models with every parameter
fully sharded over the axis that splits the batch, each step checked against one process, every gather and
Reduce_scatter (one each a stage) read from the trace and priced by its stage's parameters."""
from __future__ import annotations

import numpy as np
import pytest

import spmdsim
from spmdsim.errors import SpmdsimError
from spmdsim.models.nets import seeds
from spmdsim.models.nets.reference import ReferenceTrainer
from spmdsim.models.nets.sharded import data_axis, zero_problem
from spmdsim.models.nets.train import NetworkTrainer

STEPS = 3


def _train(name: str, zero: int, ranks: int = 4):
    def body():
        comm = spmdsim.world()
        net = getattr(seeds, name)(comm.size, dtype="float64")
        x = net.source.full()
        labels = np.random.default_rng(1).integers(0, net.out_shape[-1], int(np.prod(net.out_shape[:-1])))
        trainer, reference = NetworkTrainer(net, comm, lr=0.1, zero=zero), ReferenceTrainer(net, lr=0.1)
        losses, verdicts = [], []
        for _ in range(STEPS):
            result = trainer.step(x, labels, anchor=True)
            verdicts += trainer.check(result, reference.step(x, labels, anchor=result.anchor), 1e-12)
            losses.append(result.value)
        shapes = [p.local.shape for p in trainer.flat_params]
        trainer.close()
        return net, losses, [v for v in verdicts if not v], result.traces, shapes

    return spmdsim.simulate(ranks, body)


@pytest.mark.parametrize("name", ["oneflow_2d_sbp", "oneflow_2d_signature"])
def test_zero3_trains_oneflow_with_each_stage_gathered_and_reduce_scattered(name):
    sharded, plain = _train(name, 3), _train(name, 0)
    net = sharded[0][0]
    axis = data_axis(net)
    n = net.input_layout.layout.axis_size(axis)
    params = [p for stage in net.stages for p in stage.params]
    whole = [p.layout.local_shape(p.source.shape) for p in params]  # a rank's block, gathered over the axis
    # one Allgather and one Reduce_scatter for each stage with parameters (a unit: spmdsim.nn.fsdp_flat)
    units = [[p.layout.local_shape(p.source.shape) for p in stage.params] for stage in net.stages if stage.params]
    for (_, losses, failed, traces, shapes), (_, unsharded, _, _, _) in zip(sharded, plain):
        assert not failed, failed  # loss, gradients and updated parameters of every step vs one process
        np.testing.assert_allclose(losses, unsharded, rtol=1e-13)  # the same training as without ZeRO
        assert shapes == [(w[0] // n,) + w[1:] for w in whole]  # 1/n of each block held
        bytes_ = sorted(sum(int(np.prod(w)) * 8 * (n - 1) // n for w in unit) for unit in units)
        for phase, op, key in (("forward", "allgather", "bytes_received"), ("backward", "allgather", "bytes_received"),
                               ("backward", "reduce_scatter", "bytes_sent")):
            calls = [getattr(e, key) for e in traces[phase].entries if e.op == op and e.axes == (axis,)]
            assert sorted(calls) == bytes_, (phase, op, calls)  # one call a stage, (n-1)/n of its blocks
        assert not any(e.op == "allreduce" for e in traces["backward"].entries)  # no whole gradient summed


def test_zero3_says_which_network_cannot_shard_and_why():
    assert zero_problem(seeds.paddle_tp(4)) == (
        "net_paddle_tp's input is replicated over every rank: no axis splits its batch for --zero 3 to shard "
        "its parameters over")
    assert zero_problem(seeds.oneflow_2d_sbp(8)) == (
        "net_oneflow_2d_sbp: parameter 'Linear2.b' dim 0 of size 2 is not divisible by 4 shards (axes "
        "('axis_1',)); the network's layouts cut every dim evenly, as its dialect does, so --zero 3 shards dim 0 "
        "evenly too")
    assert zero_problem(seeds.oneflow_2d_sbp(4)) is None


@pytest.mark.parametrize("kwargs, said", [
    ({"zero": 2}, "zero 2 must be 0 or 3 (fully sharded)"),
    ({"zero": 3, "bucket": True}, "bucket sums whole gradients in one Allreduce; with zero 3 each gradient is "
                                  "reduce-scattered onto its shard: give one of them"),
])
def test_the_trainer_refuses_what_zero3_cannot_do(kwargs, said):
    def body():
        with pytest.raises(SpmdsimError) as refused:
            NetworkTrainer(seeds.oneflow_2d_sbp(2, dtype="float64"), spmdsim.world(), **kwargs)
        return str(refused.value)

    assert spmdsim.simulate(2, body) == [said, said]
