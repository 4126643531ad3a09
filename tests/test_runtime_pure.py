"""Pure parts of the runtime: wait-mode choice, trace bookkeeping, launch helpers (no MPI)."""
from __future__ import annotations

import json
import os
import sys
import time
import types

import pytest

from spmdsim import SpmdsimError
from spmdsim.tools.cli import launch
from spmdsim.tools.cli.segments import started
from spmdsim.runtime.engines import wait
from spmdsim.runtime import trace
from testkit import unfold


class _FakeComm:
    def __init__(self, size):
        self.size = size

    def Get_size(self):
        return self.size

    def allgather(self, value):
        return [value] * self.size

    def gather(self, value, root=0):  # this rank is the root: every rank sent the same
        return [value] * self.size

    def bcast(self, value, root=0):
        return value


def test_wait_mode_from_argument_env_and_auto(monkeypatch):
    comm = _FakeComm(8)
    assert wait.resolve_wait_mode("busy", comm) == "busy"
    assert wait.resolve_wait_mode("polite", comm) == "polite"
    monkeypatch.setenv("SPMDSIM_WAIT", "POLITE")
    assert wait.resolve_wait_mode(None, comm) == "polite"
    monkeypatch.setenv("SPMDSIM_WAIT", "auto")
    monkeypatch.setenv("MPI_LOCALNRANKS", "8")
    monkeypatch.setattr(wait, "cores_available", lambda: 2)
    assert wait.resolve_wait_mode(None, comm) == "polite"
    monkeypatch.setattr(wait, "cores_available", lambda: 16)
    assert wait.resolve_wait_mode(None, comm) == "busy"
    assert wait.resolve_wait_mode("auto", _FakeComm(1)) == "busy"
    with pytest.raises(SpmdsimError, match=r"'spin' is not a known wait mode; expected one of"):
        wait.resolve_wait_mode("spin", comm)
    monkeypatch.setenv("SPMDSIM_WAIT", "sleepy")
    with pytest.raises(SpmdsimError, match=r"^SPMDSIM_WAIT='sleepy' is not a known wait mode; expected one of"):
        wait.resolve_wait_mode(None, comm)


def test_polite_wait_polls_until_done():
    class Request:
        calls = 0

        def Test(self):
            self.calls += 1
            return self.calls >= 200

    request = Request()
    wait.polite_wait(request)
    assert request.calls == 200


def test_polite_wait_sleeps_up_to_1_ms_only_once_it_has_slept_10_ms(monkeypatch):
    """After the yields, sleeps of 20 us doubling to 100 us; once they have lasted 10 ms (another rank's work, not a
    message in flight), doubling on to 1 ms. A clock that moves 1 us a reading and by each sleep."""
    now, slept = [0.0], []

    def clock():
        now[0] += 1e-6
        return now[0]

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(wait, "time", types.SimpleNamespace(perf_counter=clock, sleep=sleep))
    monkeypatch.setattr(wait, "os", types.SimpleNamespace(sched_yield=lambda: None))

    class Request:
        def Test(self):
            return sum(slept) > 0.05

    wait.polite_wait(Request())
    assert slept[:5] == pytest.approx([20e-6, 40e-6, 80e-6, 100e-6, 100e-6])
    first = next(i for i, s in enumerate(slept) if s > 100e-6)
    assert 9.9e-3 < sum(slept[:first]) < 10.2e-3
    assert slept[first:first + 5] == pytest.approx([200e-6, 400e-6, 800e-6, 1e-3, 1e-3])
    assert max(slept) == pytest.approx(1e-3)


def test_trace_collects_nested_and_skips_when_closed():
    trace.record("allreduce", ("mp",), 4, 10, 10, 0.5, None)  # no collector: dropped
    with trace.collect_trace() as outer:
        trace.record("allgather", ("dp", "mp"), 8, 70, 70, 0.25, "x")
        with trace.collect_trace() as inner:
            trace.record("allreduce", ("mp",), 1, 0, 0, 0.0, None)
    assert outer.counts() == {"allgather": 1}
    assert outer.counts(include_local=True) == {"allgather": 1, "allreduce": 1}
    assert len(inner) == 1 and inner.entries[0].group_size == 1
    assert outer.totals() == {"calls": 1, "bytes_sent": 70, "bytes_received": 70, "seconds": 0.25}
    assert json.loads(outer.to_json())[0]["axes"] == ["dp", "mp"]
    assert "allgather" in outer.summary() and "total" in outer.summary()
    reduced = outer.reduce(_FakeComm(4))
    assert reduced["bytes_sent_total"] == 280 and reduced["bytes_sent_max"] == 70
    assert reduced["counts"] == {"allgather": 1} and reduced["ranks"] == 4
    assert str(outer.entries[0]).startswith("allgather(dp,mp) g=8")
    assert outer.seconds() == 0.25 and outer.seconds(1) == 0.0 and inner.seconds() == 0.0


