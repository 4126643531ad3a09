"""autoshard --training: the predicted backward bytes equal NetworkTrainer's measured ones."""
from __future__ import annotations

import json
from pathlib import Path

import spmdsim
from spmdsim.tools.autoshard import autoshard
from spmdsim.tools.autoshard.backward import replay
from spmdsim.tools.autoshard.runnable import to_network
from spmdsim.tools.cli.main import main

DOCS = Path(__file__).resolve().parents[1] / "docs" / "howto" / "autoshard.md"


def _measured_backward(net) -> int:
    """Bytes the busiest of 8 simulated ranks receives in one training step's backward."""
    from spmdsim.nn import ops
    from spmdsim.models.nets.digits import load_digits
    from spmdsim.models.nets.train import NetworkTrainer

    class Trainer(NetworkTrainer):  # MatMul in its chosen output layout (an out_strategy scatters)
        def _hop(self, hop, x):
            stage = self.net.stages[hop.stage]
            if hop.is_redistribution or stage.kind != "matmul":
                return super()._hop(hop, x)
            return ops.matmul(x, self.params[hop.stage][0], out_layout=stage.out, label=stage.name)

    x, labels = load_digits(synthetic=True).batch(0, 32)

    def body() -> int:
        trainer = Trainer(net, spmdsim.world())
        step = trainer.step(x, labels)
        trainer.close()
        return sum(e.bytes_received for e in step.traces["backward"].entries if e.group_size > 1)

    return max(spmdsim.simulate(8, body))


def test_training_prediction_equals_measured_backward():
    from spmdsim.models.nets import mindspore_tutorial

    result = autoshard("net_mindspore_tutorial", 8, fix={"MatMul1": "((2, 4), (4, 1))"},
                       flops_per_s=1e9, training=True)
    assert result.hand_written_backward_bytes_per_rank == _measured_backward(mindspore_tutorial(8))
    assert result.backward_bytes_per_rank == _measured_backward(to_network(result)) > 0
    # a choice under a memory limit: Reduce_scatter outputs (their backward Allgathers), split weights
    limited = autoshard("net_mindspore_tutorial", 8, memory_limit=400_000, flops_per_s=1e9, training=True)
    assert any(op.candidate.out_strategy for op in limited.ops)
    assert limited.backward_bytes_per_rank == _measured_backward(to_network(limited)) > 0
    # the hand-written backward: MatMul1's dW Allreduce over m, then the hops' reverse moves
    assert [op.weight_bytes for op in result.hand_backward][2] == 784 // 4 * 512 * 4 * 2 * (2 - 1) // 2


def test_training_objective_charges_data_parallel_gradients():
    plain = autoshard("net_mindspore_tutorial", 8, flops_per_s=1e9)
    assert plain.total_bytes_per_rank == 0 and plain.backward == ()
    dp = [op.candidate for op in plain.ops]  # pure data parallelism: free forward, not free training
    weights = sum(op.weight_bytes for op in replay(plain.graph, dp))
    assert weights == sum(2 * 7 * 4 * n // 8 for n in (784 * 512, 512 * 512, 512 * 10)) == 4_680_704
    assert "| 0 | 4,680,704 | 4,680,704 |" in DOCS.read_text()
    trained = autoshard("net_mindspore_tutorial", 8, flops_per_s=1e9, training=True)
    assert trained.outcome.value == trained.total_bytes_per_rank + trained.backward_bytes_per_rank
    assert trained.outcome.value < weights


def test_training_figures_in_the_docs():
    text = DOCS.read_text()
    for fix, fwd, bwd in (({}, 87_808, 0), ({"MatMul1": "((2, 4), (4, 1))"}, 91_328, 401_408)):
        r = autoshard("net_mindspore_tutorial", 8, fix=fix, flops_per_s=1e10, training=True)
        assert (r.total_bytes_per_rank, r.backward_bytes_per_rank) == (fwd, bwd)
        assert f"| {fwd:,} | {bwd:,} | {fwd + bwd:,} |" in text
    assert (r.hand_written_total_bytes_per_rank, r.hand_written_backward_bytes_per_rank) == (179_392, 525_312)
    assert "| 179,392 | 525,312 | 704,704 |" in text
    assert '--training --fix "MatMul1=((2,4),(4,1))"' in text


def test_cli_training_table_and_json(capsys):
    args = ["autoshard", "--network", "net_mindspore_tutorial", "--flops", "1e10", "--training",
            "--fix", "MatMul1=((2,4),(4,1))"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 100 for line in out.splitlines())
    assert "training 492,736 B/rank = fwd 91,328 + bwd 401,408; hand-written 704,704" in out
    assert main(args + ["--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["training"] is True and record["backward_bytes_per_rank"] == 401_408
    assert sum(op["backward_bytes_per_rank"] for op in record["hand_written"]) == 525_312
    assert main(args + ["--objective", "time"]) == 2
    assert "objective 'time' must be 'bytes'" in capsys.readouterr().err
