"""A pipeline's messages priced by where their two ranks are (spmdsim.tools.estimate.transfers.placed): a hop
between two stages of one node at the node's link, one between nodes at the cluster's."""
from __future__ import annotations

import math

from spmdsim.models.gpt import GPTConfig
from spmdsim.tools.estimate.ledger import gpt_ledger
from spmdsim.tools.estimate.machine import load_machine
from spmdsim.tools.estimate.steptime import step_time

CFG = GPTConfig(layers=4, d_model=32, heads=4, seq=16, batch=8, dropout=0.0)
#: A microbatch's activations (or their gradients) between two stages: 1 sequence of 16 x 32 float64s (the dry
#: run's), its rows split over tp 2 (Megatron's scatter before the send).
ONE = 16 * 32 * 8 // 2
#: The tied table's gradients the first and last stage exchange: its 128 x 32 float64s, split over tp 2.
TABLE = CFG.vocab * 32 * 8 // 2


def _messages(stage) -> list:
    return sorted((t.kind, t.level, t.nbytes, t.count) for t in stage.transfers if t.phase == "pipeline")


def test_a_pipelines_hops_within_a_node_are_priced_at_the_nodes_link():
    """tp 2 x dp 2 x pp 4 on nodes of 8 (pp outermost, Megatron's order: stages 0-1 on node 0, 2-3 on node 1):
    hops 0-1 and 2-3 stay on a node, 1-2 crosses, as does the tied table's exchange between stages 0 and 3.
    Every message was priced across nodes: its axes' group (the four stages) spans both nodes."""
    stages = gpt_ledger(CFG, 4, 2, 2, microbatches=4, gpus_per_node=8)
    assert [st.ranks for st in stages] == [tuple(range(4 * s, 4 * s + 4)) for s in range(4)]
    ends = [("recv", "cluster", TABLE, 1), ("recv", "node", ONE, 4), ("send", "cluster", TABLE, 1),
            ("send", "node", ONE, 4)]
    inner = [("recv", "cluster", ONE, 4), ("recv", "node", ONE, 4), ("send", "cluster", ONE, 4),
             ("send", "node", ONE, 4)]
    assert [_messages(st) for st in stages] == [ends, inner, inner, ends]
    machine = load_machine("a100-dgx")
    node, cluster = machine.link("node"), machine.link("cluster")
    hand = 8 * (node.latency + ONE / node.achieved) + 8 * (cluster.latency + ONE / cluster.achieved)
    seconds = dict(step_time(machine, [], stages[1].transfers).comm_by_phase)["pipeline"]
    assert math.isclose(seconds, hand, rel_tol=1e-12)


def test_a_group_of_messages_to_peers_on_both_sides_of_a_node_is_priced_by_peer():
    """The interleaved schedule posts a stage's sends to the stage before and the one after together: stage 2
    (ranks 8-11, node 1) sends to stage 1 (node 0) and stage 3 (node 1) in one group, priced as a message
    across nodes and one within its node."""
    cfg = GPTConfig(layers=8, d_model=32, heads=4, seq=16, batch=8, dropout=0.0)
    stages = gpt_ledger(cfg, 4, 2, 2, microbatches=4, virtual=2, schedule="interleaved", gpus_per_node=8)
    assert _messages(stages[2]) == [("recv", "cluster", ONE, 8), ("recv", "node", ONE, 8),
                                    ("send", "cluster", ONE, 8), ("send", "node", ONE, 8)]
    assert _messages(stages[0]) == [("recv", "cluster", ONE, 4), ("recv", "cluster", TABLE, 1),
                                    ("recv", "node", ONE, 8), ("send", "cluster", ONE, 4),
                                    ("send", "cluster", TABLE, 1), ("send", "node", ONE, 8)]
