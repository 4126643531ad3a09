"""Faults under `mpiexec -n 4`: every one ends the whole job with a message, never a hang.

Each fault launches one 4-rank job (a 2 x 2 mesh: two groups on each axis, all that the
faults below need; AT_ONCE jobs at a time) under ``timeout -k 2 60`` that runs a few
Allreduces and then injects one fault on one rank:

* raises (an unexpected exception, or an SpmdsimError on that rank only),
  exits (os._exit, or sys.exit inside the guard): the guard or mpiexec ends
  the job within 30 s;
* gets stuck before a collective: the watchdog (SPMDSIM_WATCHDOG) reports the
  collective by name on the waiting ranks and aborts;
* calls another collective or another shape, or skips one on another group:
  the divergence guard (SPMDSIM_CHECK=1) names the rank that differs; a skipped
  last call leaves the others waiting, which the watchdog reports;
* builds axis groups in another order (Comm.Split pairs by call order) or
  skips the first call on a new group: the guard compares the split first,
  the watchdog waits on a nonblocking barrier before it.
"""
from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from test_bad_inputs import _MPIEXEC, launch
from testkit import MPICH, unfold

pytestmark = pytest.mark.skipif(not _MPIEXEC, reason="no mpiexec")

FAULT_LIMIT_S = 30.0
RANKS = 4

_JOB = """\
from spmdsim.runtime import install_excepthook, abort_on_error; install_excepthook()
import os, sys, time
import numpy as np
from spmdsim import Layout
from spmdsim.errors import OperatorError
from spmdsim.runtime import Mesh, allreduce, allgather
import spmdsim.runtime.guard as guard
guard.GRACE_S = 1.0  # ranks fail on purpose here: decide sooner whether all of them did
# Every rank past its imports before the first watched collective: with 4 jobs of 4 ranks beside the
# other test workers on 2 cores, one rank's start lagged the others' by more than a 2 s watchdog.
from mpi4py import MPI; MPI.COMM_WORLD.Barrier()  # noqa: E702
mesh = Mesh(Layout((2, 2), ("dp", "mp")))
rank = mesh.rank
x = np.ones(8)
for step in range(3):
    x = allreduce(mesh, x, "mp") / 2
x = allreduce(mesh, x, "dp") / 2  # both groups exist now (Comm.Split is collective)
"""

