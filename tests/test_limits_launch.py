"""`spmdsim launch` removes the shared-memory segments its own job left when the job is killed, and nothing else."""
from __future__ import annotations

import contextlib
import mmap
import os
import pathlib
import shlex
import subprocess
import sys
import textwrap
import time
from typing import Any, Callable, Iterator

import pytest

from testkit import MPICH, MPIEXEC, unfold

from spmdsim.tools.cli.segments import remove_left_since

ROOT = pathlib.Path(__file__).resolve().parent.parent

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
        # (the note is folded within 100 columns: its names may start on a line of their own)
        note = [line for line in unfold(done.stderr).splitlines() if line.startswith("spmdsim: removed")]
        job = {os.path.basename(p) for p in segments}
        if not MPICH and not any(name in line for line in note for name in job):  # (a note may name only another
            # job's segments: this one's its prterun removed, another test's killed job's it left)
            pytest.skip(f"this MPI's launcher removed its killed job's segments itself (mapped: {mapped}): none were "
                        "left for spmdsim launch to remove")
        assert len(note) == 1, done.stderr
        # Some mapped files (UCX's) are unlinked while in use; the note names what was left. It may also name
        # another job's MPI segment that no process held, made while this one ran (an aborted job of a test
        # on another worker): removed by design; a file of any other kind never.
        named = set(note[0].split(": ")[-1].split(", "))
        others = named - {os.path.basename(p) for p in segments}
        assert others < named and all(n.startswith(("mpich_shm_", "sm_segment.")) for n in others), (note, mapped)
    finally:
        os.unlink(decoy)


@pytest.mark.skipif(not (os.path.isdir("/proc/self/fd") and os.path.isdir("/dev/shm")),
                    reason="needs Linux /proc and /dev/shm")
def test_launch_removes_an_mpi_segment_it_never_saw_mapped_once_no_process_holds_it():
    """The maps are read every 0.2 s: a rank killed just after MPI_Init left MPICH's segment, never noted.

    An MPI segment made while the job ran is removed when no process holds it (open or mapped); one a live process
    maps, one that is not MPI's and one older than the job are kept.
    """
    from spmdsim.tools.cli import launch

    with _four_files("spmdsim_limits", launch._SegmentWatch) as (older, orphan, held, other, watch):
        assert watch.orphans() == {os.path.basename(orphan)}
        assert watch.remove_left() == [os.path.basename(orphan)]
        assert not os.path.exists(orphan) and all(map(os.path.exists, (older, held, other)))


@contextlib.contextmanager
def _four_files(name: str, between: Callable[[], Any]) -> Iterator[tuple]:
    """Four files in /dev/shm named after `name`: an MPI segment made before `between()` is called, then an MPI
    segment no process holds, one this block holds mapped and a file not MPI's. The block gets their paths and
    what `between` returned; the files are removed after it."""
    tag = f"{name}_{os.getpid()}"
    paths = tuple(f"/dev/shm/{n}" for n in (f"mpich_shm_{tag}_older", f"mpich_shm_{tag}_orphan",
                                            f"sm_segment.{tag}_held", f"{tag}_not_mpi"))
    try:
        for path in paths:
            with open(path, "wb") as fh:
                fh.write(b"\0" * 4096)
            if path == paths[0]:
                time.sleep(0.05)  # the file systems' times apart: the older one before, the others after
                mark = between()
                time.sleep(0.05)
        with open(paths[2], "r+b") as fh, mmap.mmap(fh.fileno(), 4096):
            yield (*paths, mark)
    finally:
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)


_DIES_AT_ONCE = textwrap.dedent("""
    import os, signal, sys, time
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        with open(f"/proc/{os.getpid()}/maps") as fh:
            names = {line.split()[5] for line in fh if " /dev/shm/" in line
                     and not line.rstrip().endswith("(deleted)")}
        with open(sys.argv[1] + ".tmp", "w") as out:
            out.write("\\n".join(sorted(names)))
        os.rename(sys.argv[1] + ".tmp", sys.argv[1])
    else:
        while not os.path.exists(sys.argv[1]):
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGKILL)  # within a poll of MPI_Init
    comm.Barrier()
""")


@pytest.mark.skipif(not (MPIEXEC and os.path.isdir("/proc/self/task") and os.path.isdir("/dev/shm")),
                    reason="needs mpiexec, Linux /proc and /dev/shm")
def test_launch_removes_the_segment_of_a_rank_killed_right_after_mpi_init(tmp_path):
    script, listing = tmp_path / "job.py", tmp_path / "mapped.txt"
    script.write_text(_DIES_AT_ONCE)
    done = subprocess.run([sys.executable, "-m", "spmdsim", "launch", "-n", "2", "--timeout", "60", "--",
                           "python", str(script), str(listing)], capture_output=True, text=True, timeout=90)
    assert done.returncode != 0, done.stderr
    segments = [p for p in listing.read_text().split()
                if os.path.basename(p).startswith(("mpich_shm_", "sm_segment."))]
    if not segments:
        pytest.skip("this MPI's segments were unlinked while the job ran: a killed job leaves none to remove")
    assert not any(os.path.exists(p) for p in segments), (segments, done.stderr)


def test_the_removal_note_counts_its_segments_in_the_singular_and_plural(monkeypatch, capsys):
    """The note said "removed 1 shared-memory segment(s)"; now "1 shared-memory segment", "2 ... segments"."""
    from spmdsim.tools.cli import launch

    for left in (["mpich_shm_a"], ["mpich_shm_a", "sm_segment.b"], ["mpich_shm_a", "mpich_shm_c"]):
        class Watch:
            seen = {"mpich_shm_a", "sm_segment.b"}  # mapped by the job's processes; mpich_shm_c by none seen

            def note(self, pid):
                pass

            def remove_left(self, left=left):
                return left

        monkeypatch.setattr(launch, "_SegmentWatch", Watch)
        assert launch.run_with_timeout([sys.executable, "-c", "pass"], dict(os.environ), 60) == 0
    assert capsys.readouterr().err.replace("\n  ", " ").splitlines() == [
        "spmdsim: removed 1 shared-memory segment the job left: mpich_shm_a",
        "spmdsim: removed 2 shared-memory segments the job left: mpich_shm_a, sm_segment.b",
        "spmdsim: removed 1 shared-memory segment the job left: mpich_shm_a",
        "spmdsim: removed 1 shared-memory segment made since the job started that no process holds (a rank's that "
        "died at its start, or another job's): mpich_shm_c"]


def _test_sh_cleanup(started: str) -> subprocess.CompletedProcess:
    """scripts/test.sh's `cleanup` function, as the script defines it, run with its `started` file."""
    text = (ROOT / "scripts" / "test.sh").read_text()
    body = text[text.index("cleanup() {"):]
    body = body[:body.index("\n}\n") + 3]
    return subprocess.run(["bash", "-c", f"set -euo pipefail\ncd {shlex.quote(str(ROOT))}\n{body}\n"
                           f"started={shlex.quote(started)}\ncleanup"], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not (os.path.isdir("/proc/self/fd") and os.path.isdir("/dev/shm")),
                    reason="needs Linux /proc and /dev/shm")
def test_the_test_scripts_cleanup_keeps_a_segment_another_live_job_maps(tmp_path):
    """scripts/test.sh removed every MPI segment of the user's newer than its start: a job started meanwhile (another
    terminal's) lost its live segment. It removes, as `spmdsim launch` does, only those no process holds."""
    started = tmp_path / "started"
    with _four_files("spmdsim_testsh", lambda: started.write_text("")) as (older, orphan, held, other, _):
        done = _test_sh_cleanup(str(started))
        assert done.returncode == 0 and done.stdout == "" and done.stderr == "", done
        assert os.path.exists(held), "a live job's segment was removed"
        assert not os.path.exists(orphan) and all(map(os.path.exists, (older, other)))
    assert not started.exists()  # the run's marker goes too


@pytest.mark.skipif(not (os.path.isdir("/proc/self/fd") and os.path.isdir("/dev/shm")),
                    reason="needs Linux /proc and /dev/shm")
def test_a_pytest_sessions_end_removes_the_segments_it_left_and_nothing_else():
    """tests/conftest.py's session end removes what scripts/test.sh's trap does (remove_left_since): a plain
    `pytest` of the tests that abort MPICH jobs on purpose left their segments in /dev/shm until reboot."""
    with _four_files("spmdsim_session", time.time) as (older, orphan, held, other, since):
        removed = remove_left_since(since)
        assert os.path.exists(held), "a live job's segment was removed"
        assert os.path.basename(orphan) in removed and not os.path.exists(orphan)
        assert all(map(os.path.exists, (older, other)))
