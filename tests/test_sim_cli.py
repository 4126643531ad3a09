"""`--ranks N`: the demo, `spmdsim run` and every example on simulated ranks in this process."""
from __future__ import annotations

import pathlib
import runpy
import sys

import pytest

from spmdsim.cli.main import main
from testkit import EXAMPLE_ARGS

EXAMPLES = sorted((pathlib.Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


def test_demo_on_simulated_ranks_says_so_and_passes(capsys):
    assert main(["demo", "--ranks", "8", "--only", "matmul_2x4_4x1,net_paddle_tp"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "spmdsim: running on 8 simulated ranks in this process (--ranks 8), no MPI launcher"
    assert lines[1] == "spmdsim demo: 8 ranks, float32"
    assert "allreduce x1" in lines[3] and " 49,152 B " in lines[3] and lines[3].endswith("PASS")
    assert lines[-1] == "2 passed, 0 failed, 0 skipped"


def test_run_and_redistribute_on_simulated_ranks(capsys):
    assert main(["run", "matmul", "--strategy", "((2,4),(4,1))", "--shape", "16,32,8", "--ranks", "8"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("spmdsim: running on 8 simulated ranks") and "PASS" in out
    assert "allreduce over ('k',) (group of 4)" in out
    assert main(["run", "redistribute", "--device-matrix", "4", "--alias", "x", "--from", "x,None",
                 "--to", "None,x", "--shape", "8,8", "--ranks", "4"]) == 0
    assert "S(0)->S(1) via Alltoall on ('x',)" in capsys.readouterr().out


def test_errors_on_simulated_ranks_exit_like_mpi(capsys):
    # An SpmdsimError every rank raises: one line, exit 2 (as the MPI guard does).
    assert main(["run", "matmul", "--strategy", "((2,4),(4,1))", "--shape", "16,32,8", "--ranks", "6"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spmdsim: error: ") and "8" in err and err.count("\n") == 1
    assert main(["demo", "--dry-run"]) == 2
    assert "--dry-run needs --ranks N" in capsys.readouterr().err
    assert main(["demo", "--ranks", "8", "--only", "nosuch"]) == 2
    out = capsys.readouterr()  # the error alone: no "running on 8 simulated ranks" banner first
    assert out.out == "" and out.err.startswith("spmdsim: error: unknown scenario(s) ['nosuch']")


def test_one_process_names_both_ways_out(capsys):
    assert main(["run", "matmul", "--strategy", "((2,4),(4,1))", "--shape", "16,32,8"]) == 2
    err = capsys.readouterr().err
    assert "mpiexec -n 8 ..." in err and "--ranks 8" in err


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_runs_on_8_simulated_ranks(path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(path), "--ranks", "8"] + EXAMPLE_ARGS.get(path.stem, []))
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    assert out.startswith("spmdsim: running on 8 simulated ranks in this process")
    assert "PASS" in out or "passed" in out


def test_an_example_in_one_process_names_both_ways_out(monkeypatch):
    from spmdsim.errors import SpmdsimError

    path = next(p for p in EXAMPLES if p.stem == "matmul_2x4_4x1")
    monkeypatch.setattr(sys, "argv", [str(path)])
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    # One line (under 100 columns with its "spmdsim: error: " prefix) naming both ways.
    with pytest.raises(SpmdsimError, match=r"^this example needs 8 ranks, not 1: use --ranks 8 or mpiexec -n 8$"):
        runpy.run_path(str(path), run_name="__main__")
