"""Never hang: jobs where some ranks fail end quickly with a message (spawns mpiexec)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from shellkit import as_a_shell_starts_it
from testkit import MPICH, program_lines

MPIEXEC = os.path.join(os.path.dirname(sys.executable), "mpiexec")
if not os.access(MPIEXEC, os.X_OK):
    MPIEXEC = shutil.which("mpiexec") or ""
pytestmark = pytest.mark.skipif(
    not MPIEXEC or not shutil.which("timeout"), reason="needs mpiexec and coreutils timeout"
)
RANKS = 4
BOUND_S = 45  # generous: the machine may be shared and oversubscribed


def _launch(body: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run(
        ["timeout", "-k", "5", "60", MPIEXEC, "-n", str(RANKS), sys.executable, "-c", HEADER + textwrap.dedent(body)],
        capture_output=True, text=True, timeout=90,
        env={**os.environ, "OMP_NUM_THREADS": "1", **env},
    )
    return proc, time.monotonic() - start


HEADER = """
from mpi4py import MPI
import numpy as np
from spmdsim import Layout, ShapeError
from spmdsim.runtime import Mesh, allreduce, abort_on_error, install_excepthook, run_guarded
import spmdsim.runtime.guard as guard
guard.GRACE_S = 1.0  # ranks fail on purpose here: agree on it sooner
mesh = Mesh(Layout((2, MPI.COMM_WORLD.size // 2), ("dp", "mp")))
"""


def test_exception_on_one_rank_mid_job_aborts_everyone_and_leaves_no_shared_memory_segment():
    # One launch for both checks (they were two launches of the same job): the message and exit,
    # and the segments. MPI_Abort kills the ranks before MPICH unlinks its /dev/shm segment; the
    # guard unlinks it first, or every aborted job would hold ~8 MB of memory until reboot.
    proc, seconds = _launch("""
    segments = sorted({line.split(maxsplit=5)[5].strip() for line in open("/proc/self/maps")
                       if "/dev/shm/" in line and "(deleted)" not in line})
    if mesh.rank == 0:
        print("SEGMENTS", " ".join(segments), flush=True)
    with abort_on_error():
        allreduce(mesh, np.ones(4), ("dp", "mp"))
        if mesh.rank == 2:
            raise ValueError("boom on rank two")
        allreduce(mesh, np.ones(4), ("dp", "mp"))  # the others block here
    """)
    assert proc.returncode not in (0, 124), proc.stderr
    assert seconds < BOUND_S
    assert "spmdsim: error on rank 2: ValueError: boom on rank two" in proc.stderr
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("SEGMENTS")), None)
    assert line is not None, proc.stdout + proc.stderr
    segments = line.split()[1:]
    if not segments:
        pytest.skip("this MPI maps no named /dev/shm segment (the abort and its message were checked)")
    assert [s for s in segments if os.path.exists(s)] == []


def test_release_shared_segments_unlinks_only_mpi_segments(tmp_path):
    from spmdsim.runtime.guard import release_shared_segments

    mine = f"/dev/shm/mpich_shm_spmdsimtest_{os.getpid()}"
    other = f"/dev/shm/spmdsimtest_other_{os.getpid()}"
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    for path in (mine, other):
        open(path, "w").close()
    try:
        maps = tmp_path / "maps"
        maps.write_text(f"7f00-7f01 rw-s 00000000 00:1a 12 {mine}\n"
                        f"7f01-7f02 rw-s 00000000 00:1a 13 {other}\n"
                        "7f02-7f03 rw-s 00000000 00:1a 14 /dev/shm/mpich_shm_gone (deleted)\n"
                        "7f03-7f04 r-xp 00000000 08:01 15 /usr/lib/libc.so.6\n")
        assert release_shared_segments(str(maps)) == [mine]
        assert not os.path.exists(mine) and os.path.exists(other)
        assert release_shared_segments(str(tmp_path / "missing")) == []
    finally:
        for path in (mine, other):
            if os.path.exists(path):
                os.unlink(path)


def test_spmdsim_error_on_some_ranks_aborts_after_grace():
    proc, seconds = _launch("""
    with abort_on_error():
        if mesh.rank == 1:
            raise ShapeError("only rank one disagrees")
        mesh.comm.Barrier()
    """)
    assert proc.returncode not in (0, 2, 124), proc.stderr
    assert seconds < BOUND_S
    assert "spmdsim: error on rank 1: only rank one disagrees" in proc.stderr


#: A job whose ranks all fail alike: its agreement ends when the last rank arrives, so a long grace costs nothing
#: there, and HEADER's 1 s was once too short in CI (ranks 0 and 2 aborted: 3 workers and 4 ranks on 2 cores).
ALL_FAIL = "    guard.GRACE_S = 10.0\n"  # indented as the bodies it starts (textwrap.dedent)


def test_uniform_spmdsim_error_exits_2_with_one_line():
    proc, seconds = _launch(ALL_FAIL + """
    @abort_on_error()
    def main():
        raise ShapeError("tensor dim 0 of size 10 is not divisible by 4 shards")
    main()
    """)
    assert proc.returncode == 2, proc.stderr
    lines = program_lines(proc.stderr)  # Open MPI adds an exit banner
    assert lines == ["spmdsim: error: tensor dim 0 of size 10 is not divisible by 4 shards"]
    assert seconds < BOUND_S


def test_run_guarded_returns_2_and_excepthook_aborts():
    proc, _ = _launch(ALL_FAIL + """
    code = run_guarded(lambda: (_ for _ in ()).throw(ShapeError("same everywhere")), MPI.COMM_WORLD)
    codes = MPI.COMM_WORLD.gather(code)
    if mesh.rank == 0:
        print("codes", codes, flush=True)
    """)
    assert proc.returncode == 0 and f"codes {[2] * RANKS}" in proc.stdout, proc.stderr
    assert proc.stderr.count("spmdsim: error: same everywhere") == 1
    proc, seconds = _launch("""
    install_excepthook()
    if mesh.rank == 3:
        raise KeyError("uncaught on rank three")
    mesh.comm.Barrier()
    """)
    assert proc.returncode not in (0, 124) and seconds < BOUND_S
    assert "spmdsim: error on rank 3: KeyError" in proc.stderr


def test_launch_cli_runs_the_job_and_enforces_its_timeout():
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "spmdsim", "launch", *args], capture_output=True, text=True, timeout=90
    )
    ok = run("-n", "2", "--timeout", "60", "--", "python", "-c",
             "import os; from mpi4py import MPI; c = MPI.COMM_WORLD; "
             "c.rank or print('w', c.size, os.environ['SPMDSIM_EXPECT_WORLD'], os.environ['OMP_NUM_THREADS'])")
    assert ok.returncode == 0 and ok.stdout.split()[:3] == ["w", "2", "2"], ok.stderr
    start = time.monotonic()
    slow = run("-n", "2", "--timeout", "2", "--", "python", "-c", "import time; time.sleep(60)")
    assert slow.returncode == 124 and time.monotonic() - start < 30
    # its line last, after MPICH's banner on the kill (and before any segment removed: another test's job may leave
    # one meanwhile); within 100 columns
    said = _before_removed(slow.stderr)
    assert " ".join(said.split()).endswith(
        "spmdsim: error: job exceeded the 2 s timeout; stopped it (any banner above is mpiexec's on the kill); ranks "
        "waiting in a collective another rank skipped? --watchdog SECONDS names them"), slow.stderr
    assert max(map(len, slow.stderr.splitlines())) <= 100
    slow = run("-n", "2", "--timeout", "2", "--watchdog", "60", "--", "python", "-c", "import time; time.sleep(60)")
    assert slow.returncode == 124 and _before_removed(slow.stderr).endswith(  # no hint: it is on
        "exceeded the 2 s timeout; stopped it (any banner above is mpiexec's on the kill)\n"), slow.stderr
    bad = run("-n", "2", "--")
    assert bad.returncode == 2 and "needs a command" in bad.stderr


def _before_removed(stderr: str) -> str:
    """`stderr` without the lines naming shared-memory segments launch removed at its end."""
    return stderr[:stderr.index("spmdsim: removed ")] if "spmdsim: removed " in stderr else stderr


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_launch_stopped_by_a_signal_stops_its_job_first(sig, tmp_path):
    """A batch system's time limit (SIGTERM) or a closed terminal (SIGHUP) ended `spmdsim launch` at once, and its
    job, a session of its own that no signal for launch reaches, ran on: ranks spinning with no launch to stop
    them. Now the job is stopped first: one line, exit 128 + N, no rank left."""
    import signal

    program = ("import os, sys, time; open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close(); "
               "time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-m", "spmdsim", "launch", "-n", "2", "--timeout", "100", "--",
                             "python", "-c", program, str(tmp_path)], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = [int(name) for name in os.listdir(tmp_path)]
        assert len(ranks) == 2
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + getattr(signal, sig), err
    assert err.splitlines()[-1] == f"spmdsim: launch got {sig}; stopped the job", err
    for pid in ranks:  # each rank gone (a zombie its parent has not reaped yet is gone as well)
        try:
            with open(f"/proc/{pid}/stat") as fh:
                assert fh.read().split(") ")[1][0] == "Z", f"rank {pid} runs on"
        except FileNotFoundError:
            pass


@pytest.mark.skipif(not MPICH, reason="MPICH's mpiexec forwards Ctrl-C to the ranks; Open MPI's prterun handles it "
                                      "itself (its own 'Abort is in progress' banner, exit 1)")
@pytest.mark.parametrize("wait", ["polite", "busy"])
def test_ctrl_c_ends_an_mpi_job_with_one_line_and_130(wait):
    """mpiexec forwards SIGINT to every rank: rank 0 says so once, no traceback, exit 130.

    Busy: ranks wait inside MPI's blocking calls, where their main threads run no Python.
    """
    import signal

    body = HEADER + textwrap.dedent("""
    import sys
    install_excepthook()
    x = np.ones(1000)
    for i in range(10**9):
        allreduce(mesh, x, ("dp", "mp"), out=x)
        x[:] = 1
        if i == 10 and mesh.rank == 0:
            print("running", flush=True)
    """)
    for attempt in range(6):  # the race below came three launches in a row once in CI (2026-11-28, 3 workers busy)
        # timeout forwards the SIGINT it gets to mpiexec, which forwards it to every rank, as a
        # terminal's Ctrl-C reaches them.
        proc = subprocess.Popen(["timeout", "-k", "5", "60", MPIEXEC, "-n", str(RANKS), sys.executable, "-c",
                                 body], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True, preexec_fn=as_a_shell_starts_it,
                                env={**os.environ, "OMP_NUM_THREADS": "1", "SPMDSIM_WAIT": wait})
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and "running" not in proc.stdout.readline():
                pass
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=BOUND_S)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        # MPICH's Hydra proxy can lose a race with ranks exiting on the signal ("assert (!closed)
        # failed", its own error, with exit 255 or 0: about 1 launch in 40 here; pmodels/mpich#1455
        # is this class of race with piped output): launch again.
        if "assert (!closed) failed" not in err:
            break
    assert proc.returncode == 130, err
    assert err.count("spmdsim: interrupted (Ctrl-C): every rank stopped") == 1, err
    assert "Traceback" not in err


def test_a_job_nearly_out_of_memory_ends_with_one_line_per_rank_that_saw_it():
    """The memory watch (runtime.memwatch) ends the job with MPI_Abort instead of leaving the
    kernel to kill a rank without a word; rank 1 here reads a machine with 256 MiB of 24 GiB left."""
    proc, seconds = _launch("""
    import time
    import spmdsim.runtime.memwatch as memwatch
    from spmdsim.runtime.engines import memory
    memwatch.POLL_S = 0.1
    install_excepthook()  # the guard starts the watch (runtime.process); a Mesh alone does not
    if mesh.rank == 1:
        memory.held = lambda: 2 << 30
        memory.readings = lambda: (2 << 30, 1 << 28, 24 << 30)
    time.sleep(30)  # a long computation: the watch ends it
    allreduce(mesh, np.ones(4), ("dp", "mp"))
    """)
    assert proc.returncode not in (0, 124), proc.stderr
    assert seconds < BOUND_S
    assert ("spmdsim: error: rank 1 ended the job before this machine ran out of memory: it holds 2.0 GiB, "
            f"{RANKS} ranks run on this node and 0.2 GiB of its 24.0 GiB are left; run fewer ranks or smaller "
            "shapes, or a dry run (--ranks N --dry-run: shapes only, each rank's bytes)") in proc.stderr.splitlines()
    assert "Traceback" not in proc.stderr
