"""mpi4py's own test files against simulated ranks at 1, 2, 3, 4 and 8 ranks (tests/mpi4py_suite.py).

By default a representative subset (SUBSET: every file, the World classes, the
calls most programs use); with SPMDSIM_MPI4PY_FULL=1 every test of the files.
Fails on any failure outside mpi4py_suite.OUT_OF_SCOPE. The test files come
from the installed mpi4py's sdist (~/.cache/spmdsim/mpi4py-<version>/test,
fetched once with pip, or $SPMDSIM_MPI4PY_TESTS).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mpi4py_suite

HERE = Path(__file__).resolve().parent
RANKS = "1,2,3,4,8"

#: Tests of the default run (a regular expression on "module.Class.method").
SUBSET = (r"test_cco_buf\.TestCCOBufWorld\.test(Bcast|Allreduce|Scan|Scatter|Gather|Alltoall)$"
          r"|test_cco_buf\.TestCCOBufInplaceWorld\.test(Allreduce|Exscan)$"
          r"|test_cco_nb_buf\.TestCCOBufWorld\.testExscan$|test_cco_nb_buf\.TestCCOBufInplaceWorld\.testReduceScatter$"
          r"|test_cco_obj\.TestCCOObjWorld\."
          r"|test_cco_vec\.TestCCOVecWorld\.testScatterv$|test_cco_nb_vec\.TestCCOVecInplaceWorld\.testAlltoallv$"
          r"|test_comm\.TestComm(World|Null)\."
          r"|test_p2p_buf\.TestP2PBufWorld\.test(Probe|IProbe|ProcNull|SendrecvReplace|ISendrecv)$"
          r"|test_p2p_obj\.TestP2PObjWorld\.")


def _test_files() -> Path:
    found = mpi4py_suite.find_tests()
    if found is None:
        try:
            found = mpi4py_suite.fetch()
        except (subprocess.CalledProcessError, OSError, StopIteration) as exc:
            pytest.skip(f"mpi4py's test files are not here and could not be fetched ({exc}); "
                        f"run `python tests/mpi4py_suite.py --fetch` or set SPMDSIM_MPI4PY_TESTS")
    return found


def test_mpi4py_test_files_pass_on_simulated_ranks(tmp_path):
    test_dir = _test_files()
    full = os.environ.get("SPMDSIM_MPI4PY_FULL") == "1"
    out = tmp_path / "results.json"
    cmd = [sys.executable, str(HERE / "mpi4py_suite.py"), "--ranks", RANKS, "--json", str(out)]
    if not full:
        cmd += ["--only", SUBSET]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=3000 if full else 600,
                         env=dict(os.environ, SPMDSIM_MPI4PY_TESTS=str(test_dir)))
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(out.read_text())
    failures = [f"{n} ranks: {test_id}: {detail.strip().splitlines()[-1] if detail.strip() else ''}"
                for n, table in results.items()
                for test_id, (outcome, detail, why, _) in table.items() if outcome == "fail" and why is None]
    assert not failures, "\n".join(failures)
    for n, table in results.items():
        ran = [v for v in table.values() if v[2] is None and v[0] == "pass"]
        assert len(ran) >= (400 if full else 60), f"only {len(ran)} tests ran at {n} ranks"
