"""Simulated ranks are threads: the limits on threads and their stacks are refused in one line, before any rank
runs (spmdsim.runtime.sim.thread_limits), and a thread that cannot start anyway ends the run in one line, not a
traceback naming a rank that never ran."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading

import pytest

from spmdsim.tools.cli.main import main
from spmdsim.runtime.sim import simulate
from spmdsim.runtime.sim.thread_limits import ThreadLimitError, stack_bytes


def unfold(text: str) -> str:
    """A message folded within 100 columns (spmdsim.errors.fold_message) back on one line."""
    return text.replace("\n  ", " ")


pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="address-space caps as Linux sets them")


def test_an_address_space_cap_too_small_for_the_stacks_is_one_line_before_the_banner():
    """Under ``ulimit -v`` (set in the child, 1 GiB above what it maps) 1,024 ranks' stacks cannot fit: exit 2,
    one line naming the count, the stack, ulimit -v and how many fit; no banner, no thread started. It was a
    traceback of threading.py's "can't start new thread", reported as an error on a simulated rank."""
    code = ("import resource, sys\n"
            "size = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmSize'))\n"
            "cap = size * 1024 + (1 << 30)\n"
            "resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))\n"
            "from spmdsim.tools.cli.main import main\n"
            "sys.exit(main(['run', 'mlp', '--shape', '8,16,4096', '--ranks', '1024']))\n")
    done = subprocess.run([sys.executable, "-c", "import spmdsim.tools.cli.run\n" + code], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""  # not even the banner: refused before anything runs
    line = unfold(done.stderr)
    assert line.count("\n") == 1 and "Traceback" not in line, done.stderr
    assert line.startswith("spmdsim: error: 1024 simulated ranks need 1024 threads, each mapping its stack of "), line
    assert "(ulimit -v)" in line and " ranks fit: fewer ranks" in line, line


def test_a_thread_that_cannot_start_ends_the_run_in_one_line(monkeypatch, capsys):
    """A limit the check cannot see (the user's other processes under ulimit -u): the fifth rank's thread does
    not start. The four started stop, and the run ends with one line and exit 1, no traceback."""
    start = threading.Thread.start

    def limited(self):
        if self.name.startswith("spmdsim rank ") and int(self.name.split()[-1]) >= 4:
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", limited)
    # Rank threads an earlier test's run left on purpose (a rank stuck outside any wait is left behind, as
    # simulate() documents) are not this run's: only those it started must stop.
    before = set(threading.enumerate())
    code = main(["run", "mlp", "--shape", "8,16,64", "--ranks", "8"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err, err
    assert unfold(err) == ("spmdsim: error: only 4 of the 8 simulated ranks' threads could start (can't start "
                           "new thread): this process's address space (ulimit -v; each thread maps its stack of "
                           f"{stack_bytes() >> 20} MiB, ulimit -s) or the threads this user or cgroup may run "
                           "(ulimit -u, pids.max) ran out; fewer ranks, or a dry run (one thread)\n")
    assert not [t for t in threading.enumerate() if t.name.startswith("spmdsim rank ") and t not in before]
    with pytest.raises(ThreadLimitError, match=r"^only 4 of the 8 simulated ranks' threads could start"):
        simulate(8, lambda: None)


class _Signal(BaseException):
    """What a signal handler raises (mpirun's SIGTERM is such a BaseException)."""


def test_a_signal_inside_a_threads_start_is_the_signal_not_a_thread_limit(monkeypatch):
    """SIGTERM's exception raised while start() waits on its lock left the lock half released, and start() raised
    RuntimeError("release unlocked lock") with the signal's exception as its context: the run said "only 0 of
    the 4 simulated ranks' threads could start" where mpirun's own SIGTERM line was due (seen once in the suite).
    The signal's exception is raised; a RuntimeError of start() that is neither is raised as it is."""
    start = threading.Thread.start

    def interrupted(self):
        if self.name == "spmdsim rank 1":
            try:
                raise _Signal()
            except _Signal:
                raise RuntimeError("release unlocked lock")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    with pytest.raises(_Signal):
        simulate(4, lambda: None)

    def broken(self):
        if self.name == "spmdsim rank 1":
            raise RuntimeError("thread already started")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", broken)
    with pytest.raises(RuntimeError, match="^thread already started$"):
        simulate(4, lambda: None)


def test_simulate_refuses_a_count_over_the_cgroups_pids_before_any_thread_starts(monkeypatch):
    """The library's simulate() refuses as the CLI does, before the first rank's thread: here a cgroup that may
    start 100 more tasks (pids.max), asked for 128 ranks."""
    from spmdsim.runtime.sim import thread_limits

    monkeypatch.setattr(thread_limits, "_cgroup_pids_left", lambda: (100, "/sys/fs/cgroup/pids.max"))
    started, start = [], threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: started.append(self.name) or start(self))
    with pytest.raises(ThreadLimitError) as refused:
        simulate(128, lambda: None)
    assert str(refused.value) == ("simulate: 128 simulated ranks need 128 threads, but this process's cgroup may "
                                  "start 100 more (/sys/fs/cgroup/pids.max): fewer ranks, or a dry run (one thread)")
    assert started == []
    assert simulate(128, lambda: 1, dry_run=True) == [1] * 128  # a dry run needs one thread
    assert started == ["spmdsim dry run"]


def test_mpirun_reports_a_thread_limit_in_one_line():
    """`spmdsim mpirun -n 1024` under an address-space cap printed a traceback ending in the thread-limit error."""
    prog = "from mpi4py import MPI\nMPI.COMM_WORLD.Barrier()\n"
    code = ("import resource, sys\n"
            "size = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmSize'))\n"
            "cap = size * 1024 + (1 << 30)\n"
            "resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))\n"
            "from spmdsim.tools.cli.main import main\n"
            "sys.exit(main(['mpirun', '-n', '1024', sys.argv[1]]))\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "barrier.py")
        with open(path, "w") as f:
            f.write(prog)
        done = subprocess.run([sys.executable, "-c", "import spmdsim.tools.cli.mpirun\n" + code, path],
                              capture_output=True, text=True, timeout=120)
    line = unfold(done.stderr)
    assert done.returncode == 1 and "Traceback" not in line and line.count("\n") == 1, done.stderr[-2000:]
    assert line.startswith("spmdsim mpirun: error: 1024 simulated ranks need 1024 threads"), line


@pytest.mark.parametrize("value, want", [("3", 3), ("\u00b2", None), ("abc", None)])
def test_malloc_arena_max_that_is_no_count_counts_as_unset(monkeypatch, value, want):
    """'²' is a digit to str.isdigit but not to int(): it raised a ValueError under ulimit -v."""
    from spmdsim.runtime.sim import thread_limits

    monkeypatch.setenv("MALLOC_ARENA_MAX", value)
    assert thread_limits._arenas(1 << 62) == (want or 8 * (os.cpu_count() or 1))
