"""Classroom output under MPI: fits 100 columns, ranks print in order, traces export."""
from __future__ import annotations

import pytest
from mpi4py import MPI

from spmdsim.tools.cli.main import main
from spmdsim.runtime.ranked import print_ranked, rank_ordered

pytestmark = pytest.mark.mpi(min_size=2)


def _widest(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


def test_demo_fits_100_columns(capsys):
    # The rows with the longest cells (the whole demo runs in test_ops_commands).
    assert main(["demo", "--only", "net_mindspore_tutorial", "net_paddle_tp", "matmul_out_strategy",
                 "matmul_layout_tuple", "embedding_vocab", "linear_row"]) == 0
    out = capsys.readouterr().out
    if MPI.COMM_WORLD.rank == 0:
        assert _widest(out) <= 100, out
        assert out.splitlines()[0] == f"spmdsim demo: {MPI.COMM_WORLD.size} ranks, float32"


def _explain_runs(p: int) -> list[list[str]]:
    return [["matmul", "--strategy", f"((2,{p // 2}),({p // 2},1))", "--shape", f"8,{4 * p},6"],
            ["linear", "--parallel", "row", "--shape", f"4,{2 * p},6"],
            ["linear", "--front", "paddle", "--shape", f"4,6,{3 * p}"],
            ["embedding", "--mode", "vocab", "--shape", f"8,{4 * p},16"],
            ["embedding", "--mode", "dim", "--shape", f"8,16,{2 * p}"],
            ["mlp", "--shape", f"4,6,{3 * p}"],
            ["redistribute", "--device-matrix", str(p), "--alias", "x", "--from", "x,None",
             "--to", "None,x", "--shape", f"{p},{p}"]]


@pytest.mark.parametrize("index", range(7), ids=["matmul", "linear-row", "linear-paddle",
                                                 "embedding-vocab", "embedding-dim", "mlp",
                                                 "redistribute"])
def test_run_explain_of_each_operator_fits_100_columns(capsys, index):
    comm = MPI.COMM_WORLD
    if comm.size % 2:
        pytest.skip("the MatMul strategy here needs an even world size")
    argv = _explain_runs(comm.size)[index]
    assert main(["run", *argv, "--explain"]) == 0
    out = capsys.readouterr().out
    if comm.rank == 0:
        assert _widest(out) <= 100, out
        assert out.rstrip().endswith("PASS"), out
        assert "why" in out, out


def test_print_ranked_over_world_and_self(capsys):
    for comm in (MPI.COMM_SELF, MPI.COMM_WORLD):
        print_ranked(comm, "same on every rank", f"size {comm.size}")
        out = capsys.readouterr().out
        if comm.rank == 0:
            who = "rank 0" if comm.size == 1 else f"ranks 0-{comm.size - 1}"
            assert out == f"{who}:\n  same on every rank\n  size {comm.size}\n", out
        else:
            assert out == ""
    comm = MPI.COMM_WORLD
    with rank_ordered(comm) as out:
        out.print("parity", comm.rank % 2)
    text = capsys.readouterr().out
    if comm.rank == 0:
        evens = ",".join(str(r) for r in range(0, comm.size, 2))
        odds = ",".join(str(r) for r in range(1, comm.size, 2))
        assert text == f"ranks {evens}: parity 0\nranks {odds}: parity 1\n", text


def test_trace_out_writes_one_track_per_rank_with_each_collectives_bytes(capsys, tmp_path):
    import json
    import pathlib

    jsonschema = pytest.importorskip("jsonschema")
    comm = MPI.COMM_WORLD
    path = comm.bcast(str(tmp_path / "run.json"))  # rank 0's temp dir
    p = comm.size
    assert main(["run", "matmul", "--strategy", f"((1,{p}),({p},1))", "--shape", f"4,{2 * p},6",
                 "--trace-out", path]) == 0
    capsys.readouterr()
    if comm.rank == 0:
        obj = json.loads(pathlib.Path(path).read_text())
        schema = pathlib.Path(__file__).parents[1] / "data" / "chrome_trace_event.schema.json"
        jsonschema.validate(obj, json.loads(schema.read_text()))
        colls = [e for e in obj["traceEvents"] if e.get("cat") == "collective"]
        assert sorted(e["pid"] for e in colls) == list(range(p))
        # The Allreduce of 4x6 float32 partial sums over p ranks: 2 (p-1)/p * 96 bytes each.
        assert {e["args"]["bytes_sent"] for e in colls} == {2 * (p - 1) * 96 // p}
        assert {e["name"] for e in obj["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    comm.Barrier()
