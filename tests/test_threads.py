"""BLAS thread caps for ranks started by an MPI launcher; `import spmdsim` changes nothing."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spmdsim.base import malloc as _malloc, threads as _threads


@pytest.fixture
def clean_env(monkeypatch):
    saved = dict(os.environ)  # the code under test sets variables itself: put them all back
    for var in _threads.THREAD_VARS + _threads.LOCAL_SIZE_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(_threads, "cores_available", lambda: 4)
    capped: list = []
    monkeypatch.setattr(_threads, "cap_loaded_blas", capped.append)
    yield monkeypatch, capped
    os.environ.clear()
    os.environ.update(saved)


def test_no_launcher_leaves_environment_alone(clean_env):
    assert _threads.cap_blas_threads_under_launcher() is None and clean_env[1] == []
    assert not any(var in os.environ for var in _threads.THREAD_VARS)


def test_launcher_caps_threads_to_share_of_cores(clean_env):
    env, capped = clean_env
    env.setenv("MPI_LOCALNRANKS", "8")
    assert _threads.cap_blas_threads_under_launcher() == 1 and capped == [1]
    assert [os.environ[v] for v in _threads.THREAD_VARS] == ["1", "1", "1"]
    env.setenv("MPI_LOCALNRANKS", "2")
    for var in _threads.THREAD_VARS:
        del os.environ[var]  # not env.delenv: its undo would put the "1" back
    _threads.cap_blas_threads_under_launcher()
    assert os.environ["OMP_NUM_THREADS"] == "2" and capped == [1, 2]


def test_user_setting_wins(clean_env):
    env, capped = clean_env
    env.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "8")
    env.setenv("OPENBLAS_NUM_THREADS", "3")
    # The user's value reaches the BLAS numpy loaded before it was set; nothing else is set.
    assert _threads.cap_blas_threads_under_launcher() is None and capped == [3]
    assert os.environ["OPENBLAS_NUM_THREADS"] == "3"
    assert "OMP_NUM_THREADS" not in os.environ
    env.setenv("OMP_NUM_THREADS", "2")  # OpenBLAS's own variable still comes first
    _threads.cap_blas_threads_under_launcher()
    assert capped == [3, 3]
    env.setenv("OPENBLAS_NUM_THREADS", "many")  # not a count: OMP_NUM_THREADS's 2
    _threads.cap_blas_threads_under_launcher()
    env.setenv("OMP_NUM_THREADS", "4,2")  # OpenMP's list: its first level
    _threads.cap_blas_threads_under_launcher()
    assert capped == [3, 3, 2, 4]


@pytest.mark.parametrize("value", ["abc", "0", "-1", "", "\u00b2"])  # '²': a digit to str.isdigit, not to int()
def test_a_thread_count_that_is_no_count_is_capped_as_if_unset(clean_env, value):
    """OMP_NUM_THREADS=abc (or 0, -1) under `mpiexec -n 8` on 2 cores left numpy's BLAS alone, and OpenBLAS
    started a thread per core in every rank: the pools that made a job 20x slower. It asks for no count."""
    env, capped = clean_env
    env.setenv("MPI_LOCALNRANKS", "8")
    env.setenv("OMP_NUM_THREADS", value)
    env.setenv("OPENBLAS_NUM_THREADS", "many")
    assert not _threads.threads_set_by_user()
    assert _threads.cap_blas_threads_under_launcher() == 1 and capped == [1]
    assert [os.environ[v] for v in _threads.THREAD_VARS] == ["1", "1", "1"]
    from spmdsim.tools.cli import launch  # launch's ranks get the cap in place of the value, as unset
    assert launch.launch_env(8, None, base={"OMP_NUM_THREADS": value})["OMP_NUM_THREADS"] == "1"
    assert launch.launch_env(8, None, base={"OMP_NUM_THREADS": "3"})["OMP_NUM_THREADS"] == "3"


# In a fresh interpreter under a launcher's environment: what `import spmdsim` did to the process.
_PROBE = """
import os, sys
before = dict(os.environ)
import spmdsim, spmdsim.layouts.layout, spmdsim.layouts.dialects
print("mpi4py" in sys.modules, dict(os.environ) == before,
      any("openblas" in line for line in open("/proc/self/maps")))
