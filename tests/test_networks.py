"""Seed networks, pure side: stages, the schedule of redistributions, the reference, the table."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from spmdsim import Layout, OperatorError, SeededTensor
from spmdsim.models.nets import (
    NETWORKS, mindspore_layout, mindspore_tutorial, needs_eight, network_atol, paddle_needs,
    paddle_tp, reference_rows, schedule,
)
from spmdsim.models.nets.model import flatten_stage, matmul_stage
from spmdsim.models.nets.table import format_table, row_of


def _labels_and_expected(net):
    return [(h.label, h.expected) for h in schedule(net)]


def test_tutorial_schedule_inserts_the_expected_redistributions():
    assert _labels_and_expected(mindspore_tutorial(8)) == [
        ("Flatten", ()),
        ("-> MatMul1", (("alltoall", ("k",)),)),
        ("MatMul1", (("allreduce", ("k",)),)),
        ("-> ReLU1", ()),
        ("ReLU1", ()),
        ("-> MatMul2", (("alltoallv", None),)),
        ("MatMul2", (("allreduce", ("k",)),)),
        ("-> ReLU2", ()),
        ("ReLU2", ()),
        ("-> MatMul3", ()),
        ("MatMul3", ()),
    ]


def test_tutorial_layouts_follow_the_strategies():
    net = mindspore_tutorial(8)
    stages = {s.name: s for s in net.stages}
    assert stages["MatMul1"].x.layout == Layout((2, 4, 1), ("m", "k", "n"))
    assert stages["MatMul1"].x.shards_per_dim == (2, 4)
    assert stages["MatMul1"].params[0].layout.shards_per_dim == (4, 1)
    assert stages["ReLU1"].x.shards_per_dim == (4, 1)
    assert stages["MatMul2"].x.shards_per_dim == (1, 8)
    assert stages["ReLU2"].x.shards_per_dim == (8, 1)
    # No strategy: MindSpore's data-parallel default, weight whole on every rank.
    assert stages["MatMul3"].x.shards_per_dim == (8, 1)
    assert stages["MatMul3"].params[0].layout.shards_per_dim == (1, 1)
    assert net.out_shape == (32, 10)
    # The images arrive data parallel: 4 per rank.
    assert net.input_layout.local_shape((32, 1, 28, 28)) == (4, 1, 28, 28)


def test_redistributions_into_relu_are_local_and_all_plans_meet_the_lower_bound():
    for net in (mindspore_tutorial(8), mindspore_layout(8)):
        for hop in schedule(net):
            if hop.is_redistribution:
                assert hop.plan.meets_lower_bound, hop.label
    hops = {h.label: h for h in schedule(mindspore_tutorial(8))}
    for label in ("-> ReLU1", "-> ReLU2"):
        assert {s.op for s in hops[label].plan.steps} == {"local_slice"}
        assert max(hops[label].plan.bytes_received) == 0
    assert hops["-> MatMul3"].plan.steps == ()
    assert hops["-> MatMul3"].note() == "same shards, new device matrix"


def test_layout_variant_matches_the_seed_and_design():
    net = mindspore_layout(8)
    matmul1 = net.stages[1]
    # docs/explanation/semantics.md: ("sp", "dp") is sp-major; device (0, 1, 0) = rank 2 holds x[0:16, 392:588].
    assert matmul1.x.bounds(2, (32, 784)) == ((0, 16), (392, 588))
    assert matmul1.x.bounds(1, (32, 784)) == ((16, 32), (0, 196))
    assert matmul1.params[0].layout.bounds(2, (784, 512)) == ((392, 588), (0, 512))
    expected = dict(_labels_and_expected(net))
    assert expected["MatMul1"] == (("allreduce", ("sp", "dp")),)
    assert expected["MatMul2"] == (("allreduce", ("tp",)),)
    assert expected["-> ReLU2"] == ()


def test_replicated_no_strategy_gathers_before_matmul3():
    net = mindspore_tutorial(8, no_strategy="replicated")
    hops = {h.label: h for h in schedule(net)}
    assert hops["-> MatMul3"].expected == (("allgather", ("axis_0",)),)
    assert hops["MatMul3"].expected == ()
    assert net.out.shards_per_dim == (1, 1)


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_paddle_adapts_to_the_world_size(p):
    net = paddle_tp(p)
    assert paddle_needs(p) is None
    hops = schedule(net)
    assert [h.label for h in hops] == ["Embedding", "ColumnLinear", "RowLinear"]  # no redistribution
    colls = (("allreduce", ("mp",)),) if p > 1 else ()
    assert [h.expected for h in hops] == [colls, (), colls]
    assert net.stages[0].params[0].layout.local_shape((960, 64)) == (960 // p, 64)
    assert net.stages[1].out.shards_per_dim == (1, 1, p)


def test_skip_reasons_and_errors_name_the_world_size():
    assert needs_eight(8) is None
    assert "not 4" in needs_eight(4)
    assert "7 ranks" in paddle_needs(7)
    with pytest.raises(OperatorError, match="not 4"):
        mindspore_tutorial(4)
    with pytest.raises(OperatorError, match="7 ranks"):
        paddle_tp(7)
    with pytest.raises(OperatorError, match="no_strategy 'auto'"):
        mindspore_tutorial(8, no_strategy="auto")


def test_stage_builders_reject_bad_layouts():
    layout = Layout((2, 4), ("a", "b"))
    with pytest.raises(OperatorError, match="only dim 0 split"):
        flatten_stage(layout("a", "b", None), (4, 8, 2))
    with pytest.raises(OperatorError, match="contraction dim K"):
        matmul_stage("M", "-", layout("a", "b"), layout(None, None), (4, 8),
                     SeededTensor((8, 4), "float32", 0))


def _numpy_tutorial(net):
    x = net.source.full().reshape(32, -1).astype(np.float64)
    w = [s.params[0].source.full().astype(np.float64) for s in net.stages if s.params]
    h = np.maximum(x @ w[0], 0)
    h = np.maximum(h @ w[1], 0)
    return h @ w[2]


def test_reference_rows_is_the_whole_network_row_by_row():
    net = mindspore_tutorial(8, seed=3)
    whole = _numpy_tutorial(net)
    got = reference_rows(net, len(net.stages), (slice(0, 32), slice(0, 10)))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, whole, rtol=1e-4, atol=network_atol(net))
    block = reference_rows(net, len(net.stages), (slice(4, 8), slice(2, 5)))
    np.testing.assert_array_equal(block, got[4:8, 2:5])
    # Activations stay near 1 (weights scaled by fan-in), so the tolerance means something.
    assert 0.1 < np.abs(whole).mean() < 10


def test_paddle_reference_matches_numpy():
    net = paddle_tp(4, seed=1)
    ids = net.source.full()
    table, (w1, b1), (w2, b2) = ([p.source.full().astype(np.float64) for p in s.params]
                                 for s in net.stages)
    whole = (table[0][ids] @ w1 + b1) @ w2 + b2
    got = reference_rows(net, 3, (slice(None), slice(None), slice(None)))
    np.testing.assert_allclose(got, whole, rtol=1e-4, atol=network_atol(net))


def test_table_rows_and_text():
    net = mindspore_tutorial(8)
    hops = schedule(net)
    # Two ranks' traces of hop 3 (MatMul1): one Allreduce over k, bytes per rank differ.
    entries = [[("allreduce", ("k",), 4, 100), ("allgather", ("n",), 1, 0)],
               [("allreduce", ("k",), 4, 120)]]
    row = row_of(3, hops[2], entries)
    assert row.calls == ((("allreduce", ("k",)), 1),)
    assert row.max_sent == 120 and row.matches()
    local = row_of(4, hops[3], [[], []])
    assert local.collectives_text() == "none (local slice)" and local.matches()
    text = format_table(net, [row, local], 2)
    # The step cell may fold "MatMul1 shard(...)" onto two lines to keep 100 columns.
    assert "Allreduce(k) x1" in text and "MatMul1" in text and "shard(((2,4),(4,1)))" in text
    assert text.splitlines()[-1].endswith(" 120 B") and "1 collective call " in text


def test_networks_registry_and_purity():
    assert set(NETWORKS) == {"net_mindspore_tutorial", "net_mindspore_layout", "net_paddle_tp",
                             "net_oneflow_2d_sbp", "net_oneflow_2d_signature"}
    code = ("import sys, spmdsim.models.nets, spmdsim.tools.demo.networks; "
            "sys.exit(1 if 'mpi4py' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_main_rejects_unknown_networks_before_mpi(capsys):
    from spmdsim.models.nets.__main__ import main

    with pytest.raises(SystemExit) as info:
        main(["net_nope"])
    assert info.value.code == 2
    assert "unknown network(s) ['net_nope']" in capsys.readouterr().err


def test_main_exits_3_when_every_network_asked_for_was_skipped(capsys):
    """`python -m spmdsim.models.nets net_mindspore_tutorial` in one process (or on 3 ranks) printed its SKIP line and
    exited 0, which a script read as a pass; now 3 (as `spmdsim demo` when none ran), with one line saying so."""
    from spmdsim.models.nets.__main__ import main

    assert main(["--ranks", "3", "net_mindspore_tutorial", "net_oneflow_2d_sbp"]) == 3
    captured = capsys.readouterr()
    assert "net_mindspore_tutorial: SKIP (the MindSpore tutorial's strategies need exactly 8 ranks, not 3)" \
        in captured.out
    assert " ".join(captured.err.split()).endswith(
        "python -m spmdsim.models.nets: no network ran on 3 ranks (2 asked for, each skipped: its SKIP line says "
        "what it needs); 8 ranks run them all (mpiexec -n 8, or --ranks 8)")


def test_oneflow_sample_matches_the_seed_placement_and_numpy():
    # Seed 002: placement [[0, 1], [2, 3]], x (B, S(0)) with a (1, 2, 8) block per rank,
    # Linear(8, 4) > ReLU > Linear(4, 2) with broadcast weights: no communication.
    from spmdsim.models.nets import oneflow_2d_sbp, oneflow_needs

    net = oneflow_2d_sbp(4, seed=2)
    assert net.source.shape == (2, 2, 8) and net.input_layout.local_shape((2, 2, 8)) == (1, 2, 8)
    assert [net.input_layout.bounds(r, (2, 2, 8))[0] for r in range(4)] == [(0, 1), (1, 2), (0, 1), (1, 2)]
    assert [h.label for h in schedule(net)] == ["Linear1", "ReLU", "Linear2"]
    assert all(h.expected == () for h in schedule(net))
    x = net.source.full().astype(np.float64)
    (w1, b1), _, (w2, b2) = ([p.source.full().astype(np.float64) for p in s.params] for s in net.stages)
    whole = np.maximum(x @ w1 + b1, 0) @ w2 + b2
    got = reference_rows(net, 3, (slice(None),) * 3)
    np.testing.assert_allclose(got, whole, rtol=1e-5, atol=network_atol(net))
    assert oneflow_needs(8) is None and "even rank count, not 3" in oneflow_needs(3)
    assert oneflow_2d_sbp(8).source.shape == (4, 2, 8)


def test_oneflow_signature_splits_the_columns_then_gathers_them():
    # w (S(1), B) times x (B, S(0)): y's columns split over axis_0, gathered for Linear2's (B, B) weight.
    from spmdsim.models.nets import oneflow_2d_signature

    net = oneflow_2d_signature(4)
    hops = schedule(net)
    assert [h.label for h in hops] == ["Linear1", "ReLU", "-> Linear2", "Linear2"]
    assert net.stages[0].out.tensor_map == (("axis_1",), (), ("axis_0",))
    assert hops[2].expected == (("allgather", ("axis_0",)),)
    with pytest.raises(OperatorError, match="weight_sbp 'P,B' must be"):
        from spmdsim.models.nets import oneflow_2d_sbp

        oneflow_2d_sbp(4, weight_sbp="P,B")
