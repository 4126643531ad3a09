"""Candidates and their costs: what is enumerated, and bytes equal to the planner's."""
from __future__ import annotations

import itertools
import math
import random

import pytest

from spmdsim.tools.autoshard import build, mlp_chain
from spmdsim.tools.autoshard.candidates import candidates
from spmdsim.tools.autoshard.volume import pair_bytes, redistribution_bytes
from spmdsim.programs.infer import infer_matmul
from spmdsim.programs.plan import plan_redistribution


def _pairs(graph, devices):
    for p, q, pos in graph.edges:
        sources = [c.out for c in candidates(graph.nodes[p], devices)]
        targets = [c.inputs[pos] for c in candidates(graph.nodes[q], devices)]
        yield sources, targets, graph.nodes[q].in_shapes[pos]


@pytest.mark.parametrize("name, devices", [("net_mindspore_tutorial", 8), ("net_mindspore_tutorial", 16),
                                           ("chain", 6), ("net_paddle_tp", 4)])
def test_redistribution_bytes_equal_the_planners(name, devices):
    # 16: power-of-two meshes (nested blocks); 6: every rank's blocks; both against the planner.
    graph, _ = build(name, devices)
    if name == "chain":
        graph = mlp_chain(devices, layers=1, batch=12, width=24)
    rng = random.Random(0)
    for sources, targets, shape in _pairs(graph, devices):
        matrix = redistribution_bytes(sources, targets, shape, "float32")
        pairs = list(itertools.product(range(len(sources)), range(len(targets))))
        for i, j in rng.sample(pairs, min(25, len(pairs))):
            plan = plan_redistribution(sources[i], targets[j], shape, "float32")
            assert matrix[i, j] == plan.max_bytes_received, (sources[i], targets[j])
        # one pair at a time (the backward's pricing): every pair, the matrix's figure
        assert all(pair_bytes(s, t, shape, "float32") == matrix[i, j] for (i, s), (j, t)
                   in itertools.product(enumerate(sources), enumerate(targets))), shape


@pytest.mark.parametrize("devices", [4, 8])
def test_own_collective_moves_what_the_whole_mesh_plan_moves(devices):
    node = mlp_chain(devices, layers=1, batch=8, width=16).nodes[1]
    checked = 0
    for c in candidates(node, devices):
        plan = infer_matmul(c.inputs[0], c.params[0], out=c.out if c.out_strategy else None)
        if not plan.local.partial:
            assert c.own == () and c.own_bytes == 0
            continue
        whole = plan_redistribution(plan.local, plan.out, node.out_shape, "float32")
        assert c.own_bytes == whole.max_bytes_received
        assert [s.op for s in c.own[0].steps] == [s.op for s in whole.steps] == [plan.collective]
        checked += 1
    assert checked > 5


def test_matmul_candidates_cover_every_fitting_strategy():
    node = mlp_chain(8, layers=1, batch=8, width=16).nodes[1]
    cands = candidates(node, 8)
    plain = {c.strategy for c in cands if c.out_strategy is None}
    # Every (a, b, c) with a product dividing 8: 1 + 3 + 6 + 10 = 20 strategies.
    expected = {((a, b), (b, c)) for a, b, c in itertools.product((1, 2, 4, 8), repeat=3)
                if 8 % (a * b * c) == 0}
    assert plain == expected
    for c in cands:
        used = math.prod(c.strategy[0]) * c.strategy[1][1]
        matrix = c.out.layout
        assert matrix.num_devices == 8
        # The repeated-calculation axis is MindSpore's: on the right, of size 8 / used.
        assert (matrix.alias_name[-1] == "rep") == (used < 8)
        if used < 8:
            assert matrix.device_matrix[-1] == 8 // used
    # A split contraction dim may also reduce-scatter into either output dim.
    outs = {c.out_strategy for c in cands if c.strategy == ((2, 2), (2, 2))}
    assert outs == {None, ((4, 2),), ((2, 4),)}


def test_softmax_and_flatten_keep_their_dims_whole():
    graph, _ = build("attention", 8)
    soft = candidates(graph.nodes[graph.index("Softmax")], 8)
    assert soft and all(c.strategy[0][-1] == 1 for c in soft)
    tut, _ = build("net_mindspore_tutorial", 8)
    flat = candidates(tut.nodes[1], 8)
    assert {c.strategy for c in flat} == {((s, 1, 1, 1),) for s in (1, 2, 4, 8)}


def test_embedding_candidates_split_vocabulary_and_dims():
    graph, _ = build("net_paddle_tp", 4)
    cands = candidates(graph.nodes[1], 4, ("int64",))
    vocab = [c for c in cands if c.strategy[1] == (4, 1)]
    assert vocab and all(c.collectives() and c.collectives()[0].startswith("Allreduce")
                         for c in vocab)
    assert any(c.strategy[1] == (1, 4) and not c.own for c in cands)


def test_batched_matmul_candidates_split_the_batch_too():
    from spmdsim.tools.autoshard import OpNode, ParamSpec
    from spmdsim.layouts.datagen import SeededTensor
    from spmdsim.models.nets.seeds import weight

    w = ParamSpec("w", SeededTensor((2, 16, 16), "float32", 1))
    node = OpNode("BMM", "matmul", ("x",), ((2, 8, 16),), (2, 8, 16), "float32", (w,))
    cands = candidates(node, 8)
    assert {((2, 1, 1), (2, 1, 4)), ((2, 2, 2), (2, 2, 1)), ((1, 8, 1), (1, 1, 1))} <= \
        {c.strategy for c in cands}
    assert all(c.strategy[0][0] == c.strategy[1][0] for c in cands)  # batch split alike
    linear = OpNode("Linear", "linear", ("x",), ((2, 8, 16),), (2, 8, 16), "float32",
                    (ParamSpec("w", weight((16, 16), "float32", 2)),
                     ParamSpec("b", SeededTensor((16,), "float32", 3))))
    kinds = {c.strategy[1:] for c in candidates(linear, 4)}
    assert ((1, 4), (4,)) in kinds and ((4, 1), (1,)) in kinds  # column and row parallel


def test_the_package_is_callable():
    import spmdsim

    result = spmdsim.tools.autoshard("chain", 4, flops_per_s=1e10)
    assert result.graph.name == "chain" and len(result.ops) == 101
    assert isinstance(result.total_bytes_per_rank, int)
