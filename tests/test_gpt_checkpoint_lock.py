"""Two runs saving checkpoints into one directory at once (spmdsim.models.gpt.checkpoint_lock): the second is
refused in one line naming the directory and the run that holds it, before it trains, alike on every rank; the
first's checkpoint stays whole and resumable; a lock file a killed run left blocks nothing."""
from __future__ import annotations

import os
import subprocess
import sys

import spmdsim
from spmdsim.errors import SpmdsimError
from spmdsim.models.gpt import GPTConfig, encode, load_text
from spmdsim.models.gpt.checkpoint import META, read_meta
from spmdsim.models.gpt.checkpoint_lock import LOCK, _release, _take
from spmdsim.models.gpt.train import train
from testkit import unfold

SMALL = GPTConfig(layers=1, d_model=16, heads=2, seq=8, batch=2)
TEXT = encode(load_text(20_000))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--ranks", "2", "--layers", "1", "--d-model", "16", "--heads", "2", "--seq", "8", "--batch", "2",
        "--no-check", "--sample", "0"]
BUSY = "--save {d}: another run (pid {pid}) is saving into this directory; give another directory or wait for it " \
       "to finish"


def _train(where, steps=2):
    """Each rank's outcome of SMALL trained on 2 simulated ranks saving into `where`: "ok", or the line raised."""
    def body():
        try:
            train(SMALL, spmdsim.world(), 1, 2, steps, TEXT, check=False, save=str(where))
        except SpmdsimError as e:
            return str(e)
        return "ok"

    return spmdsim.simulate(2, body)


def test_a_run_saving_where_another_holds_the_lock_is_refused_alike_on_every_rank(tmp_path):
    held, problem = _take(str(tmp_path))  # another run's lock (this process's, on its own open file)
    assert problem is None
    try:
        assert _train(tmp_path) == [BUSY.format(d=tmp_path, pid=os.getpid())] * 2
    finally:
        _release(*held)
    assert os.listdir(tmp_path) == []  # refused before any step: nothing written
    assert _train(tmp_path) == ["ok"] * 2  # released: the directory is free again
    assert sorted(os.listdir(tmp_path)) == [META, "rank-00000.npz", "rank-00001.npz"]  # the lock file removed


def test_a_lock_file_a_killed_run_left_blocks_nothing(tmp_path):
    (tmp_path / LOCK).write_text("999999999 elsewhere\n")  # its process gone: no flock held on it
    assert _train(tmp_path) == ["ok"] * 2
    assert read_meta(str(tmp_path))[0]["step"] == 2 and not (tmp_path / LOCK).exists()


def _example(*argv):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return [sys.executable, os.path.join(ROOT, "examples", "train_gpt.py"), *TINY, *argv], env


def test_a_second_run_is_refused_in_one_line_and_the_checkpoint_there_stays_whole(tmp_path):
    """The example run as a user runs it, while this process holds the lock as another run saving there would (the
    same flock, from another process): exit 2, one line, the checkpoint already there untouched and resumable."""
    assert _train(tmp_path) == ["ok"] * 2
    before = {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)}
    held, problem = _take(str(tmp_path))
    assert problem is None
    try:
        cmd, env = _example("--steps", "3", "--lr", "0.01", "--save", str(tmp_path))
        second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    finally:
        _release(*held)
    assert second.returncode == 2
    assert unfold(second.stderr).strip().splitlines() == [
        "spmdsim: error: " + BUSY.format(d=tmp_path, pid=os.getpid())]
    assert {name: (tmp_path / name).read_bytes() for name in os.listdir(tmp_path)} == before
    cmd, env = _example("--steps", "3", "--resume", str(tmp_path))
    resumed = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert resumed.returncode == 0 and f"resuming from {tmp_path} at step 2" in unfold(resumed.stdout), resumed.stderr