def test_trace_entries_keep_copied_bytes_and_build_once():
    with trace.collect_trace() as tr:
        trace.record("alltoall", ("x",), 8, 7, 7, 0.5, "a", 64)
        first = tr.entries
        trace.record("allgather", ("x",), 8, 7, 7, 0.25, None)
    assert first[0].bytes_copied == 64 and tr.entries[1].bytes_copied == 0
    assert tr.entries[0] is first[0]  # built on the first read, not again
    assert json.loads(tr.to_json())[0]["bytes_copied"] == 64
    assert len(tr) == 2 and tr.seconds(1) == 0.25
    (start, end), = tr.spans(1)
    assert end - start == 0.25 and end == tr.entries[1].ended_at
    assert tr.entries[1].started_at == start and 0 < end <= time.perf_counter()


def test_launch_command_env_and_family(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    # A script that is not there: refused once, not by Python once per rank ("can't open file ...").
    with pytest.raises(SpmdsimError, match=r"launch: script 'prog.py' does not exist \(in "):
        launch.build_command("/venv/bin/mpiexec", 8, ["--", "python", "prog.py"])
    # A script that does not compile: refused once, not by Python once per rank (8 SyntaxErrors at -n 8).
    (tmp_path / "prog.py").write_text("def f(:\n    pass\n")
    with pytest.raises(SpmdsimError, match=r"^launch: script 'prog.py', line 1: SyntaxError: invalid syntax; "
                                           r"expected a Python program this Python compiles"):
        launch.build_command("/venv/bin/mpiexec", 8, ["--", "python", "prog.py"])
    (tmp_path / "prog.py").write_text("print(1)\n")
    cmd = launch.build_command("/venv/bin/mpiexec", 8, ["--", "python", "prog.py"])
    assert cmd == ["/venv/bin/mpiexec", "-n", "8", sys.executable, "prog.py"]
    assert launch.build_command("mpiexec", 2, ["python", "-c", "print(1)"])[3:] == [sys.executable, "-c", "print(1)"]
    with pytest.raises(SpmdsimError, match="needs a command"):
        launch.build_command("mpiexec", 2, ["--"])
    # A typo in the program: refused once, not by mpiexec once per rank ("execvp error on file ...").
    with pytest.raises(SpmdsimError, match=r"launch: command 'spmdsimm' is not an executable program on PATH or "
                                            r"beside this Python"):
        launch.build_command("mpiexec", 2, ["--", "spmdsimm", "demo"])
    # spmdsim itself: the one on PATH, or (the venv not activated) the one beside this Python
    bin_dir = os.path.dirname(sys.executable)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ.get("PATH", ""))
    assert launch.build_command("mpiexec", 2, ["--", "spmdsim", "demo"])[3] == "spmdsim"
    monkeypatch.setenv("PATH", str(tmp_path))
    assert launch.build_command("mpiexec", 2, ["--", "spmdsim", "demo"])[3] == os.path.join(bin_dir, "spmdsim")
    monkeypatch.setattr(wait, "cores_available", lambda: 2)
    env = launch.launch_env(8, None, base={"PATH": "/bin"})
    assert env["SPMDSIM_WAIT"] == "auto" and env["OMP_NUM_THREADS"] == "1"
    assert env["SPMDSIM_EXPECT_WORLD"] == "8" and env["OPENBLAS_NUM_THREADS"] == "1"
    env = launch.launch_env(1, "busy", base={"OMP_NUM_THREADS": "4"})  # the user's count for every library:
    assert env["SPMDSIM_WAIT"] == "busy" and env["OMP_NUM_THREADS"] == "4" and env["MKL_NUM_THREADS"] == "4"
    assert env["OPENBLAS_NUM_THREADS"] == "4"  # (OpenBLAS reads its own first: the cap there lost the user's 4)
    env = launch.launch_env(8, None, base={"OMP_NUM_THREADS": "abc", "MKL_NUM_THREADS": "3"})
    assert [env[v] for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")] == ["3", "3", "3"]
    assert launch._family("HYDRA build details:\n Version: 5.0.2") == "mpich"
    assert launch._family("mpirun (Open MPI) 5.0.3") == "openmpi"
    assert launch._family("libmpi.so.40") == "openmpi" and launch._family("libmpi.so.12") == "mpich"
    assert launch._family("something else") is None


def test_launch_with_no_mpiexec_names_a_systems_mpi_too(monkeypatch, tmp_path):
    """A cluster user without the `mpi` extra read "install the 'mpi' extra" alone, not their site's MPI."""
    monkeypatch.setattr(launch.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SpmdsimError, match=r"^no mpiexec found beside this Python or on PATH; install the 'mpi' extra "
                                           r"\(pip install mpich\), or use your system's MPI \(its mpiexec on PATH, "
                                           r"or --mpiexec PATH\)$"):
        launch.find_mpiexec()


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_launch_reports_a_killed_mpiexec_as_a_shell_does(sig, tmp_path):
    """An mpiexec ended by signal N (the OOM killer's SIGKILL, a kill from outside): exit 128 + N, as a shell and
    coreutils `timeout` say. Popen's -N went back as it was, and `spmdsim launch` exited 247 for SIGKILL."""
    import signal
    import subprocess

    cmd = [sys.executable, "-c", f"import os, signal; os.kill(os.getpid(), signal.{sig})"]
    assert launch.run_with_timeout(cmd, dict(os.environ), 60) == 128 + getattr(signal, sig)
    assert launch.run_with_timeout([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), 60) == 3
    killed = tmp_path / "mpiexec"  # an mpiexec a signal ends, the whole CLI path
    killed.write_text(f"#!/bin/sh\nkill -{sig[3:]} $$\n")
    killed.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "spmdsim", "launch", "-n", "1", "--no-mpi-check", "--mpiexec",
                           str(killed), "--", "python", "-c", "pass"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 128 + getattr(signal, sig), done.stderr


#: An mpiexec as Open MPI's prterun can be: it ignores SIGTERM, and its rank runs in a session of its own.
PRTERUN_IGNORING_SIGTERM = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
with open(sys.argv[-1], "w") as fh:
    fh.write(str(rank.pid))
time.sleep(120)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="the job's processes are read from Linux's /proc")
def test_a_stopped_job_leaves_no_rank_its_launcher_put_in_a_group_of_its_own(tmp_path, monkeypatch):
    """A job stopped (its timeout) whose launcher ignores SIGTERM and keeps its ranks in process groups of their own,
    as Open MPI's prterun does: the group's SIGKILL ended the launcher alone, and its rank ran on, orphaned."""
    script, pid_file = tmp_path / "prterun.py", tmp_path / "rank.pid"
    script.write_text(PRTERUN_IGNORING_SIGTERM)
    monkeypatch.setattr(launch, "_KILL_GRACE_S", 0.5)
    cmd = [sys.executable, str(script), "-n", "1", str(pid_file)]
    assert launch.run_with_timeout(cmd, dict(os.environ), 5.0) == 124
    rank = int(pid_file.read_text())
    for _ in range(50):  # SIGKILL is delivered at once; its end shows within moments
        if started(rank) is None:
            break
        time.sleep(0.1)
    else:
        os.kill(rank, 9)
        pytest.fail(f"the rank {rank} of the stopped job still runs")