#: name -> (code after _JOB, extra env, expected rc (None: any non-zero), regex on the output or None)
FAULTS = {
    "raises": ('if rank == 3: raise ValueError("injected fault")\nallreduce(mesh, x, "mp")',
               {}, 1, r"spmdsim: error on rank 3: ValueError: injected fault"),
    "raises-spmdsim-error-alone": (
        'if rank == 3: raise OperatorError("injected operator error")\nallreduce(mesh, x, "mp")',
        {}, 1, r"spmdsim: error on rank 3: injected operator error"),
    # A hard exit leaves no Python to print: mpiexec ends the job, its banner is optional.
    # SIGINT to one rank alone (not mpiexec's Ctrl-C to all): the others wait inside MPI.
    "sigint-alone": ('if rank == 3: os.kill(os.getpid(), 2)\nallreduce(mesh, x, "mp")', {}, 1,
                     r"spmdsim: rank 3 was interrupted \(Ctrl-C\) while other ranks go on"),
    "os-exit": ('if rank == 3: os._exit(3)\nallreduce(mesh, x, ("dp", "mp"))', {}, None, None),
    "sys-exit-in-guard": (
        'with abort_on_error():\n    if rank == 3: sys.exit(0)\n    allreduce(mesh, x, ("dp", "mp"))',
        {}, 1, r"spmdsim: error on rank 3: .*exit"),
    "stuck-watchdog": ('if rank == 3: time.sleep(120)\nallreduce(mesh, x, "mp")',
                       {"SPMDSIM_WATCHDOG": "2"}, None,
                       r"\[rank [0-3]\] spmdsim: collective allreduce on \('mp',\) \(seq 5\) "
                       r"did not complete within 2\.0 s"),
    "diverge-op": ('allgather(mesh, x, "mp", 0) if rank == 1 else allreduce(mesh, x, "mp")',
                   {"SPMDSIM_CHECK": "1"}, None,
                   r"collectives diverge: rank 1 calls allgather on \('mp',\) float64 \(8,\) "
                   r"\(0,\) \(seq 5\) but rank 0 calls allreduce"),
    "diverge-shape": ('allreduce(mesh, x[:4] if rank == 3 else x, "mp")',
                      {"SPMDSIM_CHECK": "1"}, None,
                      r"collectives diverge: rank 3 calls allreduce on \('mp',\) float64 \(4,\) "
                      r"\(seq 5\) but rank 2 calls allreduce on \('mp',\) float64 \(8,\)"),
    "skips-one-elsewhere": ('if rank != 3: allreduce(mesh, x, "dp")\nallreduce(mesh, x, "mp")',
                            {"SPMDSIM_CHECK": "1"}, 1,
                            r"collectives diverge: rank 3 calls allreduce on \('mp',\) float64 \(8,\) "
                            r"\(seq 5\) but rank 2 calls allreduce on \('mp',\) float64 \(8,\) \(seq 6\)"),
    "skips-last-watchdog": ('if rank != 3: allreduce(mesh, x, "mp")',
                            {"SPMDSIM_CHECK": "1", "SPMDSIM_WATCHDOG": "3"}, None,
                            r"\[rank 2\] spmdsim: collective allreduce on \('mp',\) \(seq 5\) "
                            r"did not complete within 3\.0 s"),
    "stuck-before-check": ('from spmdsim import SeededTensor\nfrom spmdsim.runtime import DTensor\n'
                           'src = SeededTensor((8, 4))\n'
                           't = DTensor.from_seeded(mesh, mesh.layout("dp", None), src)\n'
                           'if rank == 3: time.sleep(120)\nt.check(src)',
                           {"SPMDSIM_WATCHDOG": "2"}, None,
                           r"spmdsim: collective check on its whole communicator \(seq 5\) did not complete "
                           r"within 2\.0 s"),
    "alltoallv-counts": ('from spmdsim.runtime.collectives import alltoallv\n'
                         'sends = {r: np.full(2, float(rank)) for r in range(4)}\n'
                         'shapes = {r: (2,) for r in range(4)}\n'
                         'if rank == 2: shapes[0] = (3,)\n'
                         'alltoallv(mesh, sends, shapes, "float64")',
                         {"SPMDSIM_CHECK": "1"}, 1,
                         r"spmdsim: error: alltoallv counts disagree \(seq 5\): rank 0 sends 2 "
                         r"elements to rank 2, which expects 3"),
    "split-order": ('fresh = Mesh(Layout((2, 2), ("dp", "mp")))\n'
                    'allreduce(fresh, x, "mp" if rank == 1 else "dp")',
                    {"SPMDSIM_CHECK": "1"}, 1,
                    r"spmdsim: error: collectives diverge: rank 1 calls split on \('mp',\) int64 "
                    r"\(seq 1\) but rank 0 calls split on \('dp',\)"),
    "skips-new-group-watchdog": ('fresh = Mesh(Layout((2, 2), ("dp", "mp")))\n'
                                 'if rank != 3: allreduce(fresh, x, "dp")',
                                 {"SPMDSIM_WATCHDOG": "2"}, None,
                                 r"spmdsim: collective split on \('dp',\) \(seq 1\) did not "
                                 r"complete within 2\.0 s"),
}


#: Jobs launched at once. Each mostly waits (on a watchdog, the guard's grace, mpiexec ending the job):
#: one after the other they kept a test worker 34 s for 3.5 CPU-s.
AT_ONCE = 4


@pytest.fixture(scope="module")
def ran(request) -> dict:
    """{fault: (rc, output, seconds)} for the faults this session runs, AT_ONCE jobs at a time."""
    chosen = [item.callspec.params["fault"] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")]
    with ThreadPoolExecutor(max_workers=AT_ONCE) as pool:
        jobs = {fault: pool.submit(launch, ["-c", _JOB + FAULTS[fault][0]], limit=60, ranks=RANKS,
                                   env=FAULTS[fault][1]) for fault in chosen}
        return {fault: job.result() for fault, job in jobs.items()}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_ends_the_job_with_a_message(fault: str, ran: dict) -> None:
    code, env, want_rc, pattern = FAULTS[fault]
    rc, out, seconds = ran[fault]
    print(f"\n{fault}: rc={rc} {seconds:.2f} s")
    assert rc != 0 and rc != 124, (rc, out)
    if want_rc is not None and not (rc == -11 and not MPICH and "prterun" in out):
        # (Open MPI's prterun itself segfaults now and then when some ranks abort while others are in
        # MPI_Finalize, reproduced with plain mpi4py: docs/explanation/runtime.md; the message is still checked below)
        assert rc == want_rc, (rc, out)
    assert pattern is None or re.search(pattern, unfold(out)), out
    assert seconds <= FAULT_LIMIT_S, f"{fault} took {seconds:.1f} s"
