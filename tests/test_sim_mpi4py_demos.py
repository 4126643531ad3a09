"""mpi4py's demo programs print under ``spmdsim mpirun`` what they print under MPICH's ``mpiexec``
(tests/mpi4py_demos.py: the demos of the installed mpi4py's sdist, fetched with its test files).

By default a representative set (DEFAULT: cpi at 2, 3, 4 and 8 ranks, whose last digits follow the
Reduce's order, and one demo of each kind of call); SPMDSIM_MPI4PY_FULL=1 runs every run of
mpi4py_demos.RUNS. The simulated side runs in this process, each mpiexec beside it under `timeout -k`.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

import mpi4py_demos
import mpi4py_suite
from spmdsim.tools.cli.main import main
from testkit import MPICH, MPICH_WAIT_ASLEEP

#: The runs of the default test (names of mpi4py_demos.RUNS).
DEFAULT = ("compute-pi/cpi-cco.py -n 2", "compute-pi/cpi-cco.py -n 3", "compute-pi/cpi-cco.py -n 4",
           "compute-pi/cpi-cco.py -n 8", "helloworld.py -n 4", "nxtval/nxtval-threads.py -n 2",
           "reductions/test_reductions.py -q -n 2", "mpi-ref-v1/ex-2.32.py -n 3", "mpi-ref-v1/ex-3.09.py -n 2",
           "init-fini/test_0.py errors=fatal -n 2", "threads/sendrecv.py -n 1", "nxtval/nxtval-scalable.py -n 5",
           "compute-pi/cpi-dpm.py 4 -n 1")

FULL = os.environ.get("SPMDSIM_MPI4PY_FULL") == "1"
RUNS = [r for r in mpi4py_demos.RUNS if FULL or r.name in DEFAULT]


@pytest.fixture(scope="module")
def demo_dir():
    found = mpi4py_demos.find_demos()
    if found is None:
        try:
            mpi4py_suite.fetch()
        except (subprocess.CalledProcessError, OSError, StopIteration) as exc:
            pytest.skip(f"mpi4py's demos are not here and could not be fetched ({exc}); "
                        f"run `python tests/mpi4py_demos.py --fetch` or set SPMDSIM_MPI4PY_DEMOS")
        found = mpi4py_demos.find_demos()
    return found


def test_the_default_runs_exist():
    assert len(RUNS) >= len(DEFAULT) and {r.name for r in mpi4py_demos.RUNS} >= set(DEFAULT)


@pytest.mark.skipif(not MPICH, reason="no MPICH mpiexec beside this Python (the emulator is compared with MPICH)")
@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.name)
def test_demo_prints_what_mpiexec_prints(run, demo_dir, capsys, monkeypatch):
    script = demo_dir / run.path
    mpiexec = subprocess.Popen(["timeout", "-k", "5", "120", MPICH, "-n", str(run.ranks), sys.executable,
                                str(script), *run.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=script.parent,
                               env=dict(os.environ, **MPICH_WAIT_ASLEEP))
    monkeypatch.chdir(script.parent)
    monkeypatch.setattr(sys, "stdin", io.StringIO(run.stdin))
    code = main(["mpirun", "-n", str(run.ranks), "python", str(script), *run.args])
    ours = capsys.readouterr()
    out, err = mpiexec.communicate(run.stdin, timeout=180)
    assert code == mpiexec.returncode, (ours.err, err[-2000:])
    assert mpi4py_demos.stderr_text(ours.err) == mpi4py_demos.stderr_text(err), (ours.err, err[-2000:])
    assert mpi4py_demos.normalize(run, ours.out) == mpi4py_demos.normalize(run, out), (ours.out, out)
    if "cpi-dpm" in run.path:  # (its children compute, its parent prints)
        assert ours.out.count("computed pi is:  3.14") == 1
    elif "cpi" in run.path:
        assert ours.out.count("pi is approximately 3.14") == 2
