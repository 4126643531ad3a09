"""Two runs saving checkpoints into one directory at once (spmdsim.models.gpt.checkpoint_lock): the second is
refused in one line naming the directory and the run that holds it, before it trains, alike on every rank; the
first's checkpoint stays whole and resumable; a lock file a killed run left blocks nothing."""
from __future__ import annotations

import os
import subprocess
import sys
import time

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


def test_two_runs_saving_into_one_directory_the_second_refused_the_first_whole(tmp_path):
    where = tmp_path / "ck"
    cmd, env = _example("--steps", "300", "--save-every", "1", "--save", str(where))
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        began = time.monotonic()
        while not (where / META).exists() and first.poll() is None and time.monotonic() - began < 120:
            time.sleep(0.05)  # the first run has saved once: it is training, saving every step
        assert first.poll() is None, "the first run ended before the second started"
        cmd, env = _example("--steps", "3", "--lr", "0.01", "--save", str(where))
        second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        assert first.poll() is None, "the first run ended before the second was refused: a slower first run needed"
    finally:
        _, err = first.communicate(timeout=120)
    assert second.returncode == 2
    assert unfold(second.stderr).strip().splitlines() == [
        "spmdsim: error: " + BUSY.format(d=where, pid=first.pid)]
    assert first.returncode == 0, err
    assert read_meta(str(where))[0]["step"] == 300  # the first's checkpoint, whole: nothing of the second's
    assert sorted(os.listdir(where)) == [META, "rank-00000.npz", "rank-00001.npz"]
    cmd, env = _example("--steps", "302", "--resume", str(where))
    resumed = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert resumed.returncode == 0 and f"resuming from {where} at step 300" in unfold(resumed.stdout), resumed.stderr
