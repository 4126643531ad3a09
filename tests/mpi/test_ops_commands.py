"""`spmdsim run` and `spmdsim demo` in-process under MPI (rank 0 prints)."""
from __future__ import annotations

import json

import pytest

from spmdsim.tools.cli.main import main

pytestmark = pytest.mark.mpi(min_size=2)


def _world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


def test_demo_json_records(capsys):
    rc = main(["demo", "--json", "--dtype", "float64"])
    out = capsys.readouterr().out
    assert rc == 0
    records = _world().bcast(json.loads(out) if _world().rank == 0 else None)
    names = [r["scenario"] for r in records]
    assert {"matmul_2x4_4x1", "matmul_layout_tuple", "embedding_vocab", "linear_row",
            "linear_column", "mlp"} <= set(names)
    for r in records:
        assert {"scenario", "passed", "max_abs_error", "collectives", "bytes_sent_per_rank"} <= set(r)
        assert r["passed"] is True
    by_name = {r["scenario"]: r for r in records}
    assert by_name["mlp"]["collectives"] == {"allreduce": 1}
    if _world().size == 8:
        assert by_name["matmul_2x1_1x4"]["collectives"] == {}
        assert by_name["matmul_out_strategy"]["collectives"] == {"reduce_scatter": 1}
    else:
        assert "skipped" in by_name["matmul_layout_tuple"]


def test_run_matmul_explain(capsys):
    size = _world().size
    rc = main(["run", "matmul", "--strategy", f"((1,{size}),({size},1))", "--shape", "6,40,10",
               "--explain"])
    text = capsys.readouterr().out
    assert rc == 0
    if _world().rank == 0:
        assert "PASS" in text and "allreduce over ('k',)" in text
        # Each rank names its group; the reason is said once, for all ranks.
        assert f"\n  Allreduce over ranks {{{','.join(map(str, range(size)))}}}\n" in text
        assert text.count("why Allreduce: contraction dim K is split over \"k\", so each rank holds a "
                          "partial sum") == 1
        assert f"  ranks 0-{size - 1}: allreduce over ('k',) (group of {size}): sent " in text
        assert max(len(line) for line in text.splitlines()) <= 100
        assert text.count("rank ") >= size
        # Each rank's line names the global block of each input it holds: rank 1 has K's second quarter.
        assert f"rank 1 (0, 1, 0): holds x[0:6, {40 // size}:{2 * 40 // size}], w[{40 // size}:" in text


def test_run_linear_embedding_mlp(capsys):
    size = _world().size
    for argv in (["run", "linear", "--parallel", "row", "--shape", f"6,{3 * size},5", "--json"],
                 ["run", "linear", "--front", "paddle", "--gather-out",
                  "--shape", f"6,10,{3 * size}", "--json"],
                 ["run", "embedding", "--shape", f"7,{5 * size},6", "--json"],
                 ["run", "mlp", "--shape", f"6,10,{3 * size}", "--dtype", "float64", "--json"]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        if _world().rank == 0:
            assert json.loads(out)["passed"] is True


def test_a_wrong_result_reports_fail_on_every_rank():
    from spmdsim.tools.cli.run_report import report
    from spmdsim.tools.demo.jobs import mlp_job
    from spmdsim.tools.demo.registry import rank_line, run_job

    comm = _world()
    job = mlp_job(comm, (4, 6, 2 * comm.size), dtype="float64")
    good = job.reference
    job.reference = lambda region: good(region) + 1e-3  # a reference the result cannot match
    result = run_job(job, comm)
    assert not result.verdict.passed and result.verdict.max_abs_error > 9e-4
    text = report(job, result, [[rank_line(job, result.out)]])
    assert text.endswith("FAIL") and "allreduce over ('mp',)" in text


@pytest.mark.parametrize("x_sbp, w_sbp, out_sbp, collectives", [
    # OneFlow's 2D signature (seed 002): x (B, S(0)) @ w (S(1), B) = y (S(1), S(0)), no communication.
    ("B,S(0)", "S(1),B", None, {}),
    # K split on axis_0 on both sides: a pending sum over axis_0, resolved by Allreduce ...
    ("S(1),B", "S(0),B", None, {"allreduce": 1}),
    # ... or by Reduce_scatter when the wanted output splits rows over axis_0.
    ("S(1),B", "S(0),B", "S(0),B", {"reduce_scatter": 1}),
    # A pending-sum input stays linear through the product.
    ("P,B", "B,B", None, {"allreduce": 1}),
])
def test_run_matmul_with_sbp(capsys, x_sbp, w_sbp, out_sbp, collectives):
    size = _world().size
    if size % 2:
        pytest.skip("the placement is 2 x n")
    argv = ["run", "matmul", "--shape", f"8,{2 * size},{2 * size}", "--placement", f"2,{size // 2}",
            "--x-sbp", x_sbp, "--w-sbp", w_sbp, "--json"] + (["--out-sbp", out_sbp] if out_sbp else [])
    rc = main(argv)
    out = capsys.readouterr().out
    assert rc == 0
    record = _world().bcast(json.loads(out) if _world().rank == 0 else None)
    assert record["passed"] is True and record["collectives"] == collectives
    assert record["op"] == f"MatMul sbp x ({x_sbp}) w ({w_sbp})"
