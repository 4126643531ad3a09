"""Strategy search and propagation: exact against brute force, seed 001's examples, the seed network."""
from __future__ import annotations

import numpy as np
import pytest

from spmdsim.tools.autoshard import Graph, OpNode, ParamSpec, Table, autoshard, mlp_chain
from spmdsim.tools.autoshard.cost import Objective
from spmdsim.tools.autoshard.graph import data_parallel
from spmdsim.tools.autoshard.search import branch_and_bound, tree_search
from spmdsim.errors import SpmdsimError
from spmdsim.models.nets.seeds import weight

RATE = 1e10  # a stated compute rate: results do not depend on this machine


def _branches(devices: int) -> Graph:
    """x -> A, x -> B, Scores = A B^T, Softmax: 4 operators with a cycle (x-A-Scores-B-x)."""
    sd, dt = (8, 16), "float32"
    x = OpNode("x", "input", (), (), sd, dt, layout=data_parallel(devices, sd))
    nodes = [x] + [OpNode(n, "matmul", ("x",), (sd,), sd, dt, (ParamSpec("w", weight((16, 16), dt, i)),))
                   for i, n in enumerate("AB")]
    nodes += [OpNode("Scores", "bmm", ("A", "B"), (sd, sd), (8, 8), dt, transpose_b=True),
              OpNode("Softmax", "softmax", ("Scores",), ((8, 8),), (8, 8), dt)]
    return Graph("branches", "two branches that join", tuple(nodes))


def _brute(table: Table) -> np.ndarray:
    """The objective of every combination of candidates, as an array with one axis per node."""
    n = len(table.node)
    grid = np.zeros([len(v) for v in table.node])
    for i, v in enumerate(table.node):
        grid = grid + np.asarray(v, dtype=float).reshape([-1 if j == i else 1 for j in range(n)])
    for (p, q), m in table.edge.items():
        shape = [1] * n
        shape[p], shape[q] = m.shape
        grid = grid + (m if p < q else m.T).reshape(shape)
    return grid


def _table(graph: Graph, devices: int, objective: str = "bytes", memory: int | None = None) -> Table:
    from spmdsim.tools.autoshard.candidates import candidates

    opts = []
    for node in graph.nodes:
        dts = tuple(graph.nodes[graph.index(i)].dtype for i in node.inputs)
        opts.append(tuple(c for c in candidates(node, devices, dts)
                          if memory is None or node.kind == "input" or c.memory <= memory))
    return Table(graph, opts, Objective(objective, RATE), [n.dtype for n in graph.nodes])


@pytest.mark.parametrize("devices", [4, 8])
@pytest.mark.parametrize("memory", [None, 1200])
def test_tree_dp_equals_brute_force_on_a_chain(devices, memory):
    graph = mlp_chain(devices, layers=2, batch=8, width=16)  # 4 operators
    table = _table(graph, devices, memory=memory)
    grid = _brute(table)
    out = tree_search(table.node, table.edge)
    values = np.sort(grid, axis=None)
    assert out.proven and out.value == values[0] == table.total(out.choice)
    # The first runner-up is the second-best value over all combinations.
    assert out.runners_up[0][0] == values[1]
    # The per-operator runner-up: the best total with another candidate there.
    for u, nxt in enumerate(out.next_here):
        if nxt is not None:
            c, value = nxt
            assert value == grid.take(c, axis=u).min()


def test_ties_go_to_the_first_cheapest_plan_in_candidate_order():
    # docs/howto/autoshard.md, "Ties": the mlp at 8 devices has 35 plans of 0 B; candidates come most devices first.
    from spmdsim.tools.autoshard import build

    graph, _ = build("mlp", 8)
    grid = _brute(_table(graph, 8))
    cheapest = np.argwhere(grid == grid.min())
    assert len(cheapest) == 35 and grid.min() == 0
    result = autoshard("mlp", 8, flops_per_s=RATE)
    assert result.outcome.choice == tuple(cheapest[0])
    assert [op.candidate.text for op in result.ops[1:]] == ["((8, 1), (1, 1), (1,))", "((8, 1),)",
                                                            "((8, 1), (1, 1), (1,))"]


