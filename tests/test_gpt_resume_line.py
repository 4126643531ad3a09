"""The training examples' resume line (spmdsim.models.gpt.checkpoint.resume_line): "resuming from DIR at step N"
is printed once every rank's load succeeded, so a resume whose load refuses (a rank's file damaged or missing)
prints its refusal alone, on simulated ranks and under mpiexec; a resume that loads prints the line above the
steps' table header, as docs/howto/checkpoints.md shows it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from docs_commands import run_example
from spmdsim.models.gpt.checkpoint import rank_file
from testkit import MPIEXEC, unfold

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ("train_gpt.py", "train_moe_gpt.py")
SMALL = ("--layers", "2", "--d-model", "16", "--heads", "2", "--seq", "8", "--batch", "4")


def _small(example):
    """The flags of a small, quick run of `example` (no sample drawn)."""
    return (*SMALL, "--sample", "0") if example == "train_gpt.py" else SMALL


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{example: (a checkpoint of 1 step on 4 ranks, the same with rank 1's file damaged)}."""
    found = {}
    for example in EXAMPLES:
        where = tmp_path_factory.mktemp(example.split(".")[0])
        done = run_example(f"examples/{example}", "--ranks", "4", *_small(example), "--steps", "1", "--save",
                           str(where / "ck"))
        assert done.returncode == 0, done.stderr
        (where / "damaged").mkdir()
        for name in os.listdir(where / "ck"):
            (where / "damaged" / name).write_bytes((where / "ck" / name).read_bytes())
        with open(rank_file(str(where / "damaged"), 1), "w") as f:
            f.write("junk")
        found[example] = (str(where / "ck"), str(where / "damaged"))
    return found


def _refusal(damaged):
    return (f"spmdsim: error: --resume {damaged}: rank 1's file {rank_file(damaged, 1)} is not a .npz file "
            "(damaged, or not written by --save)")


@pytest.mark.parametrize("example", EXAMPLES)
def test_a_refused_resume_prints_its_refusal_without_a_resume_line(saved, example):
    good, damaged = saved[example]
    done = run_example(f"examples/{example}", "--ranks", "4", *_small(example), "--steps", "3", "--resume", damaged)
    assert done.returncode == 2
    assert "resuming from" not in done.stdout + done.stderr, done.stdout
    assert " step    loss" not in done.stdout  # nor the steps' table header
    assert unfold(done.stderr).splitlines()[-1] == _refusal(damaged)
    done = run_example(f"examples/{example}", "--ranks", "4", *_small(example), "--steps", "3", "--every", "1",
                       "--resume", good)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    at = lines.index(f"resuming from {good} at step 1")
    assert lines[at + 1].startswith(" step    loss") and [line.split()[0]
                                                          for line in lines[at + 2:at + 4]] == ["1", "2"]


@pytest.mark.skipif(not MPIEXEC, reason="no mpiexec")
@pytest.mark.parametrize("example", EXAMPLES)
def test_a_refused_resume_under_mpiexec_prints_its_refusal_without_a_resume_line(saved, example):
    damaged = saved[example][1]
    done = subprocess.run(["timeout", "-k", "5", "120", MPIEXEC, "-n", "4", sys.executable, f"examples/{example}",
                           *_small(example), "--steps", "3", "--resume", damaged], capture_output=True, text=True,
                          cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 2, done.stderr
    assert "resuming from" not in done.stdout + done.stderr, done.stdout
    assert unfold(done.stderr).count(_refusal(damaged)) == 1, done.stderr  # rank 0's line alone
