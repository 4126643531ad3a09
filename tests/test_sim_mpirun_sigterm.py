"""SIGTERM (what ``timeout`` sends) ends ``spmdsim mpirun`` before ``timeout -k 5`` would kill it, as it ends
``mpiexec`` and its ranks: ranks that compute without reaching an MPI call, and a thread a rank started that
is no daemon, do not hold the process."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from testkit import MPICH

ROOT = Path(__file__).resolve().parents[1]
KILL_AFTER_S = 5  # timeout -k 5: SIGKILL this long after SIGTERM

# Every rank computes forever after a barrier (rank 0 says so first); with `thread`, rank 1 starts a thread
# that is no daemon and spins forever, which Python's exit waits for.
_PROGRAM = """
    import sys, threading, time
    from mpi4py import MPI

    comm = MPI.COMM_WORLD

    def spin():
        while True:
            pass

    if {thread} and comm.rank == 1:
        threading.Thread(target=spin).start()
    comm.Barrier()
    if comm.rank == 0:
        sys.stdout.write("up\\n")
        sys.stdout.flush()
    while True:
        time.time()
    """


def _terminated(argv: list) -> tuple:
    """(exit status, stderr) of `argv` sent SIGTERM once it printed "up"; None as the status if it still ran
    KILL_AFTER_S later (then it is killed)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline() == "up\n"
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            return None, ""
        return proc.returncode, err
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize("thread", [False, True], ids=["ranks computing", "and a thread that is no daemon"])
def test_sigterm_ends_a_run_whose_ranks_compute(tmp_path, thread):
    # The process printed "terminated (SIGTERM)" and ran on: it gave each computing rank a second of its own to
    # reach a wait (8 ranks: 8 s), then Python's exit waited forever for the rank's thread.
    script = tmp_path / "computes.py"
    script.write_text(textwrap.dedent(_PROGRAM.format(thread=thread)))
    code, err = _terminated([sys.executable, "-m", "spmdsim", "mpirun", "-n", "8", "python", str(script)])
    assert code == 143, f"still running {KILL_AFTER_S} s after SIGTERM" if code is None else err
    assert err.splitlines() == ["spmdsim mpirun: terminated (SIGTERM): the simulated ranks were stopped"]
    if MPICH and thread:
        code, _ = _terminated([MPICH, "-n", "8", sys.executable, str(script)])
        assert code is not None, f"MPICH's mpiexec still ran {KILL_AFTER_S} s after SIGTERM"