def test_tree_runners_up_change_one_operator_and_can_miss_a_cheaper_plan():
    # docs/howto/autoshard.md: the first runner-up is the second-best plan; a later one may cost more than a plan not
    # listed (mlp at 8 devices under 40,000 B: runner-up 3 22,032 B, the fourth-cheapest plan 21,888).
    from spmdsim.tools.autoshard import build

    graph, _ = build("mlp", 8)
    values = np.sort(_brute(_table(graph, 8, memory=40_000)), axis=None)
    result = autoshard("mlp", 8, memory_limit=40_000, flops_per_s=RATE)
    assert list(values[:4]) == [12_672, 12_672, 16_128, 21_888]
    assert [result.total_bytes_per_rank] + [b for b, _, _ in result.runners_up] == [12_672, 12_672, 16_128, 22_032]


@pytest.mark.parametrize("devices", [4, 8])
def test_branch_and_bound_equals_brute_force_with_branches(devices):
    graph = _branches(devices)
    assert not graph.is_tree()
    table = _table(graph, devices)
    grid = np.sort(_brute(table), axis=None)
    out = branch_and_bound(table.node, table.edge, runners_up=3)
    assert out.proven and out.value == grid[0] == table.total(out.choice)
    assert [v for v, _ in out.runners_up] == list(grid[1:4])


def test_time_objective_equals_brute_force():
    graph = mlp_chain(4, layers=1, batch=8, width=16)
    table = _table(graph, 4, "time")
    grid = _brute(table)
    out = tree_search(table.node, table.edge)
    assert out.value == pytest.approx(grid.min(), rel=1e-12)


def test_branch_and_bound_says_when_it_stopped_early():
    table = _table(_branches(8), 8)
    out = branch_and_bound(table.node, table.edge, node_limit=5)
    assert not out.proven and out.explored > 5


def test_a_search_stopped_at_its_node_limit_is_finished_by_elimination():
    # Branch and bound stopped at 5 nodes and reported its best so far, "not proven" (on attention from 32
    # devices on, a worse plan than the optimum: 760 B against 728 at 64); elimination finishes it exactly.
    graph = _branches(8)
    result = autoshard(graph, 8, node_limit=5, flops_per_s=RATE)
    out = result.outcome
    assert out.proven and out.method == "variable elimination (branch and bound stopped)" and out.explored > 5
    assert result.total_bytes_per_rank == _brute(_table(graph, 8)).min()


def _two_matmuls(devices: int = 4) -> Graph:
    """Seed 001: Z = MatMul(X, W), O = MatMul(Z, Y), with Z (16, 32) float32."""
    dt = "float32"
    x = OpNode("X", "input", (), (), (16, 32), dt, layout=data_parallel(devices, (16, 32)))
    m1 = OpNode("MatMul1", "matmul", ("X",), ((16, 32),), (16, 32), dt,
                (ParamSpec("w", weight((32, 32), dt, 1)),))
    relu = OpNode("ReLU", "relu", ("MatMul1",), ((16, 32),), (16, 32), dt)
    m2 = OpNode("MatMul2", "matmul", ("ReLU",), ((16, 32),), (16, 32), dt,
                (ParamSpec("w", weight((32, 32), dt, 2)),))
    return Graph("seed001", "Z = MatMul(X, W); O = MatMul(Z, Y)", (x, m1, relu, m2))


@pytest.mark.parametrize("consumer, collective, nbytes", [
    ("((1, 1), (1, 4))", "allgather", 3 * 4 * 32 * 4),   # Z consumed whole: receive 3 row blocks
    ("((1, 4), (4, 1))", "alltoall", 3 * 4 * 8 * 4),     # Z consumed column-split: 3/4 of a block
])
def test_propagation_reproduces_seed_001(consumer, collective, nbytes):
    # MatMul1 leaves Z split by rows over 4 devices; MatMul2 wants it whole or by columns.
    # ReLU, between them, is propagated: one collective remains, the one seed 001 names.
    result = autoshard(_two_matmuls(), 4, fix={"MatMul1": "((4, 1), (1, 1))", "MatMul2": consumer},
                       method="propagate", flops_per_s=RATE)
    steps = [s for op in result.ops for plan in op.hops for s in plan.steps]
    assert [s.op for s in steps] == [collective]
    assert result.ops[3].in_bytes + result.ops[2].in_bytes == nbytes
    assert result.ops[2].why.startswith("propagated from MatMul1")


