"""scripts/bench_gpt.py's table (no --pipeline): each ratio is the median over launches of each launch's ratio
to the same round's launch of a run on the same engine, the same ranks and the same cores, printed with its
min-max, and the load average at the start and the end. Fed made-up launches: values only, no timing."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from testkit import load_script

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(_SCRIPTS))
    return load_script(_SCRIPTS / "bench_gpt.py", "spmdsim_script_bench_gpt")


def _launches(bench, scale: dict) -> dict:
    """Three rounds of launches: each worker's figures are its scale times the round's (1, 2, 4)."""
    rounds = (1.0, 2.0, 4.0)
    rows = {}
    for worker in bench.LAUNCHES + ("dtensor",):
        k = scale.get(worker, 1.0)
        rows[worker] = [{"step": 0.1 * k * r, "collectives": 0.05 * k * r, "waited": 0.03 * k * r,
                         "arrived": 0.02 * k * r,
                         "cpu": 0.2 * k * r, "losses": [4.7], "reference": [4.7], "grad_error": 0.0,
                         "param_error": 0.0} for r in rounds]
    return rows


def test_ratios_are_launch_by_launch_against_the_same_engine(bench, monkeypatch, capsys):
    rows = _launches(bench, {"simreplay": 1.02, "sim": 1.3, "mpireplay": 1.05, "mpi": 1.2, "hand2": 0.98,
                             "dtensor": 4.0})
    # one launch of the replayed MPI step far off: the median holds, the spread shows it
    rows["mpireplay"][1] = {key: value * 1.5 if key in ("step", "cpu") else value
                            for key, value in rows["mpireplay"][1].items()}
    monkeypatch.setattr(bench.os, "getloadavg", lambda: (3.0, 2.5, 1.25))
    bench._report(argparse.Namespace(launches=3, layers=4, d_model=128, seq=64), rows, "1.00 2.00 3.00", None)
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[1].startswith("load average at the start 1.00 2.00 3.00 (1, 5, 15 min); 3 launches")
    assert lines[-1] == "load average at the end 3.00 2.50 1.25"
    simulated = lines[:lines.index("8 MPI ranks (mpiexec), polite wait:")]
    table = {line[:44].rstrip(): line[44:].split() for line in simulated}
    assert table["  again (A/A control)"] == ["0.200", "1.00x", "the", "first", "(1.00-1.00)"]
    assert table["  spmdsim, replayed"][1:] == ["1.02x", "by", "hand", "(1.02-1.02)"]  # the simulated one
    assert table["  spmdsim"][1:] == ["1.27x", "replayed", "(1.27-1.27)"]
    # under each simulated step its ranks' CPU, against the same base
    replayed = simulated.index(next(line for line in simulated if line.startswith("  spmdsim, replayed")))
    assert simulated[replayed + 1].startswith("    CPU time of its 8 ranks")
    assert simulated[replayed + 1].endswith("0.408   1.02x by hand (1.02-1.02)")
    # the MPI section: the replayed step against the polite peer, round by round
    mpi = lines[lines.index("8 MPI ranks (mpiexec), polite wait:"):]
    rep = mpi.index(next(line for line in mpi if line.startswith("  spmdsim, replayed")))
    assert mpi[rep].endswith("1.05x by hand (1.05-1.58)")
    assert mpi[rep + 1].endswith("1.05x by hand (1.05-1.05)")  # its collectives: that launch alike
    assert (mpi[rep + 2].startswith("    waiting for a later member")
            and mpi[rep + 2].endswith("1.05x by hand (1.05-1.05)"))
    assert mpi[rep + 4].startswith("    CPU time of its 8 ranks") and mpi[rep + 4].endswith("1.05x by hand (1.05-1.58)")
    assert mpi[rep - 5].endswith("0.98x by hand (0.98-0.98)")  # the A/A control's step
    assert [line for line in lines if "replayed / DTensor" in line][0].endswith("0.26x (0.26-0.39)")


def test_a_failed_launch_is_left_out_of_its_ratios(bench, capsys):
    rows = _launches(bench, {"simreplay": 1.1})
    rows["handsim"][0] = None
    bench._report(argparse.Namespace(launches=3, layers=4, d_model=128, seq=64), rows, "1.00 1.00 1.00",
                  "PyTorch DTensor: not installed")
    out = capsys.readouterr().out
    assert "  spmdsim, replayed                             0.220   1.10x by hand (1.10-1.10)" in out
    assert "PyTorch DTensor: not installed" in out


def test_every_launch_runs_on_the_heap_spmdsims_mpi_ranks_keep(bench, monkeypatch):
    """Every launch (spmdsim's eager and replayed steps, the peers', the one process's) runs with the glibc heap
    thresholds that spmdsim's MPI ranks set for themselves (tune_mpi_process), so no ratio compares two heaps:
    under glibc's defaults a step that allocates its results afresh gives its freed heap top back and faults it
    in again each step. A variable the user set wins, and then none is added."""
    for var in bench.glibc_env({}):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    args = argparse.Namespace(steps=1, layers=1, d_model=16, seq=8, microbatches=8)
    from spmdsim.base import malloc as _malloc
    workers = ("ref", "one", "sim", "simreplay", "handsim", "hand", "mpi", "mpireplay", "psim", "psimhand", "msim",
               "msimhand", "moe", "mhand")
    for worker in workers:
        env = bench._command(args, worker)[1]
        assert env["MALLOC_TRIM_THRESHOLD_"] == str(_malloc.TRIM_THRESHOLD), worker
        assert env["MALLOC_MMAP_THRESHOLD_"] == str(_malloc.MMAP_THRESHOLD), worker
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    for worker in workers:
        env = bench._command(args, worker)[1]
        assert env["MALLOC_TRIM_THRESHOLD_"] == "131072" and "MALLOC_MMAP_THRESHOLD_" not in env, worker
