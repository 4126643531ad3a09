"""scripts/bench_gpt.py --pipeline: spmdsim's pipelined step beside the same 1F1B step by hand on mpi4py.

One launch of each (a 4-layer GPT of d_model 32 on 4 MPI ranks, one timed step):
the hand-written step's loss at step 0 is spmdsim's and the one process's, its
gradients the one process's, and both sides send the same point-to-point bytes,
the count a 1F1B step over pp 4 must send. Values only, never timings. Without
mpiexec the case is one line; bytes or losses that differ make it exit 1.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import MPIEXEC, load_script

_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
_SMALL = ["--layers", "4", "--d-model", "32", "--seq", "16"]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(_SCRIPTS))
    return load_script(_SCRIPTS / "bench_gpt.py", "spmdsim_script_bench_gpt")


def _value(line: str, after: str) -> float:
    return float(line.split(after, 1)[1].split()[0].rstrip(","))


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec")
def test_one_launch_agrees_on_the_loss_and_the_bytes():
    done = subprocess.run([sys.executable, str(_SCRIPTS / "bench_gpt.py"), "--pipeline", "--launches", "1",
                           "--steps", "1", *_SMALL], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    for row in ("numpy + mpi4py by hand, 1F1B", "the same again (A/A control)", "spmdsim train_pipelined, 1F1B"):
        assert sum(line.startswith(row) for line in lines) == 1, (row, done.stdout)
    [sent] = [line for line in lines if line.startswith("point-to-point bytes a step, all ranks: ")]
    ours, theirs = _value(sent, "spmdsim "), _value(sent, "by hand ")
    # 3 boundaries x 8 microbatches x (activation + gradient) of 16 x 1 x 32 float64, and the tied table's
    # gradient (128 x 32 float64) each way between the first and the last stage
    assert ours == theirs == 3 * 8 * 2 * 16 * 32 * 8 + 2 * 128 * 32 * 8, sent
    assert sent.endswith("(equal)")
    [loss] = [line for line in lines if line.startswith("step 0 loss: spmdsim ")]
    assert _value(loss, "|diff| ") <= 1e-10, loss
    assert _value(loss, "spmdsim ") == pytest.approx(_value(loss, "by hand "), abs=1e-10, rel=0)
    [one] = [line for line in lines if line.startswith("step 0 loss: one numpy process ")]
    assert _value(one, "process ") == pytest.approx(_value(loss, "by hand "), abs=1e-10, rel=0)
    [grads] = [line for line in lines if line.startswith("by hand, after step 0: gradients within ")]
    assert _value(grads, "within ") <= 1e-10, grads


def _args(bench, **kw):
    import argparse

    base = dict(launches=1, steps=1, layers=4, d_model=32, seq=16, microbatches=8)
    return argparse.Namespace(**{**base, **kw})


def test_without_mpiexec_it_is_one_line(bench, monkeypatch, capsys):
    monkeypatch.setattr(bench, "_mpiexec", lambda: "")
    assert bench._pipeline(_args(bench)) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1
    assert out.err.startswith("bench_gpt --pipeline: no mpiexec beside python or on PATH (pip install mpich)")


@pytest.mark.parametrize("pipe, needle", [
    ({"p2p_bytes": 8, "p2p_bytes_steps": [8]}, "different point-to-point bytes"),
    ({"loss0": 4.5}, "step 0's losses differ by 2.0e-01"),
])
def test_bytes_or_losses_that_differ_exit_1(bench, monkeypatch, capsys, pipe, needle):
    hand = {"step": 0.1, "messages": 0.05, "p2p_bytes": 4, "p2p_bytes_steps": [4], "loss0": 4.7,
            "reference0": 4.7, "grad_error": 0.0}
    ours = {**hand, **pipe}
    monkeypatch.setattr(bench, "_mpiexec", lambda: "mpiexec")
    monkeypatch.setattr(bench, "_launch", lambda args, worker: dict(ours if worker == "pipe" else hand))
    assert bench._pipeline(_args(bench)) == 1
    out = capsys.readouterr()
    assert needle in out.err and "Traceback" not in out.err