def test_tutorial_with_matmul1_fixed_needs_no_more_than_its_own_strategies():
    fixed = autoshard("net_mindspore_tutorial", 8, fix={"MatMul1": "((2, 4), (4, 1))"}, flops_per_s=RATE)
    hand = fixed.hand_written_total_bytes_per_rank
    assert hand == 179_392  # the tutorial's hops: 9,408 + 49,152 + 6,144 + 114,688
    assert fixed.total_bytes_per_rank <= hand
    assert fixed.ops[2].candidate.text == "((2, 4), (4, 1))"
    free = autoshard("net_mindspore_tutorial", 8, flops_per_s=RATE)
    assert free.total_bytes_per_rank <= fixed.total_bytes_per_rank
    record = free.to_json()
    assert isinstance(record["total_bytes_per_rank"], int)
    assert record["hand_written_total_bytes_per_rank"] == hand
    assert [op["name"] for op in record["operators"]][1:] == [
        "Flatten", "MatMul1", "ReLU1", "MatMul2", "ReLU2", "MatMul3"]
    assert sum(op["bytes_per_rank"] for op in record["operators"]) == record["total_bytes_per_rank"]


@pytest.mark.parametrize("name", ["net_mindspore_tutorial", "net_mindspore_layout", "net_paddle_tp",
                                  "net_oneflow_2d_sbp", "net_oneflow_2d_signature"])
def test_hand_written_hops_match_the_network_schedule(name):
    from spmdsim.models.nets import NETWORKS, schedule

    result = autoshard(name, 8, flops_per_s=RATE)
    hops = schedule(NETWORKS[name](8))
    planned = sum(h.plan.max_bytes_received for h in hops if h.plan is not None)
    assert sum(op.in_bytes for op in result.hand_ops) == planned
    # Each operator's own collectives are the ones the network's stage runs.
    for op, stage in zip(result.hand_ops[1:], NETWORKS[name](8).stages):
        ran = tuple((s.op, tuple(s.axes)) for p in op.candidate.own for s in p.steps if s.group_size > 1)
        assert ran == tuple((c, tuple(a)) for c, a in stage.collectives), op.name
    assert result.total_bytes_per_rank <= result.hand_written_total_bytes_per_rank


@pytest.mark.parametrize("name", ["net_mindspore_tutorial", "net_mindspore_layout", "net_paddle_tp",
                                  "net_oneflow_2d_sbp", "net_oneflow_2d_signature"])
@pytest.mark.parametrize("devices", [8, 4])
def test_a_seed_networks_graph_is_its_network(name, devices):
    # autoshard restates nothing of a seed network: its graph is the Network's stages, node for stage
    # (names, shapes, dtypes, the very weights), and the hand-written layouts are the stages' own.
    from spmdsim.tools.autoshard import build
    from spmdsim.models.nets import NETWORKS

    graph, hand = build(name, devices)
    try:
        net, own = NETWORKS[name](devices), True
    except SpmdsimError:  # written for another device count: the same shapes, searched without them
        net, own = NETWORKS[name](8), False
    assert (graph.name, graph.title, graph.batch_dims) == (net.name, net.title, net.batch_dims)
    x, nodes = graph.nodes[0], graph.nodes[1:]
    assert (x.source, x.out_shape, x.dtype) == (net.source, net.source.shape, net.source.dtype)
    assert [n.name for n in nodes] == [s.name for s in net.stages]
    assert [(n.in_shapes[0], n.dtype) for n in nodes] == [(net.flow[i][0], net.flow[i + 1][1])
                                                           for i in range(len(nodes))]
    assert [n.out_shape for n in nodes] == [shape for shape, _ in net.flow[1:]]
    assert [[(p.name, p.source) for p in n.params] for n in nodes] == \
        [[(p.name, p.source) for p in s.params] for s in net.stages]
    if own:
        assert x.layout == net.input_layout
        assert [(h.inputs, h.params, h.out, h.how) for h in hand[1:]] == \
            [((s.x,), tuple(p.layout for p in s.params), s.out, s.how) for s in net.stages]
    else:
        assert hand is None and x.layout == data_parallel(devices, net.source.shape)


