"""The watchdog names the rank that is missing (one `mpiexec -n 4` each, the two at once).

Two user bugs from an audit, each a 4-rank program under ``timeout -k 5 60``
with ``SPMDSIM_WATCHDOG=3``: a rank that skips a collective (an ``if`` on the
rank), and ``DTensor.check`` called on rank 0 only. Both used to hang (or, with
the watchdog, to say only which collective did not complete); now the job
ends with a message that names the missing ranks and, for check, says that
check is collective.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from testkit import MPIEXEC, program_lines

pytestmark = pytest.mark.skipif(not MPIEXEC, reason="no mpiexec")

_PRELUDE = """\
from spmdsim.runtime import install_excepthook; install_excepthook()
from spmdsim import Layout, SeededTensor
from spmdsim.nn.ops import matmul
from spmdsim.runtime import DTensor, Mesh
from mpi4py import MPI; MPI.COMM_WORLD.Barrier()  # noqa: E702 - every rank imported: a slow start is no skip
mesh = Mesh(Layout((4,), ("mp",)))
x = DTensor.from_seeded(mesh, mesh.layout(None, "mp"), SeededTensor((4, 16), seed=1))
w = DTensor.from_seeded(mesh, mesh.layout("mp", None), SeededTensor((16, 8), seed=2))
y = matmul(x, w)  # every rank: the group exists, the sequence numbers agree
"""

# The matmul's Allreduce tells the watchdog its group, so the silent rank skipped "this one".
_MISSING = (r"rank 3 is in no collective: skipped this one \(inside an `if` on the rank\?\), "
            r"or still computing, stuck or finished")

#: name -> (program after the prelude, regex one output line must match)
CASES = {
    "skips-a-collective": (
        "if mesh.rank != 3:\n    y = matmul(x, w)\n",
        r"^\[rank 0\] spmdsim: collective allreduce on \('mp',\) \(seq 2\) did not complete within "
        r"3\.0 s: ranks 0-2 wait in it; " + _MISSING + "$"),
    "check-on-one-rank": (
        "if mesh.rank == 0:\n    print(x.check(SeededTensor((4, 16), seed=1)))\n",
        r"^\[rank 0\] spmdsim: collective check on its whole communicator \(seq \d+\) did not complete within 3\.0 s: "
        r"rank 0 waits in it; ranks 1-3 are in no collective: skipped this one .*; DTensor\.check is "
        r"collective: call it on every rank and print on one \(verdict = y\.check\(ref\); if rank "
        r"== 0: print\(verdict\)\)$"),
}


def _launch(code: str) -> tuple[subprocess.CompletedProcess, float]:
    full_env = dict(os.environ, SPMDSIM_WATCHDOG="3", SPMDSIM_EXPECT_WORLD="4",
                    OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    full_env.pop("SPMDSIM_CHECK", None)
    start = time.perf_counter()
    proc = subprocess.run(["timeout", "-k", "5", "60", MPIEXEC, "-n", "4", sys.executable, "-c",
                           _PRELUDE + code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=full_env)
    return proc, time.perf_counter() - start


@pytest.fixture(scope="module")
def ran() -> dict:
    """{case: (the finished job, its seconds)}: both jobs at once (each waits out its 3 s watchdog)."""
    with ThreadPoolExecutor(max_workers=len(CASES)) as pool:
        jobs = {case: pool.submit(_launch, code) for case, (code, _) in CASES.items()}
        return {case: job.result() for case, job in jobs.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_watchdog_names_the_missing_rank(case: str, ran: dict) -> None:
    pattern = CASES[case][1]
    proc, seconds = ran[case]
    print(f"\n{case}: rc={proc.returncode} {seconds:.1f} s")
    assert proc.returncode not in (0, 124, 137), (proc.returncode, proc.stdout)
    lines = [line for line in program_lines(proc.stdout) if "spmdsim: collective" in line]
    assert any(re.search(pattern, line) for line in lines), proc.stdout
    assert seconds < 30, proc.stdout
