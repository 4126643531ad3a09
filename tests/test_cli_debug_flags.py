"""--check/--watchdog on the MPI commands and `spmdsim launch` (2-rank launches)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from testkit import program_lines, unfold

BIN = os.path.dirname(sys.executable)
MPIEXEC = os.path.join(BIN, "mpiexec")
SPMDSIM = os.path.join(BIN, "spmdsim")

pytestmark = pytest.mark.skipif(not os.access(MPIEXEC, os.X_OK), reason="no mpiexec beside python")

MATMUL = ["run", "matmul", "--strategy", "((1,2),(2,1))", "--shape", "8,6,4"]


def _mpi(args: list[str], ranks: int = 2) -> subprocess.CompletedProcess:
    cmd = ["timeout", "-k", "2", "60", MPIEXEC, "-n", str(ranks), SPMDSIM, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def test_run_with_guard_and_watchdog_passes():
    out = _mpi(MATMUL + ["--check", "--watchdog", "30"])
    assert out.returncode == 0, out.stderr
    assert "PASS" in out.stdout


def test_bad_watchdog_value_is_one_line_on_every_rank():
    out = _mpi(MATMUL + ["--watchdog", "abc"])
    assert out.returncode == 2
    lines = unfold("\n".join(program_lines(out.stderr))).splitlines()  # Open MPI adds an exit banner
    assert lines == ["spmdsim: error: --watchdog 'abc' is not a number of seconds; expected seconds from 1 to "
                     "604,800, or 0 for off"]
    assert "Traceback" not in out.stdout + out.stderr


def test_a_jobs_lines_are_without_the_launchers_own():
    """Open MPI's prterun printed its PMIx server's error about a process that had exited beside the one line
    of spmdsim's error (the test above failed under it); that line, its banner and libevent's are the
    launcher's. What else a rank prints still counts, a PMIX line of another form too."""
    pmix = ("[vm:29978] PMIX ERROR: PMIX_ERR_UNREACH in file /openmpi-5.0.11/3rd-party/openpmix/src/server/"
            "pmix_server.c at line 3146")
    banner = "-" * 74 + "\nprterun detected that one or more processes exited with non-zero status,\n" + "-" * 74
    assert program_lines(f"spmdsim: error: x\n{pmix}\n{banner}\n[warn] epoll\n\n[vm:1] PMIX ERROR: mine\n") == [
        "spmdsim: error: x", "[vm:1] PMIX ERROR: mine"]


def test_launch_exports_debug_settings_to_every_rank(tmp_path):
    # Each rank writes its own file: the launcher forwards concurrent stdout in
    # chunks that can split a line, so printed tokens may run together.
    code = ("import os; from mpi4py import MPI; r = MPI.COMM_WORLD.rank; "
            f"open(os.path.join({str(tmp_path)!r}, str(r)), 'w').write("
            "os.environ['SPMDSIM_CHECK'] + ' ' + os.environ['SPMDSIM_WATCHDOG'])")
    cmd = [SPMDSIM, "launch", "-n", "2", "--timeout", "60", "--check", "--watchdog", "7",
           "--", "python", "-c", code]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {"0": "1 7", "1": "1 7"}
