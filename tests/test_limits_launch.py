"""`spmdsim launch` removes the shared-memory segments its own job left when the job is killed."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from testkit import MPICH, MPIEXEC

# Rank 0 notes the /dev/shm files it maps (MPI's segment and a decoy made before the
# launch), waits so the launcher sees them, then dies by SIGKILL: MPI cannot clean up.
_JOB = textwrap.dedent("""
    import mmap, os, signal, sys, time
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    with open(sys.argv[2], "r+b") as fh:
        decoy = mmap.mmap(fh.fileno(), 4096)
    comm.Barrier()
    if comm.rank == 0:
        with open(f"/proc/{os.getpid()}/maps") as fh:
            names = {line.split()[5] for line in fh if " /dev/shm/" in line
                     and not line.rstrip().endswith("(deleted)")}  # unlinked while mapped: nothing left
        with open(sys.argv[1], "w") as out:
            out.write("\\n".join(sorted(names)))
    time.sleep(1.0)
    if comm.rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.Barrier()
""")


@pytest.mark.skipif(not (MPIEXEC and os.path.isdir("/proc/self/task") and os.path.isdir("/dev/shm")),
                    reason="needs mpiexec, Linux /proc and /dev/shm")
def test_launch_removes_the_segments_of_a_killed_job_and_nothing_else(tmp_path):
    script, listing = tmp_path / "job.py", tmp_path / "mapped.txt"
    script.write_text(_JOB)
    decoy = f"/dev/shm/spmdsim_limits_decoy_{os.getpid()}"
    with open(decoy, "wb") as fh:
        fh.write(b"\0" * 4096)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "spmdsim", "launch", "-n", "2", "--timeout", "60", "--",
             "python", str(script), str(listing), decoy],
            capture_output=True, text=True, timeout=90)
        mapped = listing.read_text().split()
        segments = [p for p in mapped if p != decoy]
        assert done.returncode != 0
        if not segments:  # MPICH 4.2 unlinks its segment once every rank has it mapped
            pytest.skip(f"this MPI's segments were unlinked while the job ran (mapped: {mapped}): a killed job "
                        "leaves none to remove")
        assert not any(os.path.exists(p) for p in segments), (segments, done.stderr)
        assert os.path.exists(decoy)  # mapped by the job too, but made before it started
        note = [line for line in done.stderr.splitlines() if line.startswith("spmdsim: removed")]
        if not note and not MPICH:
            pytest.skip(f"this MPI's launcher removed its killed job's segments itself (mapped: {mapped}): none were "
                        "left for spmdsim launch to remove")
        assert len(note) == 1, done.stderr
        # Some mapped files (UCX's) are unlinked while in use; the note names what was left.
        named = note[0].split(": ")[-1].split(", ")
        assert set(named) <= {os.path.basename(p) for p in segments}, (note, mapped)
    finally:
        os.unlink(decoy)
