"""Chosen strategies executed by the network runner: values checked, bytes exactly as predicted."""
from __future__ import annotations

import pytest
from mpi4py import MPI

from spmdsim.tools.autoshard import autoshard
from spmdsim.tools.autoshard.execute import run_choice
from testkit import root_for_all

pytestmark = pytest.mark.mpi(min_size=2)

COMM = MPI.COMM_WORLD
RATE = 1e10  # stated, so every rank chooses the same strategies


def _searched(network, *args, **kwargs):
    """`autoshard(...)` searched by rank 0 for every rank (local work on equal inputs; the search itself is
    tested in tests/test_autoshard*.py): eight ranks searching at once on two cores cost the pass seconds,
    and so did seven ranks spinning in a blocking bcast meanwhile (testkit.root_for_all: they sleep)."""
    return root_for_all(COMM, lambda: autoshard(network, *args, **kwargs))


def _check(result):
    measured, passed = run_choice(result, COMM, repeats=1)
    assert passed
    # Every operator (with the redistribution into it) moves exactly the predicted bytes.
    assert [m.bytes_received for m in measured] == [op.bytes_per_rank for op in result.ops]
    return measured


@pytest.mark.skipif(COMM.size != 8, reason="MatMul1's tutorial strategy needs 8 ranks")
def test_tutorial_choice_with_matmul1_fixed_runs_as_predicted():
    result = autoshard("net_mindspore_tutorial", 8, fix={"MatMul1": "((2, 4), (4, 1))"},
                       memory_limit=1 << 20, flops_per_s=RATE)
    measured = _check(result)
    assert result.total_bytes_per_rank <= result.hand_written_total_bytes_per_rank
    assert measured[2].bytes_received == 9_408 + 49_152  # Alltoall into MatMul1, its Allreduce


@pytest.mark.skipif(COMM.size not in (4, 8), reason="the Paddle network splits over 4 or 8 ranks")
def test_paddle_choice_under_a_memory_limit_runs_as_predicted():
    # Whole tables (245,760 B) no longer fit: the embedding must split its vocabulary or dims.
    result = autoshard("net_paddle_tp", COMM.size, memory_limit=200_000, flops_per_s=RATE)
    assert result.ops[1].candidate.strategy[1] != (1, 1)
    _check(result)


@pytest.mark.skipif(COMM.size not in (4, 8), reason="the small GPT's choice is checked at 4 and 8 ranks")
def test_gpt_choice_runs_node_by_node_as_predicted():
    # A graph with branches (the residuals, Q/K/V): the DAG runner, every node's value checked.
    from spmdsim.tools.autoshard.networks import gpt_network
    from spmdsim.models.gpt.config import GPTConfig

    graph, hand = gpt_network(COMM.size, GPTConfig(layers=2, d_model=64))
    _check(_searched(graph, COMM.size, hand=hand, flops_per_s=RATE))
    if COMM.size == 8:  # Megatron's layouts, every node fixed: the tensor-parallel collectives
        from spmdsim.tools.autoshard.dag import run_dag

        fix = {n.name: "hand" for n in graph.nodes[1:]}
        result = _searched(graph, 8, hand=hand, fix=fix, flops_per_s=RATE, training=True)
        # One run, forward and backward (run_choice's node-by-node run is run_dag's forward, checked above):
        # every value and gradient checked, every node's bytes as predicted.
        report = run_dag(result, COMM, repeats=1, train=True)
        assert report.passed and len(report.backward.verdicts) == 34
        assert [m.bytes_received for m in report.measured] == [op.bytes_per_rank for op in result.ops]
        assert sum(m.bytes_received for m in report.measured) == 993_808
        # The backward's bytes, as replayed, and as predicted.
        assert report.backward.bytes_received == result.backward_bytes_per_rank == 1_267_456
