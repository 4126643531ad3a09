"""Seed networks under mpiexec: whole forward passes checked hop by hop, collectives pinned.

The MindSpore networks need 8 ranks (skipped otherwise); the Paddle network
runs at any world size that splits its vocabulary and ffn width (8 and 4 here).
"""
from __future__ import annotations

import engines
import pytest

from spmdsim.tools.demo.registry import Context, scenarios, run_scenario
from spmdsim.models.nets import NetworkRunner, mindspore_layout, mindspore_tutorial, paddle_tp
from spmdsim.models.nets import reference_rows

pytestmark = pytest.mark.mpi(min_size=2)


def _eight():
    if engines.world().size != 8:
        pytest.skip("the MindSpore strategies need 8 ranks")


def _run(net, every_hop=True):
    runner = NetworkRunner(net, engines.world())
    result = runner.forward()
    verdicts = result.check_all() if every_hop else (result.check(),)
    rows = result.rows()
    return runner, result, verdicts, {row.hop.label: row for row in rows}


def _colls(rows, label):
    return rows[label].collectives()


def test_tutorial_network_checks_every_hop_with_the_planned_collectives():
    _eight()
    runner, result, verdicts, rows = _run(mindspore_tutorial(8, seed=5))
    try:
        assert all(v.passed for v in verdicts), [str(v) for v in verdicts if not v.passed]
        assert all(row.matches() for row in rows.values())
        # The MLP-like pattern: exactly one Allreduce per split contraction, over k.
        assert _colls(rows, "MatMul1") == (("allreduce", ("k",)),)
        assert _colls(rows, "MatMul2") == (("allreduce", ("k",)),)
        assert _colls(rows, "MatMul3") == ()
        assert _colls(rows, "-> MatMul1") == (("alltoall", ("k",)),)
        assert [op for op, _ in _colls(rows, "-> MatMul2")] == ["alltoallv"]
        for label in ("-> ReLU1", "-> ReLU2", "-> MatMul3", "Flatten", "ReLU1", "ReLU2"):
            assert _colls(rows, label) == () and rows[label].max_sent == 0, label
        # Each rank built only its shards: 4 of the 32 images, a quarter of fc1's rows.
        assert result.outputs[0].local.shape == (4, 784)
        assert runner.params[1][0].local.shape == (196, 512)
        assert result.output.local.shape == (4, 10)
        # MatMul2's Allreduce of a (32, 512) float32 sum: 2 (g - 1) / g of 64 KiB.
        assert rows["MatMul2"].max_sent == 2 * 7 * 65536 // 8
        # The check is not vacuous: another seed's network fails on every rank.
        other = mindspore_tutorial(8, seed=6)
        wrong = result.output.check(lambda region: reference_rows(other, 6, region))
        assert not wrong.passed and len(wrong.failed_ranks) == 8
    finally:
        runner.close()


def test_tutorial_with_replicated_matmul3_allgathers_first():
    _eight()
    runner, result, verdicts, rows = _run(mindspore_tutorial(8, no_strategy="replicated"),
                                           every_hop=False)
    try:
        assert all(v.passed for v in verdicts)
        assert _colls(rows, "-> MatMul3") == (("allgather", ("axis_0",)),)
        assert result.output.local.shape == (32, 10)
    finally:
        runner.close()


def test_layout_network_checks_every_hop_with_the_planned_collectives():
    _eight()
    runner, result, verdicts, rows = _run(mindspore_layout(8, seed=2))
    try:
        assert all(v.passed for v in verdicts)
        assert all(row.matches() for row in rows.values())
        assert _colls(rows, "MatMul1") == (("allreduce", ("sp", "dp")),)
        assert _colls(rows, "MatMul2") == (("allreduce", ("tp",)),)
        assert _colls(rows, "-> ReLU2") == () and _colls(rows, "MatMul3") == ()
        # Rank 2 = device (0, 1, 0) holds x[0:16, 392:588] for MatMul1.
        x1 = result.outputs[1]
        if engines.world().rank == 2:
            assert x1.slices == (slice(0, 16), slice(392, 588))
        assert x1.local.shape == (16, 196)
    finally:
        runner.close()


def test_paddle_network_adapts_and_needs_two_allreduces():
    p = engines.world().size
    runner, result, verdicts, rows = _run(paddle_tp(p, seed=4))
    try:
        assert all(v.passed for v in verdicts)
        assert list(rows) == ["Embedding", "ColumnLinear", "RowLinear"]  # no redistribution
        assert _colls(rows, "Embedding") == (("allreduce", ("mp",)),)
        assert _colls(rows, "ColumnLinear") == ()
        assert _colls(rows, "RowLinear") == (("allreduce", ("mp",)),)
        assert result.outputs[1].local.shape == (4, 16, 240 // p)
        # (4, 16, 64) float32 reduced by a ring: 2 (p - 1) / p of 16 KiB per Allreduce.
        assert rows["RowLinear"].max_sent == 2 * (p - 1) * 16384 // p
    finally:
        runner.close()


def test_oneflow_networks_check_every_hop_with_the_planned_collectives():
    from spmdsim.models.nets import oneflow_2d_sbp, oneflow_2d_signature

    for make, expected in ((oneflow_2d_sbp, {"Linear1": (), "ReLU": (), "Linear2": ()}),
                           (oneflow_2d_signature, {"Linear1": (), "ReLU": (),
                                                   "-> Linear2": (("allgather", ("axis_0",)),),
                                                   "Linear2": ()})):
        runner, result, verdicts, rows = _run(make(engines.world().size, seed=5))
        try:
            assert all(v.passed for v in verdicts)
            assert {label: _colls(rows, label) for label in rows} == expected
            assert all(row.matches() for row in rows.values())
            # Every rank holds its (1, 2, 2) block of the (n, 2, 2) output, as the seed's to_local shows.
            assert result.output.local.shape == (1, 2, 2)
        finally:
            runner.close()


def test_demo_rows_pass_or_skip_with_a_reason():
    chosen = [sc for sc in scenarios() if sc.name.startswith("net_")]
    assert [sc.name for sc in chosen] == [
        "net_mindspore_tutorial", "net_mindspore_layout", "net_paddle_tp", "net_oneflow_2d_sbp",
        "net_oneflow_2d_signature"]
    outcomes = {sc.name: run_scenario(sc, Context(engines.world())) for sc in chosen}
    assert all(o.passed for o in outcomes.values())
    assert outcomes["net_oneflow_2d_sbp"].collectives == {}
    assert outcomes["net_oneflow_2d_signature"].collectives == {"allgather": 1}
    paddle = outcomes["net_paddle_tp"]
    assert paddle.skipped is None and paddle.collectives == {"allreduce": 2}
    for name in ("net_mindspore_tutorial", "net_mindspore_layout"):
        if engines.world().size == 8:
            assert outcomes[name].skipped is None and outcomes[name].collectives["allreduce"] == 2
        else:
            assert "need exactly 8 ranks" in outcomes[name].skipped
    if engines.world().size == 8:
        assert outcomes["net_mindspore_tutorial"].collectives == {
            "allreduce": 2, "alltoall": 1, "alltoallv": 1}


def test_module_main_prints_the_table_and_passes(capsys):
    from spmdsim.models.nets.__main__ import main

    assert main(["net_paddle_tp"]) == 0
    out = engines.rank_output(capsys)
    if engines.world().rank == 0:
        assert "Allreduce(mp) x1" in out and out.rstrip().endswith("PASS")
    else:
        assert out == ""