"""


def test_import_spmdsim_loads_no_mpi4py_and_changes_no_process_setting():
    env = {k: v for k, v in os.environ.items()
           if k not in _threads.THREAD_VARS + _malloc.GLIBC_VARS}
    env["MPI_LOCALNRANKS"] = "64"
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", _PROBE], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"]  # numpy's BLAS loaded, untouched
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()]
    assert "spmdsim" in imported and not any(name.startswith("mpi4py") for name in imported)
    assert not any(name in imported for name in ("spmdsim.base.threads", "spmdsim.base.malloc"))


_LAUNCHED = """
import os, sys
from spmdsim import Layout
from spmdsim.base import interrupts as _interrupts, threads as _threads
from spmdsim.runtime import Mesh, install_excepthook, memwatch, process
before, hook = dict(os.environ), sys.unraisablehook
Mesh(Layout((1,), ("x",)))  # an MPI rank's mesh: no process setting changes
print(process._TUNED == [] and dict(os.environ) == before and not memwatch._STARTED
      and sys.unraisablehook is hook and not _interrupts._KEPT)
install_excepthook()  # the guard, first set up: the process is tuned, once (a Ctrl-C in a callback kept too)
threads = _threads.thread_cap(2)
print(process._TUNED == [(threads, True, True)] and os.environ["OMP_NUM_THREADS"] == str(threads)
      and process.tune_mpi_process() is process._TUNED[0] and _interrupts._KEPT == [hook]
      and sys.unraisablehook is not hook)
"""


def test_a_mesh_changes_no_process_setting_and_the_guard_tunes_a_launched_rank_once():
    pytest.importorskip("mpi4py")
    env = {k: v for k, v in os.environ.items()
           if k not in _threads.THREAD_VARS + _malloc.GLIBC_VARS + _threads.LOCAL_SIZE_VARS}
    env["SLURM_NTASKS_PER_NODE"] = "2"  # a launcher's "ranks on this node" that a singleton MPI ignores
    out = subprocess.run([sys.executable, "-c", _LAUNCHED], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_cap_loaded_blas_sets_numpys_openblas():
    code = ("import ctypes, numpy; from spmdsim.base import threads as _threads\n"
            "paths = _threads.cap_loaded_blas(1)\n"
            "lib = paths and ctypes.CDLL(paths[0])\n"
            "get = [getattr(lib, n.replace('set', 'get')) for n in _threads._SETTERS['openblas']\n"
            "       if lib and hasattr(lib, n.replace('set', 'get'))]\n"
            "print(len(paths), get[0]() if get else 1)")
    out = _python(code)
    if out.split()[0] == "0":
        pytest.skip("this numpy loads no OpenBLAS or MKL")
    assert out.split() == ["1", "1"]


def test_blas_kernels_names_what_openblas_chose_and_the_pin():
    # A fresh interpreter: OpenBLAS reads OPENBLAS_CORETYPE when numpy loads it.
    code = ("import numpy, sys; from spmdsim.base.threads import blas_kernels, blas_kernels_text; "
            "print(blas_kernels()); print(blas_kernels_text())")
    env = {**os.environ, "OPENBLAS_CORETYPE": "Haswell"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    kernels, text = out.stdout.splitlines()
    if kernels == "None":  # numpy on another BLAS (Accelerate, MKL): nothing to name
        assert text == "numpy BLAS kernels unknown (not OpenBLAS)"
        return
    assert kernels.lower() == "haswell"
    assert text == f"numpy BLAS kernels {kernels} (OPENBLAS_CORETYPE=Haswell)"


def test_blas_kernels_without_a_maps_file_is_none(tmp_path):
    from spmdsim.base.threads import blas_kernels

    assert blas_kernels(str(tmp_path / "missing")) is None


def test_simulated_ranks_run_blas_on_one_thread_each_and_give_the_count_back():
    code = ("import os, numpy, spmdsim; from spmdsim.base import threads as t\n"
            "for v in t.THREAD_VARS: os.environ.pop(v, None)\n"
            "if not t.cap_loaded_blas(3): print('none'); raise SystemExit\n"
            "print(sorted(set(spmdsim.simulate(4, t.loaded_blas_threads))), t.loaded_blas_threads(),\n"
            "      spmdsim.simulate(1, t.loaded_blas_threads))\n"
            "os.environ['OPENBLAS_NUM_THREADS'] = '3'\n"
            "print(spmdsim.simulate(2, t.loaded_blas_threads))")
    out = _python(code)
    if out.strip() == "none":
        pytest.skip("this numpy loads no OpenBLAS or MKL")
    # Four ranks: one thread each, then the count before; one rank, or a count the user set: kept.
    assert out.splitlines() == ["[1] 3 [3]", "[3, 3]"]


def _python(code: str) -> str:
    """What `code` prints in a fresh interpreter (its BLAS settings stay out of this one)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout
