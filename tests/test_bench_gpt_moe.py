"""scripts/bench_gpt.py --moe: spmdsim's MoE GPT step, eager and replayed, beside the same step by hand on mpi4py.

One launch of each at a tiny size (2 layers, the second an MoE layer, on dp 2 x ep 2 x tp 2): every row is
printed once, the hand-written step's loss at step 0 is spmdsim's (eager and replayed) and the one process's, its
gradients and parameters the one process's, and both sides make the same collectives a step. Values only, never
timings. --simulated adds the simulated rows (launches faked here); the refusals are one line each.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from docs_commands import run_here
from testkit import MPIEXEC, bench_launches, load_script

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
_SMALL = ["--layers", "2", "--d-model", "16", "--seq", "8"]


def _value(line: str, after: str) -> float:
    return float(line.split(after, 1)[1].split()[0].rstrip(","))


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec")
def test_one_launch_prints_every_row_and_agrees_on_the_loss_and_the_collectives(bench, monkeypatch, capsys,
                                                                                tmp_path):
    """Each launch is the script's own command (its _command), its result parsed as the script parses it, the
    8-rank launches run as programs of one mpiexec job (testkit.batch_launches); the A/A control ("mhand2")
    reuses the checked launch of the same command (only --check differs)."""
    args = argparse.Namespace(steps=1, layers=2, d_model=16, seq=8, microbatches=None)
    results = bench_launches(bench, args, [("mhand", 1), ("moereplay", 0), ("moe", 0)], tmp_path)
    again, first = bench._command(args, "mhand2", 0)[0], bench._command(args, "mhand", 1)[0]
    at = again.index("--check") + 1
    assert again[:at] + again[at + 1:] == first[:at] + first[at + 1:]
    results["mhand2"] = results["mhand"]
    launched = []
    monkeypatch.setattr(bench, "_launch", lambda args, worker, check=0: launched.append((worker, check)) or
                        results[worker])
    monkeypatch.setattr(sys, "argv", ["bench_gpt.py", "--moe", "--launches", "1", "--steps", "1", *_SMALL])
    assert bench.main() == 0
    assert launched == [("mhand", 1), ("moereplay", 0), ("moe", 0), ("mhand2", 0)], launched
    printed = capsys.readouterr()
    done = argparse.Namespace(stdout=printed.out, stderr=printed.err)
    assert done.stderr == "", done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[0] == "MoE GPT 2 layers (1 MoE), d_model 16, seq 8, batch 8; 4 experts, top-2, capacity factor 1"
    assert lines[1].startswith("mesh dp 2 x ep 2 x tp 2 (sequence parallel); ")
    rows = [line.split("  ")[1] for line in lines if line.startswith("  ") and not line.startswith("    ")]
    assert rows == ["numpy + mpi4py by hand", "the same again (A/A control)", "spmdsim, replayed", "spmdsim"]
    ratios = {"  the same again": "x by hand (", "  spmdsim, replayed": "x by hand (", "  spmdsim   ": "x replayed ("}
    for start, versus in ratios.items():
        at = next(i for i, line in enumerate(lines) if line.startswith(start))
        # the step and its four figures, each with its ratio: the median of one launch's is its min and max
        for line in lines[at:at + 5]:
            ratio = line.split(versus)[0].split()[-1]
            assert line.endswith(f"{ratio}-{ratio})"), line
        assert [line.split("  ")[2].strip() for line in lines[at + 1:at + 5]] == [
            "its collectives", "waiting for a later member", "after the last member arrived",
            "CPU time of its 8 ranks"], lines[at:at + 5]
    [calls] = [line for line in lines if line.startswith("collectives a step, each rank: ")]
    # per step: 4 + 3 Reduce_scatter/Allgather pairs and the final LayerNorm's Allgather, the MoE layer's
    # Alltoall, Allreduce over tp, Alltoall and its counts' Allreduce, 3 in the cross-entropy, 1 for the router
    # losses; backward 6 Allgather/Reduce_scatter, 2 Alltoall; 3 gradient sums (dp x ep, all ranks, dp)
    assert calls == "collectives a step, each rank: spmdsim 32 (replayed 32), by hand 32 (equal)"
    [loss] = [line for line in lines if line.startswith("step 0 loss: spmdsim ")]
    assert _value(loss, "|diff| ") <= 1e-10, loss
    [one] = [line for line in lines if line.startswith("step 0 loss: one numpy process ")]
    assert _value(one, "process ") == pytest.approx(_value(loss, "by hand "), abs=1e-10, rel=0)
    [grads] = [line for line in lines if line.startswith("by hand, after step 0: gradients within ")]
    assert _value(grads, "gradients within ") <= 1e-10 and _value(grads, "parameters within ") <= 1e-10, grads
    assert lines[-1].startswith("load average at the end ") and lines[2].startswith("load average at the start ")


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(_SCRIPTS))
    return load_script(_SCRIPTS / "bench_gpt.py", "spmdsim_script_bench_gpt")


def _args(**kw):
    base = dict(launches=2, steps=1, layers=2, d_model=16, seq=8, microbatches=None, replay=False, simulated=False,
                moe=True, pipeline=False)
    return argparse.Namespace(**{**base, **kw})


_ROW = dict(step=0.1, collectives=0.05, waited=0.01, arrived=0.04, cpu=0.2, calls=32, loss0=4.5,
            losses=[4.5], reference=[4.5], grad_error=1e-16, param_error=1e-15)


def test_simulated_adds_the_peer_and_the_replayed_step_on_simulated_ranks(bench, monkeypatch, capsys):
    launched = []
    monkeypatch.setattr(bench, "_mpiexec", lambda: "mpiexec")
    monkeypatch.setattr(bench, "_launch", lambda args, worker, check=0: launched.append((worker, check)) or dict(
        _ROW, step=0.15 if worker == "msim" else 0.1))
    assert bench._moe(_args(simulated=True)) == 0
    order = ["mhand", "moereplay", "moe", "mhand2", "msimhand", "msim", "msimhand2"]
    assert launched == [(w, int(w == "mhand")) for w in order] + [(w, 0) for w in order]  # the peer checks once
    out = capsys.readouterr().out
    assert f"{'  spmdsim, replayed':44} {0.15:8.3f}   1.50x by hand (1.50-1.50)" in out
    assert "8 simulated ranks (threads of one process; the peer under spmdsim mpirun, blocking calls):" in out
    monkeypatch.undo()
    cmds = []
    monkeypatch.setattr(bench.subprocess, "run", lambda c, **kw: cmds.append(c) or subprocess.CompletedProcess(
        c, 0, "RESULT {}\n", ""))
    for worker in ("msimhand", "msim", "mhand", "moereplay"):
        bench._launch(_args(), worker)
    simhand, sim, hand, replayed = cmds
    assert simhand[4:10] == [sys.executable, "-m", "spmdsim", "mpirun", "-n", "8"] and simhand[-2:] == [
        "--wait", "busy"], simhand
    assert "mpiexec" not in " ".join(sim) and sim[sim.index("--worker") + 1] == "msim", sim
    assert hand[5:7] == ["-n", "8"] and hand[8].endswith("peer_mpi4py_moe.py"), hand
    assert hand[-2:] == ["--wait", "polite"] and " --dp 2 --ep 2 --tp 2 " in " ".join(hand) + " ", hand
    assert replayed[-3:] == ["--worker", "moereplay", "--moe"], replayed


def test_differing_collectives_or_losses_exit_1_and_the_refusals_are_one_line(bench, monkeypatch, capsys):
    monkeypatch.setattr(bench, "_mpiexec", lambda: "mpiexec")
    monkeypatch.setattr(bench, "_launch", lambda args, worker, check=0: dict(
        _ROW, calls=31 if worker == "moe" else 32))
    assert bench._moe(_args(launches=1)) == 1
    assert capsys.readouterr().err == "bench_gpt --moe: the collectives a step differ\n"
    monkeypatch.setattr(bench, "_launch", lambda args, worker, check=0: dict(_ROW, loss0=4.6))
    assert bench._moe(_args(launches=1)) == 1
    assert capsys.readouterr().err == "bench_gpt --moe: step 0's losses differ by 1.0e-01\n"
    monkeypatch.setattr(bench, "_mpiexec", lambda: "")
    assert bench._moe(_args()) == 1
    assert capsys.readouterr().err.startswith("bench_gpt --moe: no mpiexec beside python or on PATH")
    for argv, message in ((["--simulated"], "--simulated applies to --pipeline and --moe only"),
                          (["--moe", "--pipeline"], "--moe and --pipeline are separate cases: give one")):
        code, _, err = run_here("scripts/bench_gpt.py", argv)  # refused before any launch: in process
        assert code == 2 and err.splitlines()[-1].endswith("error: " + message), err


PEER_REFUSALS = [
    (["--ep", "0"], "peer_mpi4py_moe.py: error: --ep 0 must be at least 1"),
    (["--experts", "3"], "peer_mpi4py_moe: --experts 3 are not divisible by --ep 2"),
    (["--dp", "4", "--ep", "4"], "peer_mpi4py_moe: the batch of 8 samples is not divisible by --dp 4 x --ep 4"),
    (["--capacity-factor", "0"], "peer_mpi4py_moe: MoEConfig capacity_factor 0.0 must be a finite number > 0 "
                                 "(or dropless=True)"),
    ([], "peer_mpi4py_moe: --dp 2 x --ep 2 x --tp 2 is 8 ranks; mpiexec started 1"),
]


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> list:
    """`python scripts/peer_mpi4py_moe.py ARGV` for each of PEER_REFUSALS, run in turn by one interpreter where they
    can be (testkit.run_scripts: each as a fresh interpreter runs it)."""
    from testkit import run_scripts

    return run_scripts([(_SCRIPTS / "peer_mpi4py_moe.py", argv) for argv, _ in PEER_REFUSALS],
                       tmp_path_factory.mktemp("refused"))


@pytest.mark.parametrize("index", range(len(PEER_REFUSALS)))
def test_the_moe_peer_refuses_a_bad_value_in_one_line(index, refused):
    needle, done = PEER_REFUSALS[index][1], refused[index]
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == needle, done.stderr
