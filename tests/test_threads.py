"""BLAS thread caps for ranks started by an MPI launcher."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spmdsim import _threads


@pytest.fixture
def clean_env(monkeypatch):
    for var in _threads.THREAD_VARS + _threads.LOCAL_SIZE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(_threads, "cores_available", lambda: 4)
    return monkeypatch


def test_no_launcher_leaves_environment_alone(clean_env):
    _threads.cap_blas_threads_under_launcher()
    assert not any(var in os.environ for var in _threads.THREAD_VARS)


def test_launcher_caps_threads_to_share_of_cores(clean_env):
    clean_env.setenv("MPI_LOCALNRANKS", "8")
    _threads.cap_blas_threads_under_launcher()
    assert [os.environ[v] for v in _threads.THREAD_VARS] == ["1", "1", "1"]
    clean_env.setenv("MPI_LOCALNRANKS", "2")
    for var in _threads.THREAD_VARS:
        clean_env.delenv(var)
    _threads.cap_blas_threads_under_launcher()
    assert os.environ["OMP_NUM_THREADS"] == "2"


def test_user_setting_wins(clean_env):
    clean_env.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "8")
    clean_env.setenv("OPENBLAS_NUM_THREADS", "3")
    _threads.cap_blas_threads_under_launcher()
    assert os.environ["OPENBLAS_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in os.environ


def test_importing_spmdsim_under_a_launcher_sets_the_cap_before_numpy():
    env = {k: v for k, v in os.environ.items() if k not in _threads.THREAD_VARS}
    env["MPI_LOCALNRANKS"] = "64"
    code = "import spmdsim, os; print(os.environ.get('OMP_NUM_THREADS'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1"