def test_a_chain_with_a_constant_weight_is_told_it_cannot_run_through_the_network_runner():
    # The GPT's layer norms start as ones (graph.Constant): the node-by-node runner fills them; the
    # network runner, which runs chains, cuts seeded weights only, and says so before any collective.
    from spmdsim.tools.autoshard.graph import Constant
    from spmdsim.tools.autoshard.runnable import check_runnable
    from spmdsim.layouts.datagen import SeededTensor

    sd, dt = (8, 16), "float32"
    x = OpNode("x", "input", (), (), sd, dt, layout=data_parallel(4, sd), source=SeededTensor(sd, dt, 0))
    ones = ParamSpec("w", Constant((16, 16), dt, 1.0))
    result = autoshard(Graph("ones", "x @ ones", (x, OpNode("MatMul1", "matmul", ("x",), (sd,), sd, dt, (ones,)))),
                       4, flops_per_s=RATE)
    assert np.array_equal(ones.source.full(), np.ones((16, 16), dtype=dt)) and ones.shape == (16, 16)
    with pytest.raises(SpmdsimError, match="whose weights are seeded; MatMul1's w is a constant$"):
        check_runnable(result)


def test_memory_limit_rules_candidates_out():
    result = autoshard("net_mindspore_tutorial", 8, memory_limit=1 << 20, flops_per_s=RATE)
    assert all(op.candidate.memory <= 1 << 20 for op in result.ops[1:])
    assert result.ops[2].ruled_out > 0  # fc1 whole (1.6 MB) no longer fits
    with pytest.raises(SpmdsimError, match="no strategy of MatMul1 fits the memory limit"):
        autoshard("net_mindspore_tutorial", 8, memory_limit=100_000, flops_per_s=RATE)


def test_fix_errors_name_the_value():
    with pytest.raises(SpmdsimError, match="no operator 'MatMul9'"):
        autoshard("net_mindspore_tutorial", 8, fix={"MatMul9": "((8, 1), (1, 1))"}, flops_per_s=RATE)
    with pytest.raises(SpmdsimError, match=r"strategy '\(\(3, 1\), \(1, 1\)\)' is not a candidate"):
        autoshard("net_mindspore_tutorial", 8, fix={"MatMul1": "((3, 1), (1, 1))"}, flops_per_s=RATE)
    out = autoshard("net_mindspore_tutorial", 8, fix={"MatMul2": "hand"}, flops_per_s=RATE)
    assert out.ops[4].candidate.text == "((1, 8), (8, 1))" and out.ops[4].why == "fixed"


@pytest.mark.parametrize("args, kwargs, said", [
    ((5,), {}, "network int 5 must be a network name (one of ("),
    (("mlp",), {"fix": 5}, "fix int 5 must be a mapping {operator name: strategy text}"),
    (("mlp",), {"fix": {"fc1": 5}}, "fix {'fc1': 5} must map an operator name to strategy text"),
    (("mlp",), {"runners_up": -1}, "runners_up -1 must be an integer >= 0"),
    (("mlp",), {"node_limit": 0}, "node_limit 0 must be an integer >= 1"),
    (("mlp",), {"time_limit_s": -1}, "time_limit_s -1 must be a finite number of seconds > 0, or None"),
    (("mlp",), {"time_limit_s": float("nan")}, "time_limit_s nan must be a finite number of seconds > 0"),
    (("mlp",), {"memory_limit": -1}, "memory_limit (bytes per rank) -1 must be an integer >= 0"),
])
def test_bad_arguments_are_refused_before_any_work(args, kwargs, said):
    with pytest.raises(SpmdsimError) as caught:
        autoshard(*args, flops_per_s=RATE, **kwargs)
    assert str(caught.value).startswith(said)


def test_layout_tuple_network_keeps_its_hand_written_layouts():
    # Layout((2,2,2)) MatMul1 has the same slice counts as ((2,4),(4,1)) but other devices.
    result = autoshard("net_mindspore_layout", 8, fix={"MatMul1": "hand"}, flops_per_s=RATE)
    hand = result.hand_ops[2].candidate
    assert result.ops[2].candidate.same_layouts(hand) and hand.hand


@pytest.mark.parametrize("devices", [4, 8])
def test_variable_elimination_equals_brute_force_with_branches(devices):
    from spmdsim.tools.autoshard.search import eliminate

    table = _table(_branches(devices), devices)
    grid = _brute(table)
    out = eliminate(table.node, table.edge)
    assert out.proven and out.value == grid.min() == table.total(out.choice)
    for value, alt in out.runners_up:  # one operator changed, priced exactly
        assert value == table.total(alt) >= out.value
        assert sum(a != b for a, b in zip(alt, out.choice)) == 1
    assert eliminate(table.node, table.edge, max_entries=1) is None  # a table over its limit: none
