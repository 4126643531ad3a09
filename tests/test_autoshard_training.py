"""autoshard --training: the predicted backward bytes equal NetworkTrainer's measured ones."""
from __future__ import annotations

import spmdsim
from spmdsim.autoshard import autoshard
from spmdsim.autoshard.backward import replay
from spmdsim.autoshard.execute import to_network


def _measured_backward(net) -> int:
    """Bytes the busiest of 8 simulated ranks receives in one training step's backward."""
    from spmdsim.nets.digits import load_digits
    from spmdsim.nets.train import NetworkTrainer

    x, labels = load_digits(synthetic=True).batch(0, 32)

    def body() -> int:
        trainer = NetworkTrainer(net, spmdsim.world())
        step = trainer.step(x, labels)
        trainer.close()
        return sum(e.bytes_received for e in step.traces["backward"].entries if e.group_size > 1)

    return max(spmdsim.simulate(8, body))


def test_training_prediction_equals_measured_backward():
    from spmdsim.nets import mindspore_tutorial

    result = autoshard("net_mindspore_tutorial", 8, fix={"MatMul1": "((2, 4), (4, 1))"},
                       flops_per_s=1e9, training=True)
    assert result.hand_written_backward_bytes_per_rank == _measured_backward(mindspore_tutorial(8))
    assert result.backward_bytes_per_rank == _measured_backward(to_network(result)) > 0
    # the hand-written backward: MatMul1's dW Allreduce over m, then the hops' reverse moves
    assert [op.weight_bytes for op in result.hand_backward][2] == 784 // 4 * 512 * 4 * 2 * (2 - 1) // 2


def test_training_objective_charges_data_parallel_gradients():
    plain = autoshard("net_mindspore_tutorial", 8, flops_per_s=1e9)
    assert plain.total_bytes_per_rank == 0 and plain.backward == ()
    dp = [op.candidate for op in plain.ops]  # pure data parallelism: free forward, not free training
    weights = sum(op.weight_bytes for op in replay(plain.graph, dp))
    assert weights == sum(2 * 7 * 4 * n // 8 for n in (784 * 512, 512 * 512, 512 * 10))
    trained = autoshard("net_mindspore_tutorial", 8, flops_per_s=1e9, training=True)
    assert trained.outcome.value == trained.total_bytes_per_rank + trained.backward_bytes_per_rank
    assert trained.outcome.value < weights