def test_importing_runtime_package_does_not_load_mpi4py():
    import subprocess

    code = ("import sys, spmdsim.runtime, spmdsim.runtime.trace, spmdsim.runtime.engines.wait, "
            "spmdsim.tools.cli.launch, spmdsim.runtime.exchange_spec; print('mpi4py' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_launch_refuses_an_mpiexec_from_another_mpi(tmp_path, capsys):
    from spmdsim.tools.cli.main import main

    fake = tmp_path / "mpiexec"
    fake.write_text('#!/bin/sh\necho "mpirun (Open MPI) 5.0.3"\n')
    fake.chmod(0o755)
    lib = launch.subprocess.run([sys.executable, "-m", "mpi4py", "--mpi-library"],
                                capture_output=True, text=True, timeout=60).stdout
    if launch._family(lib.strip().rsplit("/", 1)[-1]) != "mpich":
        pytest.skip("mpi4py does not use MPICH here")
    assert main(["launch", "-n", "2", "--mpiexec", str(fake), "--", "python", "-c", "1"]) == 2
    assert "is openmpi but mpi4py uses" in unfold(capsys.readouterr().err)


def test_exchange_spec_counts_offsets_and_slots():
    from spmdsim.errors import ShapeError
    from spmdsim.runtime.exchange_spec import ExchangeSpec

    rows = (slice(0, 2), slice(0, 3))
    spec = ExchangeSpec.build(4, 1, (4, 3), [(3, rows, (2, 3)), (0, (slice(2, 4), slice(0, 3)), (2, 3)),
                                             (3, (slice(2, 3), slice(0, 3)), (1, 3))],
                              [(2, 5), (0, 4), (2, 1)])
    assert spec.scounts == (6, 0, 0, 9) and spec.sdispls == (0, 6, 6, 6) and spec.send_total == 15
    assert [p[1:3] for p in spec.packs] == [(6, 12), (0, 6), (12, 15)]  # a peer's boxes stay in order
    assert spec.rcounts == (4, 0, 6, 0) and spec.rdispls == (0, 4, 4, 10) and spec.recv_total == 10
    assert spec.recv_slots == ((2, 4, 9), (0, 0, 4), (2, 9, 10))
    assert spec.peers == 3  # sends to 0 and 3, receives from 0 and 2
    with pytest.raises(ShapeError, match="destination 1 must be another mesh rank"):
        ExchangeSpec.build(4, 1, (4, 3), [(1, rows, (2, 3))], [])
    with pytest.raises(ShapeError, match="source 4 must be another mesh rank"):
        ExchangeSpec.build(4, 1, (4, 3), [], [(4, 1)])
    with pytest.raises(ShapeError, match="does not fit a block of shape"):
        ExchangeSpec.build(4, 1, (4, 3), [(0, (slice(0, 1),), (1,))], [])


@pytest.mark.parametrize("family, ranks, set_by_user, expected", [
    ("openmpi", 64, {}, {"PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
                          "OMPI_MCA_rmaps_base_oversubscribe": "1"}),
    ("openmpi", 64, {"PRTE_MCA_rmaps_default_mapping_policy": ":span"},
     {"PRTE_MCA_rmaps_default_mapping_policy": ":span", "OMPI_MCA_rmaps_base_oversubscribe": "1"}),
    ("openmpi", 1, {}, {}),   # no more ranks than cores: Open MPI's own slots suffice
    ("mpich", 64, {}, {}),    # MPICH oversubscribes by itself
    (None, 64, {}, {}),       # family unknown (--no-mpi-check): nothing guessed
])
def test_launch_asks_open_mpi_to_oversubscribe(monkeypatch, family, ranks, set_by_user, expected):
    # Open MPI refuses more ranks than cores ("not enough slots") unless asked.
    from spmdsim.tools.cli.main import build_parser

    for var in launch.OPENMPI_OVERSUBSCRIBE:
        monkeypatch.delenv(var, raising=False)
    for var, value in set_by_user.items():
        monkeypatch.setenv(var, value)
    seen = {}
    monkeypatch.setattr(launch, "find_mpiexec", lambda explicit: "/x/mpirun")
    monkeypatch.setattr(launch, "check_same_mpi", lambda mpiexec: family)
    monkeypatch.setattr(launch, "run_with_timeout", lambda cmd, env, timeout: seen.update(env) or 0)
    argv = ["launch", "-n", str(ranks)] + (["--no-mpi-check"] if family is None else []) + ["--", "true"]
    args = build_parser().parse_args(argv)
    assert launch.run(args) == 0
    assert {v: seen[v] for v in launch.OPENMPI_OVERSUBSCRIBE if v in seen} == expected


def test_one_module_reaches_mpi_for_the_collectives_and_none_reads_debugs_private_state():
    # The collective layer's one body (runtime.door.issue) records every traced call and
    # applies the debug layers; nothing else in the package reaches into runtime.debug's privates.
    import pathlib
    import re

    import spmdsim

    root = pathlib.Path(spmdsim.__file__).parent
    recorders, readers = [], []
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(root).as_posix()
        if re.search(r"\brecord\(", text) and "from .trace import" in text and name != "runtime/trace.py":
            recorders.append(name)
        if name != "runtime/debug.py" and re.search(r"\bdebug\._[A-Za-z]|_State\b", text):
            readers.append(name)
    assert recorders == ["runtime/door.py"]
    assert readers == []


def test_a_timed_out_python_program_is_pointed_at_mpirun_for_its_point_to_point_waits():
    """The watchdog names ranks waiting in collectives, not in Send/Recv: a Python program's job that timed out
    is also pointed at `spmdsim mpirun`, which names each waiting rank's call and line on simulated ranks."""
    collective = "; ranks waiting in a collective another rank skipped? --watchdog SECONDS names them"
    mpirun = ("; in Send/Recv? `spmdsim mpirun -n 2 'my prog.py' --steps 3` runs it on simulated ranks and names "
              "each waiting rank's call and line")
    cmd = ["mpiexec", "-n", "2", sys.executable, "my prog.py", "--steps", "3"]
    assert launch._hint(cmd, {}) == collective + mpirun
    assert launch._hint(cmd, {"SPMDSIM_WATCHDOG": "30"}) == mpirun
    assert launch._hint(["mpiexec", "-n", "2", sys.executable, "-c", "pass"], {}) == collective
    assert launch._hint(["mpiexec", "-n", "2", "/bin/prog"], {"SPMDSIM_WATCHDOG": "30"}) == ""
