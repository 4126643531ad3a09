"""mpi4py's own test files against simulated ranks (tests/mpi4py_suite.py).

By default a representative subset: SUBSET (the collective and point-to-point
files, the World classes, the calls most programs use) at 1, 2, 3, 4 and 8 ranks,
and SUBSET_MORE (the other files of mpi4py_suite.FILES but for their longest
loops) at 2 ranks; with SPMDSIM_MPI4PY_FULL=1 every test of every file at 1, 2,
3, 4 and 8 ranks.
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

#: The other files' tests of the default run, at 2 ranks only (a few seconds): all but the loops over every
#: array kind and typecode of test_p2p_buf_matched and test_msgspec, and pkl5's Self classes; the persistent
#: collectives' two files whole (132 tests, ~7 CPU-s: their in-place Allgather is the test that once hung, when
#: a rank's thread kept a view of another rank's buffer: tests/test_sim_mpi4py_corners.py, test_buffers_released);
#: the windows, mpi4py.util.sync's World classes and one-sided communication's World tests but the accumulates'
#: loops over every typecode and op (~2 s each); partitioned point to point's ring of Pready_range and Pready_list;
#: the datatypes' own tests but their constructors' and pickles' loops (test_pack's loops over every pair of
#: typecodes and test_util_dtlib run in the full run: 3.5 and 18 s at 2 ranks); MPI I/O's files but the loops of
#: test_io's views over every typecode, three of its ten views kept (subarray, struct, contiguous); the
#: intercommunicators' four files whole (81 tests, ~1.5 s); Spawn's and Accept/Connect's files whole (44 and 4
#: tests, ~0.5 s).
SUBSET_MORE = (r"test_(group|request|status|exceptions|errhandler|attributes|comm_topo|threads|environ|msgzero|op|"
               r"pickle|buffer|address|errorcode|info|mpimem|grequest|cco_ngh_obj|p2p_obj_matched)\."
               r"|test_util_pkl5\.Test(MPI|PKL5)World\.|test_p2p_buf_matched\.(TestMessage|\w+World)\.testIMProbe"
               r"|test_p2p_buf_matched\.TestMessage\.|test_cco_ngh_buf\.\w+World\."
               r"|test_msgspec\.TestMessage(Simple|Reduce\w*|Vector)\."
               r"|test_cco_pr_(buf|vec)\."
               r"|test_win\.|test_util_sync\.\w+World\.|test_rma(_nb)?\.TestRMAWorld\.test(?!GetAccumulate|Accumulate)"
               r"|test_p2p_buf_part\.TestP2PBufPartWorld\.testRingRangeList$"
               r"|test_datatype\.TestDatatype(Null)?\."
               r"|test_file\.|test_io\.TestIOBasicWorld\.test(?!ReadWrite$|IReadIWrite$)"
               r"|test_io\.TestIOViewWorld\.test(Subarray|Struct|Contiguous)$"
               r"|test_(comm|cco_buf|cco_obj|cco_vec)_inter\.|test_spawn\.|test_dynproc\.")


def _test_files() -> Path:
    found = mpi4py_suite.find_tests()
    if found is None:
        try:
            found = mpi4py_suite.fetch()
        except (subprocess.CalledProcessError, OSError, StopIteration) as exc:
            pytest.skip(f"mpi4py's test files are not here and could not be fetched ({exc}); "
                        f"run `python tests/mpi4py_suite.py --fetch` or set SPMDSIM_MPI4PY_TESTS")
    return found


def _run(tmp_path: Path, ranks: str, only: str | None) -> dict:
    test_dir = _test_files()
    out = tmp_path / f"results-{ranks.replace(',', '-')}.json"
    cmd = [sys.executable, str(HERE / "mpi4py_suite.py"), "--ranks", ranks, "--json", str(out)]
    if only:
        cmd += ["--only", only]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=3000 if only is None else 600,
                         env=dict(os.environ, SPMDSIM_MPI4PY_TESTS=str(test_dir)))
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(out.read_text())
    failures = [f"{n} ranks: {test_id}: {detail.strip().splitlines()[-1] if detail.strip() else ''}"
                for n, table in results.items()
                for test_id, (outcome, detail, why, _) in table.items() if outcome == "fail" and why is None]
    assert not failures, "\n".join(failures)
    return results


def _passed(table: dict) -> int:
    return sum(v[2] is None and v[0] == "pass" for v in table.values())


def test_mpi4py_test_files_pass_on_simulated_ranks(tmp_path):
    full = os.environ.get("SPMDSIM_MPI4PY_FULL") == "1"
    results = _run(tmp_path, RANKS, None if full else SUBSET)
    for n, table in results.items():
        assert _passed(table) >= (1000 if full else 60), f"only {_passed(table)} tests passed at {n} ranks"


@pytest.mark.skipif(os.environ.get("SPMDSIM_MPI4PY_FULL") == "1", reason="the full run above has them")
def test_more_mpi4py_test_files_at_two_ranks(tmp_path):
    results = _run(tmp_path, "2", SUBSET_MORE)
    files = {test_id.split(".")[0] for test_id, v in results["2"].items() if v[0] == "pass"}
    assert _passed(results["2"]) >= 300 and len(files) >= 20, (_passed(results["2"]), sorted(files))
    persistent = [t for t, v in results["2"].items() if t.split(".")[0] in ("test_cco_pr_buf", "test_cco_pr_vec")
                  and v[0] == "pass"]
    assert len(persistent) >= 132, len(persistent)  # both files whole: 70 + 62 tests in scope
    files = [t for t, v in results["2"].items() if t.split(".")[0] in ("test_file", "test_io") and v[0] == "pass"]
    assert len(files) >= 34 + 15, len(files)  # test_file whole, test_io's World tests but its typecode loops
    spawned = [t for t, v in results["2"].items() if t.startswith(("test_spawn.", "test_dynproc.")) and v[0] == "pass"]
    assert len(spawned) >= 44 + 4, len(spawned)  # Spawn's file and Accept/Connect's whole
